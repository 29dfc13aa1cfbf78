import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it, expect, beforeAll } from 'vitest';
import * as tf from '@tensorflow/tfjs';
import { initBackend } from '../model/backend/backend.ts';
import { fileDigest } from '../model/losses/modules.ts';
import { CallRejected, Device } from './device.ts';
import { MemoryBus } from '../../mesh/wire/bus/memory-bus.ts';
import { encode } from '../../mesh/wire/messages/codec.ts';
import { subjects } from '../../mesh/wire/bus/subjects.ts';
import { initialWeights, parameterShapes, type GptSpec } from '../model/gpt.ts';
import { makeTask } from './task.ts';
import { manifestOf, modelDigest } from '../../mesh/wire/transfer/transfer.ts';
import { PROTOCOL_VERSION, type Call, type CallBody, type CallOf, type ErrorCode, type Optim } from '../../mesh/wire/messages/protocol.ts';

const policy: GptSpec = { kind: 'policy', vocab: 5, context: 6, layers: 1, width: 8, heads: 2 };
const value: GptSpec = { ...policy, kind: 'value' };
const optim: Optim = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, clipNorm: 1 };
const one = { devices: [0], dp: 1, tp: 1, pp: 1 };

/** Devices of these tests share an in-memory bus. */
const noLink = [new MemoryBus(), subjects('unit')] as const;

/** Plays the supervisor's part of a reallocation: once the device is ready, say go. */
function goWhenReady(id: string) {
  const [bus, subj] = noLink;
  const sub = bus.subscribe(subj.ready(id), {
    callback: () => {
      sub.unsubscribe();
      bus.publish(subj.go(id), encode({ type: 'go', v: PROTOCOL_VERSION, realloc: id }));
    },
  });
}

let seq = 0;
const call = (model: string, body: CallBody): Call => ({ type: 'call', v: PROTOCOL_VERSION, id: `c${seq++}`, model, iteration: 0, body });
const load = (spec: CallOf<'load'>['spec'], extra: Partial<CallOf<'load'>> = {}): CallOf<'load'> => ({
  fn: 'load',
  role: 'actor',
  spec,
  layout: one,
  rank: 0,
  seed: 1,
  ...extra,
});
const batch = { tokens: new Int32Array([0, 1, 4, 0, 1, 2, 3, 4, 2, 3]), batch: 2, promptLen: 3, responseLen: 2 };
/** A train call's fields besides the batch and its data: one epoch, one mini-batch, the clipped policy loss. */
const trainArgs = { seed: 0, epochs: 1, minibatches: 1, loss: { name: 'clip_policy', params: { clip: 0.2 } } };

async function rejected(p: Promise<unknown>): Promise<CallRejected> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(CallRejected);
    return e as CallRejected;
  }
  throw new Error('expected the call to be rejected');
}

function expectRefusal(device: Device, c: Call, code: ErrorCode, message: RegExp | string): void {
  const r = device.check(c);
  expect(r).toBeInstanceOf(CallRejected);
  expect(r!.code).toBe(code);
  expect(r!.name).toBe('CallRejected');
  if (typeof message === 'string') expect(r!.message).toBe(message);
  else expect(r!.message).toMatch(message);
}

beforeAll(async () => {
  await initBackend('cpu');
});

