// Calls a device runs beside the one it is running. Under asynchrony the rollout devices take the
// next policy version while they go on generating with the one they hold (issue: weights to the
// rollout devices as versions): the next version's view is loaded, filled by a reallocation and,
// later, the old one released, each a call the supervisor marks `beside`. A device runs one such
// call next to its running call when neither changes a model the other reads or changes; any
// other overlap is refused (`busy`), as a second call always was.
import type { Call } from '../../mesh/wire/index.ts';

/**
 * The calls that may run beside another: they only make, fill or free a shard, read one's digest
 * (the owner's base, read before a view of a model with adapters is filled), or hand a filled one
 * to the generation running beside (`switch`: in-flight weight updates).
 */
export const BESIDE_FNS = ['load', 'realloc', 'release', 'manifest', 'switch'] as const;

/** The models a call reads and the ones it changes, on this device. */
export function touches(call: Call): { reads: string[]; writes: string[] } {
  const { body, model } = call;
  switch (body.fn) {
    case 'shutdown':
    case 'stats':
    case 'probe':
      return { reads: [], writes: [] };
    case 'switch':
      // Hands the model to a generation that reads it from then on; changes nothing.
      return { reads: [model], writes: [] };
    case 'realloc': {
      const gives = body.sends.length > 0 || body.locals.length > 0;
      const takes = body.recvs.length > 0 || body.locals.length > 0;
      return { reads: gives ? [body.source] : [], writes: takes ? [model] : [] };
    }
    case 'load':
    case 'release':
    case 'train':
    case 'sft':
    case 'preference':
    case 'restore':
    case 'reload':
      return { reads: [], writes: [model] };
    case 'reset':
      // A reset preempts everything: it never runs beside anything.
      return { reads: [], writes: ['*'] };
    default:
      return { reads: [model], writes: [] };
  }
}

/** Every model a call reads or changes on this device, once each. */
export function modelsOf(call: Call): string[] {
  const { reads, writes } = touches(call);
  return [...new Set([...reads, ...writes])].filter((m) => m !== '*');
}

/**
 * Why `next` cannot run beside `running` (one of them changes a model the other reads or
 * changes, or `next` is not a call that may run beside another), or undefined when it can.
 */
export function besideProblem(running: Call, next: Call): string | undefined {
  const side = next.beside ? next : running.beside ? running : undefined;
  if (!side) return `'${next.body.fn}' of '${next.model}' is not marked to run beside another call`;
  if (!(BESIDE_FNS as readonly string[]).includes(side.body.fn)) {
    return `'${side.body.fn}' cannot run beside another call (only ${BESIDE_FNS.join(', ')} can)`;
  }
  const a = touches(running);
  const b = touches(next);
  const clash = (w: string[], other: { reads: string[]; writes: string[] }) => w.find((m) => m === '*' || other.reads.includes(m) || other.writes.includes(m));
  const model = clash(b.writes, a) ?? clash(a.writes, b);
  if (model !== undefined) return `'${next.body.fn}' of '${next.model}' and the running '${running.body.fn}' of '${running.model}' both touch '${model}', and one changes it`;
  return undefined;
}
