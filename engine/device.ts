// A device: what one worker process hosts. It holds the shards of the models that the plan puts
// on it and answers calls about them. The worker machine (actors/worker.machine.ts) decides when
// a call may run; this module decides whether the device's contents allow it and runs it.
import { manifestOf, modelDigest, type NamedTensor } from '../mesh/transfer.ts';
import type { Call, CallBody, CallOf, ErrorCode, ModelSpec, Layout, Role, ResultOf, TensorManifest, CallFn } from '../mesh/protocol.ts';
import { GptShard } from './shard.ts';
import { makeTask, TASKS, type Task, type TaskName } from './task.ts';

/** How parameter bytes leave and reach this device: over NATS in a worker, in memory in a test. */
export interface ParamLink {
  send(transfer: string, tensors: readonly NamedTensor[], chunkBytes: number): Promise<{ bytes: number; chunks: number }>;
  receive(transfer: string, manifest: readonly TensorManifest[]): Promise<{ tensors: NamedTensor[]; bytes: number; chunks: number }>;
}

export class CallRejected extends Error {
  override name = 'CallRejected';
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** A rule reward: a model with no parameters whose inference scores whole sequences. */
class RuleShard {
  readonly task: Task;
  constructor(spec: Extract<ModelSpec, { kind: 'rule' }>) {
    if (!(TASKS as readonly string[]).includes(spec.rule)) {
      throw new CallRejected('unsupported', `unknown reward rule '${spec.rule}'; expected one of ${TASKS.join(', ')}`);
    }
    this.task = makeTask(spec.rule as TaskName, spec.digits, spec.base);
  }
  scores(tokens: Int32Array, batch: number, promptLen: number): Float32Array {
    const width = tokens.length / batch;
    const out = new Float32Array(batch);
    for (let b = 0; b < batch; b++) {
      const row = tokens.subarray(b * width, (b + 1) * width);
      out[b] = this.task.score(row.subarray(0, promptLen), row.subarray(promptLen));
    }
    return out;
  }
}

interface Hosted {
  role: Role;
  layout: Layout;
  rank: number;
  shard: GptShard | RuleShard;
}

type Body = Record<string, unknown>;

export class Device {
  private readonly hosted = new Map<string, Hosted>();

  constructor(
    readonly index: number,
    private readonly link: ParamLink,
  ) {}

  models(): string[] {
    return [...this.hosted.keys()];
  }

  /**
   * Whether this device can take `call` now, decided before anything runs, so that a call it
   * cannot do is refused whole. Returns the refusal, or undefined.
   */
  check(call: Call): CallRejected | undefined {
    const { body, model } = call;
    if (body.fn === 'load' || body.fn === 'shutdown') return undefined;
    const h = this.hosted.get(model);
    if (!h) {
      const held = this.models();
      return new CallRejected('not_loaded', `device ${this.index} holds no shard of '${model}' (it holds ${held.length ? held.join(', ') : 'none'}); '${body.fn}' needs one`);
    }
    const isRule = h.shard instanceof RuleShard;
    const kind = isRule ? 'rule' : (h.shard as GptShard).spec.kind;
    const allowed: Record<string, readonly CallFn[]> = {
      policy: ['sft', 'generate', 'inference', 'train', 'send_params', 'recv_params', 'copy_params', 'manifest', 'release'],
      value: ['inference', 'train', 'send_params', 'recv_params', 'copy_params', 'manifest', 'release'],
      rule: ['inference', 'manifest', 'release'],
    };
    if (!allowed[kind]!.includes(body.fn)) {
      return new CallRejected('unsupported', `'${body.fn}' is not a call of a ${kind} model ('${model}' on device ${this.index})`);
    }
    if (body.fn === 'copy_params' && !(this.hosted.get(body.source)?.shard instanceof GptShard)) {
      return new CallRejected('not_loaded', `device ${this.index} holds no parameters of '${body.source}' to copy into '${model}'`);
    }
    if ((body.fn === 'train' || body.fn === 'sft') && !(h.shard as GptShard).trainable) {
      return new CallRejected('invalid_state', `'${model}' on device ${this.index} is not on its training layout (no optimizer); '${body.fn}' is refused`);
    }
    return undefined;
  }

