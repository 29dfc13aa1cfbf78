// A graph's train calls and their losses: each names a registered loss (a built-in, or one its
// algorithm's file exports), whose head, ports, statistics and parameters the call must agree
// with. Checked with the rest of the graph, before any work; the parameters are then written back
// with the loss's defaults filled in, and a user's loss gets its module (path and SHA-256).
import type { LossSpec } from '../../mesh/wire/index.ts';
import { lossOf, lossParams, lossSource, portablePath, type Loss, type LossParams } from '../model/index.ts';
import type { CallDecl, Graph, ModelDecl } from './graph.ts';

/** The ports a train call writes besides its loss's statistics. */
export const TRAIN_WRITES = ['loss', 'grad_norm'] as const;

/** Why a train call cannot run its loss, one line each (none: it can). */
export function lossProblems(c: Extract<CallDecl, { fn: 'train' }>, model: ModelDecl): string[] {
  let loss: Loss;
  try {
    loss = lossOf(c.loss?.name);
  } catch (e) {
    return [`call '${c.name}': ${(e as Error).message}`];
  }
  const problems: string[] = [];
  const where = `call '${c.name}', loss '${loss.name}'`;
  if (loss.head !== model.head) problems.push(`${where}: it reads a ${loss.head} head; '${model.name}' has a ${model.head} head`);
  let params: LossParams | undefined;
  try {
    params = lossParams(loss, c.loss.params);
  } catch (e) {
    problems.push(`${where}: ${(e as Error).message.replace(/^the loss '[^']*': /, 'params: ')}`);
  }
  if (params) {
    const ports = loss.ports(params);
    const missing = ports.filter((p) => !(p in c.reads));
    if (missing.length) problems.push(`${where}: it reads port(s) ${missing.join(', ')}, which the call does not bind (its reads: ${Object.keys(c.reads).join(', ')})`);
  }
  const writable = [...TRAIN_WRITES, ...loss.stats];
  for (const p of Object.keys(c.writes)) if (!writable.includes(p)) problems.push(`${where}: the call writes port '${p}'; it has ${writable.join(', ')}`);
  return problems;
}

/** The train call's loss as it travels: parameters with their defaults, and a user's loss's module. */
export function resolvedLoss(spec: LossSpec): LossSpec {
  const loss = lossOf(spec.name);
  const source = lossSource(loss.name);
  return { name: loss.name, params: lossParams(loss, spec.params), ...(source ? { module: { file: portablePath(source.file), sha256: source.sha256 } } : {}) };
}

/** A checked graph with every train call's loss resolved (resolvedLoss). */
export function withResolvedLosses(g: Graph): Graph {
  return { ...g, calls: g.calls.map((c) => (c.fn === 'train' ? { ...c, loss: resolvedLoss(c.loss) } : c)) };
}