describe('Device.check refusals', () => {
  it('not_loaded for a model the device does not hold', async () => {
    const d = new Device(3, ...noLink);
    expectRefusal(d, call('actor', { fn: 'manifest' }), 'not_loaded', "device 3 holds no shard of 'actor' (it holds none); 'manifest' needs one");
    await d.run(call('critic', load(value, { layout: { ...one, devices: [3] } })));
    expectRefusal(d, call('actor', { fn: 'inference', ...batch }), 'not_loaded', "device 3 holds no shard of 'actor' (it holds critic); 'inference' needs one");
    // and run refuses the same way, before doing anything
    expect((await rejected(d.run(call('actor', { fn: 'manifest' })))).code).toBe('not_loaded');
  });

  it('load and shutdown are never refused by check', () => {
    const d = new Device(0, ...noLink);
    expect(d.check(call('x', load(policy)))).toBeUndefined();
    expect(d.check(call('x', { fn: 'shutdown' }))).toBeUndefined();
  });

  it('unsupported for generate on a value model', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('critic', load(value, { role: 'critic' })));
    const gen = call('critic', { fn: 'generate', prompts: new Int32Array(3), batch: 1, promptLen: 3, responseLen: 1, seeds: new Uint32Array(1), temperature: 1 });
    expectRefusal(d, gen, 'unsupported', "'generate' is not a call of a value model ('critic' on device 0)");
    expectRefusal(d, call('critic', { fn: 'sft', ...batch, steps: 1, minibatch: 1, lr: 1e-3, seed: 0 }), 'unsupported', /'sft' is not a call of a value model/);
  });

  it('unsupported for train or generate on a rule model', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('reward', load({ kind: 'rule', rule: 'copy', digits: 2, base: 4 }, { role: 'reward' })));
    expectRefusal(
      d,
      call('reward', { fn: 'train', ...batch, ...trainArgs, data: { old: new Float32Array(4), advantages: new Float32Array(4) } }),
      'unsupported',
      /'train' is not a call of a rule model/,
    );
  });

  it('invalid_state for train and sft on a model loaded without optim', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy)));
    const train = call('actor', { fn: 'train', ...batch, ...trainArgs, data: { old: new Float32Array(4), advantages: new Float32Array(4) } });
    expectRefusal(d, train, 'invalid_state', "'actor' on device 0 is not on its training layout (no optimizer); 'train' is refused");
    expectRefusal(d, call('actor', { fn: 'sft', ...batch, steps: 1, minibatch: 1, lr: 1e-3, seed: 0 }), 'invalid_state', /'sft' is refused/);
    // with an optimizer, the same call is allowed
    await d.run(call('actor', load(policy, { optim })));
    expect(d.check(train)).toBeUndefined();
  });

  it('too_large for a generation whose KV cache would not fit, naming the sizes, before anything is allocated', async () => {
    // 64 KiB beside the shard and whatever this process already holds in tensors (other files' work).
    const small = new Device(0, noLink[0], noLink[1], { memoryBytes: tf.memory().numBytes + (64 << 10) + 4096 });
    await small.run(call('actor', load(policy)));
    const gen = (batch: number): Call => call('actor', { fn: 'generate', prompts: new Int32Array(batch * 3), batch, promptLen: 3, responseLen: 3, seeds: new Uint32Array(batch), temperature: 1 });
    // 2 rows × 2 heads × 4 per head × 6 positions × 1 layer × keys and values × 4 bytes = 768 bytes: fits
    expect(small.check(gen(2))).toBeUndefined();
    // 2,000 rows: 768,000 bytes do not fit in 64 KiB
    expectRefusal(
      small,
      gen(2000),
      'too_large',
      /^'generate' of 'actor' on device 0: 2000 sequences of 3 \+ 3 tokens: its KV cache needs 750\.0 KiB, and the device has [\d.]+ (B|KiB) free \([\d.]+ (KiB|MiB) held of [\d.]+ (KiB|MiB), the memory given to the call\); generate fewer sequences at once or shorter responses$/,
    );
    expect((await rejected(small.run(gen(2000)))).code).toBe('too_large');
  });

  it('malformed for an end token outside the vocabulary, or a train mask that is not 0 and 1', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy, { optim })));
    const gen = call('actor', { fn: 'generate', prompts: new Int32Array(3), batch: 1, promptLen: 3, responseLen: 2, seeds: new Uint32Array(1), temperature: 1, eos: 5 });
    expectRefusal(d, gen, 'malformed', "'generate' of 'actor': eos[0] = 5 is not a token of a vocabulary of 5");
    const data = { old: new Float32Array(4), advantages: new Float32Array(4) };
    expectRefusal(
      d,
      call('actor', { fn: 'train', ...batch, ...trainArgs, data: { ...data, mask: Float32Array.of(1, 0.5, 1, 1) } }),
      'malformed',
      "'train' of 'actor': data.mask[1] = 0.5; a response mask holds 1 (a token the response has) or 0 (padding)",
    );
    expectRefusal(d, call('actor', { fn: 'train', ...batch, ...trainArgs, data: { ...data, mask: new Float32Array(3) } }), 'malformed', "'train' of 'actor': data.mask has 3 values, expected 4");
  });

  it('not_loaded for a reallocation from a model the device does not hold', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('reference', load(policy, { role: 'reference' })));
    const wte = { name: 'wte', shape: [5, 8], axis: null, start: 0, end: 5 };
    expectRefusal(
      d,
      call('reference', { fn: 'realloc', realloc: 'r', source: 'actor', sends: [], recvs: [], locals: [wte], chunkBytes: 1 << 20 }),
      'not_loaded',
      "device 0 holds no shard of 'actor' (it holds reference); 'realloc' needs one",
    );
  });
});

