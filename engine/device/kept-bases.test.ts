// A released view's frozen base, kept for its next load: given back only to the same view, layout
// and rank, under the same digest of its owner's base, and only while its bytes hash as they did.
import { beforeAll, describe, expect, it } from 'vitest';
import { MemoryBus } from '../../mesh/wire/bus/memory-bus.ts';
import { subjects } from '../../mesh/wire/bus/subjects.ts';
import { Comm, type Layout } from '../../mesh/parallel/index.ts';
import { GptRank, initBackend, type GptSpec } from '../model/index.ts';
import { KeptBases, frozenNames, frozenTensors } from './kept-bases.ts';

const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 2, width: 16, heads: 4, lora: { rank: 2, alpha: 4, targets: ['c_attn', 'c_proj', 'c_fc'] } };
const one: Layout = { devices: [0], dp: 1, tp: 1, pp: 1 };
const comm = new Comm(new MemoryBus(), subjects('kept'), 0);
const filled = () => new GptRank(spec, one, 0, 7, undefined, comm);
const empty = () => new GptRank(spec, one, 0, undefined, undefined, comm);

describe('kept bases', () => {
  beforeAll(() => initBackend('wasm'));

  it('the frozen base is every parameter but the adapters (a policy keeps its head frozen)', () => {
    const names = frozenNames(filled());
    expect(names).toContain('h0.attn.wq');
    expect(names).toContain('head.w');
    expect(names.some((n) => n.endsWith('.lora_a') || n.endsWith('.lora_b'))).toBe(false);
  });

  it('gives the base back to the same view under the same owner digest, bit for bit, once', () => {
    const kept = new KeptBases();
    const view = filled();
    kept.keep('actor@generate', view, one, 0, 'blake3:owner');
    expect(kept.bytes).toBeGreaterThan(0);
    const next = empty();
    expect(kept.give('actor@generate', next, one, 0, 'blake3:owner')).toBe(true);
    expect(frozenTensors(next).map((t) => Array.from(t.data))).toEqual(frozenTensors(view).map((t) => Array.from(t.data)));
    // Adapters are not part of it: they come by the reallocation.
    expect(Array.from(next.weights.exportTensor('h0.attn.wqkv.lora_a')).every((x) => x === 0)).toBe(true);
    expect(kept.give('actor@generate', empty(), one, 0, 'blake3:owner')).toBe(false);
  });

  it('refuses another owner digest, layout, rank or view, and bytes that changed while kept', () => {
    const kept = new KeptBases();
    const view = filled();
    const tries: Array<[string, Layout, number, string]> = [
      ['actor@generate', one, 0, 'blake3:other'],
      ['actor@generate', { devices: [0, 1], dp: 2, tp: 1, pp: 1 }, 0, 'blake3:owner'],
      ['actor@train', one, 0, 'blake3:owner'],
    ];
    for (const [model, layout, rank, tag] of tries) {
      kept.keep('actor@generate', view, one, 0, 'blake3:owner');
      expect(kept.give(model, empty(), layout, rank, tag), `${model} ${tag}`).toBe(false);
    }
    kept.keep('actor@generate', view, one, 0, 'blake3:owner');
    // A bit flipped in memory while kept: the digest taken when it was kept no longer matches.
    const held = (kept as unknown as { kept: Map<string, { tensors: Array<{ data: Float32Array }> }> }).kept.get('actor@generate')!;
    held.tensors[3]!.data[0]! += 1;
    expect(kept.give('actor@generate', empty(), one, 0, 'blake3:owner')).toBe(false);
  });
});