  async run(call: Call): Promise<Body> {
    const refused = this.check(call);
    if (refused) throw refused;
    const body = call.body;
    switch (body.fn) {
      case 'load':
        return this.load(call.model, body);
      case 'shutdown':
        return {};
      case 'release': {
        const h = this.hosted.get(call.model)!;
        if (h.shard instanceof GptShard) h.shard.dispose();
        this.hosted.delete(call.model);
        return {};
      }
      default:
        return this.runOnShard(this.hosted.get(call.model)!, body);
    }
  }

  private load(model: string, body: CallOf<'load'>): ResultOf<'load'> {
    const { layout, rank, spec } = body;
    const size = layout.dp * layout.tp * layout.pp;
    if (size !== layout.devices.length) {
      throw new CallRejected('invalid_state', `layout dp×tp×pp = ${size} does not match its ${layout.devices.length} device(s)`);
    }
    if (size !== 1) {
      throw new CallRejected('unsupported', `this worker runs each model on a one-device mesh (dp=tp=pp=1); got dp=${layout.dp} tp=${layout.tp} pp=${layout.pp} over ${size} devices`);
    }
    if (layout.devices[rank] !== this.index) {
      throw new CallRejected('invalid_state', `rank ${rank} of layout [${layout.devices}] is device ${layout.devices[rank]}, not this device ${this.index}`);
    }
    const previous = this.hosted.get(model);
    const shard = spec.kind === 'rule' ? new RuleShard(spec) : new GptShard(spec, body.seed, body.optim);
    if (previous?.shard instanceof GptShard) previous.shard.dispose();
    this.hosted.set(model, { role: body.role, layout, rank, shard });
    const tensors = shard instanceof GptShard ? shard.exportTensors() : [];
    return { parameters: tensors.reduce((n, t) => n + t.data.length, 0), digest: modelDigest(tensors) };
  }

  private async runOnShard(h: Hosted, body: CallBody): Promise<Body> {
    const s = h.shard;
    if (s instanceof RuleShard) {
      if (body.fn === 'inference') return { scores: s.scores(body.tokens, body.batch, body.promptLen) };
      return { manifest: [], digest: modelDigest([]) };
    }
    switch (body.fn) {
      case 'sft':
        return s.sft(body.tokens, body.batch, body.promptLen, body.steps, body.minibatch, body.lr, body.seed);
      case 'generate':
        return s.generate(body.prompts, body.batch, body.promptLen, body.responseLen, body.seeds, body.temperature);
      case 'inference':
        return s.spec.kind === 'policy'
          ? { logprobs: s.logprobs(body.tokens, body.batch, body.promptLen) }
          : { values: s.values(body.tokens, body.batch, body.promptLen) };
      case 'train': {
        const st = await s.train(body.tokens, body.batch, body.promptLen, body.responseLen, body.old, body.target, body.hyper, body.seed);
        return { loss: st.loss, clipfrac: st.clipfrac, grad_norm: st.gradNorm };
      }
      case 'manifest': {
        const tensors = s.exportTensors();
        return { manifest: manifestOf(tensors), digest: modelDigest(tensors) };
      }
      case 'send_params': {
        const all = s.exportTensors();
        const wanted = body.names ? new Set(body.names) : undefined;
        if (wanted) {
          const missing = [...wanted].filter((n) => !all.some((t) => t.name === n));
          if (missing.length) throw new CallRejected('invalid_state', `no parameter(s) ${missing.join(', ')} to send`);
        }
        return this.link.send(body.transfer, wanted ? all.filter((t) => wanted.has(t.name)) : all, body.chunkBytes);
      }
      case 'recv_params': {
        const got = await this.link.receive(body.transfer, body.manifest);
        // Only now, with every tensor verified, does the shard change.
        s.importTensors(got.tensors);
        return { bytes: got.bytes, chunks: got.chunks, digest: modelDigest(s.exportTensors()) };
      }
      case 'copy_params': {
        const source = this.hosted.get(body.source)!.shard as GptShard;
        const wanted = new Set(body.names);
        const tensors = source.exportTensors().filter((t) => wanted.has(t.name));
        s.importTensors(tensors);
        return { bytes: tensors.reduce((n, t) => n + t.data.byteLength, 0), chunks: 0, digest: modelDigest(s.exportTensors()) };
      }
      default:
        throw new CallRejected('unsupported', `'${body.fn}' cannot run on a shard`);
    }
  }
}