describe('Device.run load refusals', () => {
  it('unsupported for a layout that does not fit the model (check lets it through; load refuses it whole)', async () => {
    const d = new Device(0, ...noLink);
    const c = call('actor', load(policy, { layout: { devices: [0, 1, 2, 3], dp: 1, tp: 4, pp: 1 } }));
    expect(d.check(c)).toBeUndefined();
    const e = await rejected(d.run(c));
    expect(e.code).toBe('unsupported');
    expect(e.message).toBe('layout dp=1 tp=4 pp=1 does not fit the model: tp=4 does not divide the 2 attention heads');
    expect(d.models()).toEqual([]);
  });

  it('invalid_state when dp×tp×pp does not match the devices', async () => {
    const e = await rejected(new Device(0, ...noLink).run(call('actor', load(policy, { layout: { devices: [0], dp: 1, tp: 2, pp: 1 } }))));
    expect(e.code).toBe('invalid_state');
    expect(e.message).toBe('layout dp×tp×pp = 2 does not match its 1 device(s)');
  });

  it('invalid_state when the rank is another device', async () => {
    const e = await rejected(new Device(1, ...noLink).run(call('actor', load(policy))));
    expect(e.code).toBe('invalid_state');
    expect(e.message).toBe('rank 0 of layout [0] is device 0, not this device 1');
  });

  it('unsupported for an unknown reward rule', async () => {
    const e = await rejected(new Device(0, ...noLink).run(call('reward', load({ kind: 'rule', rule: 'shuffle', digits: 2, base: 4 }))));
    expect(e.code).toBe('unsupported');
    expect(e.message).toMatch(/unknown reward rule 'shuffle'; expected one of sort, reverse, copy/);
  });
});

describe('Device.run', () => {
  it('load then manifest: the same digest, the canonical tensors, the initial weights', async () => {
    const d = new Device(0, ...noLink);
    const loaded = await d.run(call('actor', load(policy, { seed: 5 })));
    const expected = initialWeights(policy, 5);
    expect(loaded).toEqual({ parameters: 1021, digest: modelDigest(expected) });
    const m = (await d.run(call('actor', { fn: 'manifest' }))) as { manifest: ReturnType<typeof manifestOf>; digest: string };
    expect(m.digest).toBe(loaded.digest);
    expect(m.manifest).toEqual(manifestOf(expected));
    expect(m.manifest.map((t) => [t.name, t.shape])).toEqual(parameterShapes(policy));
    expect(d.models()).toEqual(['actor']);
  });

  it('a second load of the same model replaces it', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy, { seed: 1 })));
    const again = await d.run(call('actor', load(policy, { seed: 2 })));
    expect(again.digest).toBe(modelDigest(initialWeights(policy, 2)));
    expect(((await d.run(call('actor', { fn: 'manifest' }))) as { digest: string }).digest).toBe(again.digest);
    expect(d.models()).toEqual(['actor']);
  });

  it('inference answers log-probs for a policy, values for a value model, scores for a rule', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy)));
    await d.run(call('critic', load(value, { role: 'critic' })));
    await d.run(call('reward', load({ kind: 'rule', rule: 'copy', digits: 2, base: 4 }, { role: 'reward' })));
    const lp = (await d.run(call('actor', { fn: 'inference', ...batch }))) as { logprobs: Float32Array };
    expect(lp.logprobs).toBeInstanceOf(Float32Array);
    expect(lp.logprobs.length).toBe(4);
    const v = (await d.run(call('critic', { fn: 'inference', ...batch }))) as { values: Float32Array };
    expect(v.values.length).toBe(4);
    // rows [0, 1, 4 | 0, 1] and [2, 3, 4 | 2, 3]: copy wants the prompt digits back → both score 1
    const s = (await d.run(call('reward', { fn: 'inference', ...batch }))) as { scores: Float32Array };
    expect(Array.from(s.scores)).toEqual([1, 1]);
    const half = { ...batch, tokens: new Int32Array([0, 1, 4, 0, 0, 2, 3, 4, 1, 1]) };
    expect(Array.from(((await d.run(call('reward', { fn: 'inference', ...half }))) as { scores: Float32Array }).scores)).toEqual([0.5, 0]);
    expect(makeTask('copy', 2, 4).score([0, 1, 4], [0, 0])).toBe(0.5);
  });

  it('a rule model has an empty manifest', async () => {
    const d = new Device(0, ...noLink);
    const loaded = await d.run(call('reward', load({ kind: 'rule', rule: 'sort', digits: 2, base: 4 })));
    expect(loaded).toEqual({ parameters: 0, digest: modelDigest([]) });
    expect(await d.run(call('reward', { fn: 'manifest' }))).toEqual({ manifest: [], digest: modelDigest([]) });
  });

  it('a reallocation between two models on this device copies locally, nothing on the bus', async () => {
    const d = new Device(0, ...noLink);
    const actor = await d.run(call('actor', load(policy, { seed: 1 })));
    await d.run(call('reference', load(policy, { seed: 2, role: 'reference' })));
    const locals = parameterShapes(policy).map(([name, shape]) => ({ name, shape, axis: null, start: 0, end: shape[0]! }));
    goWhenReady('r1');
    const out = await d.run(call('reference', { fn: 'realloc', realloc: 'r1', source: 'actor', sends: [], recvs: [], locals, chunkBytes: 1 << 20 }));
    expect(out).toMatchObject({ sent_bytes: 0, received_bytes: 0, copied_bytes: 1021 * 4, chunks: 0 });
    expect((await d.run(call('reference', { fn: 'manifest' }))).digest).toBe(actor.digest);
  });

  it('a reallocation that names a parameter the source does not have fails and changes nothing', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy, { seed: 1 })));
    const before = await d.run(call('reference', load(policy, { seed: 2, role: 'reference' })));
    const locals = [{ name: 'nope', shape: [2], axis: null, start: 0, end: 2 }];
    goWhenReady('r2');
    const e = await rejected(d.run(call('reference', { fn: 'realloc', realloc: 'r2', source: 'actor', sends: [], recvs: [], locals, chunkBytes: 1 << 20 })));
    expect(e.code).toBe('invalid_state');
    expect(e.message).toBe("'actor' on device 0 holds no 'nope' to copy");
    expect((await d.run(call('reference', { fn: 'manifest' }))).digest).toBe(before.digest);
  });

  it('release drops the model; later calls on it are not_loaded', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy)));
    expect(await d.run(call('actor', { fn: 'release' }))).toEqual({});
    expect(d.models()).toEqual([]);
    expectRefusal(d, call('actor', { fn: 'manifest' }), 'not_loaded', /holds no shard of 'actor'/);
  });

  it('shutdown answers an empty body', async () => {
    expect(await new Device(0, ...noLink).run(call('any', { fn: 'shutdown' }))).toEqual({});
  });
});

describe('Device.check refuses arrays that do not fit, before anything runs', () => {
  const tokens = (n: number, v = 1) => new Int32Array(n).fill(v);

  it('tokens of the wrong length, a data port of the wrong length, tokens outside the vocabulary, sequences past the context', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy, { optim })));
    const batch = { batch: 2, promptLen: 2, responseLen: 2 };
    expectRefusal(d, call('actor', { fn: 'inference', tokens: tokens(7), ...batch }), 'malformed', "'inference' of 'actor': tokens has 7 values, expected 8");
    const train = { fn: 'train', tokens: tokens(8), ...batch, ...trainArgs, seed: 1 } as const;
    expectRefusal(d, call('actor', { ...train, data: { old: new Float32Array(3), advantages: new Float32Array(4) } }), 'malformed', "'train' of 'actor': data.old has 3 values, expected 4");
    expectRefusal(d, call('actor', { ...train, data: { old: new Float32Array(4), advantages: new Float32Array(5) } }), 'malformed', "'train' of 'actor': data.advantages has 5 values, expected 4");
    expectRefusal(d, call('actor', { fn: 'inference', tokens: tokens(8, 5), ...batch }), 'malformed', "'inference' of 'actor': tokens[0] = 5 is not a token of a vocabulary of 5");
    expectRefusal(
      d,
      call('actor', { fn: 'inference', tokens: tokens(8), batch: 1, promptLen: 4, responseLen: 4 }),
      'malformed',
      "'inference' of 'actor': sequences of 8 tokens exceed the model's context of 6",
    );
    expectRefusal(
      d,
      call('actor', { fn: 'generate', prompts: tokens(4), batch: 2, promptLen: 2, responseLen: 2, seeds: new Uint32Array(1), temperature: 1 }),
      'malformed',
      "'generate' of 'actor': seeds has 1 values, expected 2",
    );
  });

  it("a load whose loss module is not the supervisor's copy is refused (code loss), naming the file and both digests; the right copy loads", async () => {
    const d = new Device(0, ...noLink);
    // A user's module of one loss (the sum of the log-probs), in a folder of its own.
    const file = join(mkdtempSync(join(tmpdir(), 'ferry-device-loss-')), 'own-loss.ts');
    const api = JSON.stringify(fileURLToPath(new URL('../api.ts', import.meta.url)));
    writeFileSync(
      file,
      `import { defineLoss, tf, z } from ${api};\nexport const ownSum = defineLoss({ name: 'own_sum', summary: 'Σ log π', head: 'policy', params: z.strictObject({}), ports: ['old'], compute: ({ pred }) => ({ loss: tf.sum(pred) }) });\n`,
    );
    await expect(d.run(call('actor', { ...load(policy, { optim }), losses: [{ file, sha256: '0'.repeat(64) }] }))).rejects.toMatchObject({
      code: 'loss',
      message: expect.stringMatching(/the loss module .*own-loss\.ts: this worker's copy \(.*own-loss\.ts\) has SHA-256 [0-9a-f]{64}, the supervisor planned with 0{64}/),
    });
    const sha256 = fileDigest(file);
    await d.run(call('actor', { ...load(policy, { optim }), losses: [{ file, sha256 }] }));
    const train = { fn: 'train', tokens: tokens(8), batch: 2, promptLen: 2, responseLen: 2, ...trainArgs, data: { old: new Float32Array(4) } } as const;
    expect(d.check(call('actor', { ...train, loss: { name: 'own_sum', params: {}, module: { file, sha256 } } }))).toBeUndefined();
    // The same name, planned from another copy of the file: refused.
    expectRefusal(
      d,
      call('actor', { ...train, loss: { name: 'own_sum', params: {}, module: { file, sha256: 'f'.repeat(64) } } }),
      'loss',
      /the loss 'own_sum' of .*own-loss\.ts \(SHA-256 f{64}\) is not loaded on this device: it has the loss from .*own-loss\.ts \(SHA-256 [0-9a-f]{64}\)/,
    );
  });

  it('a train call whose data lacks a port its loss reads, names an unknown loss, or splits a pair', async () => {
    const d = new Device(0, ...noLink);
    await d.run(call('actor', load(policy, { optim })));
    const batch = { batch: 2, promptLen: 2, responseLen: 2 };
    const train = { fn: 'train', tokens: tokens(8), ...batch, ...trainArgs } as const;
    expectRefusal(d, call('actor', { ...train, data: { old: new Float32Array(4) } }), 'malformed', "'train' of 'actor': the loss 'clip_policy' reads 'advantages'; the call's data has old");
    expectRefusal(d, call('actor', { ...train, data: {} }), 'malformed', "'train' of 'actor': the loss 'clip_policy' reads 'old'; the call's data has nothing");
    // kl_coef > 0 adds the reference log-probs to what clip_policy reads
    const kl = { ...train, loss: { name: 'clip_policy', params: { clip: 0.2, kl_coef: 0.1 } } };
    expectRefusal(
      d,
      call('actor', { ...kl, data: { old: new Float32Array(4), advantages: new Float32Array(4) } }),
      'malformed',
      "'train' of 'actor': the loss 'clip_policy' reads 'ref'; the call's data has old, advantages",
    );
    // A loss this device does not know is the loss's problem (code `loss`): it would fail the same way after any recovery.
    expectRefusal(
      d,
      call('actor', { ...train, loss: { name: 'nope', params: {} }, data: {} }),
      'loss',
      /^'train' of 'actor' on device 0: unknown loss 'nope'; known: clip_policy, clip_value, pair_sigmoid, gspo, cispo, decoupled/,
    );
    // So is a parameter its schema refuses, and a user's loss from a module this device did not load.
    expectRefusal(d, call('actor', { ...train, loss: { name: 'clip_policy', params: { clip: 'wide' } }, data: {} }), 'loss', /the loss 'clip_policy': clip: /);
    const module = { file: 'elsewhere/mine.ts', sha256: '0'.repeat(64) };
    expectRefusal(
      d,
      call('actor', { ...train, loss: { name: 'clip_policy', params: {}, module }, data: {} }),
      'loss',
      /the loss 'clip_policy' of elsewhere\/mine\.ts \(SHA-256 0{64}\) is not loaded on this device/,
    );
    // dpo takes rows in pairs (chosen, rejected): an odd batch cannot be one
    const odd = { fn: 'train', tokens: tokens(12), batch: 3, promptLen: 2, responseLen: 2, ...trainArgs, loss: { name: 'pair_sigmoid', params: { beta: 0.1 } } } as const;
    expectRefusal(d, call('actor', { ...odd, data: { ref: new Float32Array(6) } }), 'malformed', "'train' of 'actor': the loss 'pair_sigmoid' takes rows in groups of 2; the batch has 3");
    // the well-formed calls pass
    expect(d.check(call('actor', { ...train, data: { old: new Float32Array(4), advantages: new Float32Array(4) } }))).toBeUndefined();
    expect(d.check(call('actor', { ...train, loss: { name: 'pair_sigmoid', params: { beta: 0.1 } }, data: { ref: new Float32Array(4) } }))).toBeUndefined();
  });
});
