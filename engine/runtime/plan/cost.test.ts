// The cost model: parameter counts against published sizes, the coarse model the transfer planner
// sees, per-call times and memory, collectives, strategy checks, and link locality.
import { describe, expect, it } from 'vitest';
import type { Layout, ModelInfo } from '../../../mesh/parallel/layout.ts';
import { planRealloc } from '../../../mesh/parallel/realloc.ts';
import { DEVICES, MODELS, localShape, scaledProfile, type DeviceProfile, type ModelShape } from './catalog.ts';
import { allReduceSeconds, callCost, coarseInfo, continuousSteps, decodeSteps, parameterCounts, reallocSeconds, shapeInfo, strategyProblem, tailScale, type Workload } from './cost.ts';

const A100 = DEVICES['a100-80gb']!;
const L7 = MODELS['llama2-7b']!;
const L13 = MODELS['llama2-13b']!;
const L70 = MODELS['llama2-70b']!;

/** The cluster scenarios' workload: batch 512, prompts and responses of 1024 tokens. */
const BIG: Workload = { batch: 512, promptLen: 1024, responseLen: 1024, epochs: 1, minibatches: 8 };
/** A small one, where memory is not limited by the device (no waves, no micro-batch fitting). */
const SMALL: Workload = { batch: 8, promptLen: 128, responseLen: 128, epochs: 1, minibatches: 1 };

/** dp × tp × pp ranks on consecutive devices from `first`. */
function layout(s: { dp?: number; tp?: number; pp?: number }, first = 0): Layout {
  const dp = s.dp ?? 1;
  const tp = s.tp ?? 1;
  const pp = s.pp ?? 1;
  return { devices: Array.from({ length: dp * tp * pp }, (_, i) => first + i), dp, tp, pp };
}

const elements = (info: ModelInfo) => info.params.reduce((n, p) => n + p.shape.reduce((a, b) => a * b, 1), 0);

describe('parameterCounts', () => {
  it('matches the published LLaMA-2 sizes (7B: 6.74e9, 13B: 13.0e9, 70B: 69e9) within 2%', () => {
    expect(Math.abs(parameterCounts(L7).total / 6.74e9 - 1)).toBeLessThan(0.02);
    expect(Math.abs(parameterCounts(L13).total / 13.0e9 - 1)).toBeLessThan(0.02);
    expect(Math.abs(parameterCounts(L70).total / 69e9 - 1)).toBeLessThan(0.02);
  });

  it('adds up: layers, embedding and head make the total; a value head replaces the vocabulary projection', () => {
    const c = parameterCounts(L7);
    expect(c.total).toBe(c.layer * L7.layers + c.embed + c.head);
    expect(c.embed).toBe(32000 * 4096);
    const v = parameterCounts(L7, true);
    expect(v.layer).toBe(c.layer);
    expect(c.total - v.total).toBe(4096 * 32000 - 4096);
  });

  it('counts grouped-query attention with fewer key/value weights than full attention', () => {
    const full = parameterCounts({ ...L70, kvHeads: L70.heads });
    const gqa = parameterCounts(L70);
    // wk and wv shrink from D×D to D×(D·8/64) each.
    expect(full.layer - gqa.layer).toBe(2 * 8192 * 8192 - 2 * 8192 * 1024);
  });

  it('agrees with the tensors the layout code sees', () => {
    for (const m of [L7, L70, localShape('tiny', 16, 2, 64, 4)]) {
      expect(elements(shapeInfo(m))).toBe(parameterCounts(m).total);
      expect(elements(shapeInfo(m, true))).toBe(parameterCounts(m, true).total);
    }
  });
});

describe('coarseInfo', () => {
  const models: ModelShape[] = [L7, L70, localShape('tiny', 16, 2, 64, 4)];

  it('holds the same elements as shapeInfo, layer by layer', () => {
    for (const m of models) {
      for (const vh of [false, true]) {
        const fine = shapeInfo(m, vh);
        const coarse = coarseInfo(m, vh);
        expect(coarse.layers).toBe(fine.layers);
        expect(elements(coarse)).toBe(elements(fine));
        const perLayer = (info: ModelInfo) => {
          const out = new Map<string, number>();
          for (const p of info.params) out.set(String(p.layer), (out.get(String(p.layer)) ?? 0) + p.shape.reduce((a, b) => a * b, 1));
          return out;
        };
        expect(perLayer(coarse)).toEqual(perLayer(fine));
        expect(coarse.params.length).toBeLessThan(fine.params.length);
      }
    }
  });

  it('moves the same bytes between the same devices as the fine model', () => {
    const pairs: Array<[Layout, Layout]> = [
      [layout({ dp: 8 }), layout({ tp: 8 })],
      [layout({ dp: 2, tp: 2, pp: 2 }), layout({ tp: 4, pp: 2 })],
      [layout({ tp: 8 }), layout({ tp: 2, pp: 4 }, 8)],
      [layout({ dp: 2, tp: 4 }), layout({ dp: 2, tp: 2, pp: 2 })],
      [layout({ tp: 2, pp: 2 }), layout({ dp: 4, tp: 2 })],
    ];
    const nodeOf = (d: number) => Math.floor(d / 8);
    const perDestination = (plan: ReturnType<typeof planRealloc>) => {
      const out = new Map<number, number>();
      for (const p of plan.pieces) {
        const n = p.axis === null ? p.shape.reduce((a, b) => a * b, 1) : (p.shape.reduce((a, b) => a * b, 1) / p.shape[p.axis]!) * (p.end - p.start);
        for (const d of p.dsts) out.set(d, (out.get(d) ?? 0) + n);
      }
      return out;
    };
    for (const m of [L7, L70]) {
      for (const [from, to] of pairs) {
        const fine = planRealloc(shapeInfo(m), from, to, nodeOf);
        const coarse = planRealloc(coarseInfo(m), from, to, nodeOf);
        expect(coarse.receivedBytes).toBe(fine.receivedBytes);
        expect(coarse.minimumBytes).toBe(fine.minimumBytes);
        expect(perDestination(coarse)).toEqual(perDestination(fine));
      }
    }
  });
});

describe('reallocSeconds', () => {
  it('is 0 between identical layouts', () => {
    for (const l of [layout({}), layout({ tp: 8 }), layout({ dp: 2, tp: 2, pp: 2 }), layout({ dp: 2, tp: 8, pp: 2 }, 16)]) {
      expect(reallocSeconds(L7, l, { ...l, devices: [...l.devices] }, A100, 8)).toBe(0);
      expect(reallocSeconds(L7, l, l, A100, 8, true)).toBe(0);
    }
  });

  it('is 0 when the destination devices already hold their shards (a replica is dropped)', () => {
    expect(reallocSeconds(L7, layout({ dp: 2, tp: 4 }), layout({ tp: 4 }), A100, 8)).toBe(0);
  });

  it('is the weights over the link when one device hands a whole model to another (hand-computed)', () => {
    const bytes = parameterCounts(L7).total * 2;
    const pieces = coarseInfo(L7).params.length;
    const intra = reallocSeconds(L7, layout({}, 0), layout({}, 1), A100, 8);
    expect(intra).toBeGreaterThanOrEqual(bytes / A100.intraBandwidth);
    expect(intra).toBeLessThanOrEqual(bytes / A100.intraBandwidth + pieces * A100.latency + 1e-12);
    // The same move between two nodes crosses the slower link.
    const inter = reallocSeconds(L7, layout({}, 0), layout({}, 8), A100, 8);
    expect(inter).toBeGreaterThanOrEqual(bytes / A100.interBandwidth);
    expect(inter).toBeLessThanOrEqual(bytes / A100.interBandwidth + pieces * A100.latency + 1e-12);
    expect(inter).toBeGreaterThan(intra);
  });

  it('grows when more devices need slices they lack', () => {
    const grow = reallocSeconds(L7, layout({ tp: 4 }), layout({ dp: 2, tp: 4 }), A100, 8);
    expect(grow).toBeGreaterThan(0);
  });
});

describe('allReduceSeconds', () => {
  it('is 0 for one rank', () => {
    expect(allReduceSeconds(1e9, 1, 1e11, 1e-5)).toBe(0);
    expect(allReduceSeconds(0, 1, 1e11, 1e-5)).toBe(0);
  });

  it('follows the ring formula 2(n−1)/n·bytes/bw + 2(n−1)·α (hand-computed)', () => {
    // n = 4: 1.5 · 1e9 / 1e11 = 0.015 s, plus 6 · 10 µs = 60 µs.
    expect(allReduceSeconds(1e9, 4, 1e11, 1e-5)).toBeCloseTo(0.01506, 12);
    // n = 2: 1 · 0.01 s + 2 · 10 µs.
    expect(allReduceSeconds(1e9, 2, 1e11, 1e-5)).toBeCloseTo(0.01002, 12);
    // n = 8, no latency: 1.75 · 2e9 / 2.4e11.
    expect(allReduceSeconds(2e9, 8, 2.4e11, 0)).toBeCloseTo((1.75 * 2e9) / 2.4e11, 12);
  });
});

describe('strategyProblem', () => {
  it('refuses a tensor-parallel degree that does not divide the heads', () => {
    expect(strategyProblem(L7, { dp: 1, tp: 3, pp: 1 })).toMatch(/tp=3.*32 heads/);
    expect(strategyProblem(L7, { dp: 1, tp: 64, pp: 1 })).toMatch(/tp=64/);
    // 70B: 64 query heads but 8 key/value heads.
    expect(strategyProblem(L70, { dp: 1, tp: 16, pp: 1 })).toMatch(/tp=16.*8 key\/value heads/);
    expect(strategyProblem(L70, { dp: 1, tp: 8, pp: 1 })).toBeUndefined();
  });

  it('refuses more pipeline stages than layers', () => {
    expect(strategyProblem(L7, { dp: 1, tp: 1, pp: 33 })).toMatch(/pp=33.*32 layers/);
    expect(strategyProblem(L7, { dp: 1, tp: 1, pp: 64 })).toMatch(/pp=64/);
    expect(strategyProblem(L7, { dp: 1, tp: 8, pp: 32 })).toBeUndefined();
  });
});

describe('callCost', () => {
  it('needs less memory per device with more tensor parallelism', () => {
    const train = [1, 2, 4, 8].map((tp) => callCost(L7, 'train', layout({ tp }), SMALL, A100, 8, { owner: true, trainable: true }));
    const infer = [1, 2, 4, 8].map((tp) => callCost(L7, 'inference', layout({ tp }), SMALL, A100, 8, { owner: true }));
    const gen = [1, 2, 4, 8].map((tp) => callCost(L7, 'generate', layout({ tp }), SMALL, A100, 8, { owner: false }));
    for (let i = 1; i < 4; i++) {
      // Weights, gradients and Adam state split evenly over the tensor group.
      expect(train[i]!.residentBytes).toBeCloseTo(train[i - 1]!.residentBytes / 2, 0);
      expect(train[i]!.residentBytes + train[i]!.transientBytes).toBeLessThan(train[i - 1]!.residentBytes + train[i - 1]!.transientBytes);
      expect(infer[i]!.residentBytes + infer[i]!.transientBytes).toBeLessThan(infer[i - 1]!.residentBytes + infer[i - 1]!.transientBytes);
      expect(gen[i]!.transientBytes).toBeLessThan(gen[i - 1]!.transientBytes);
    }
    // A 7B model with mixed-precision Adam needs 16 bytes per parameter on one device.
    expect(train[0]!.residentBytes).toBeCloseTo(parameterCounts(L7).total * 16, -3);
    // A view (not the owner) holds no resident state, its weights are transient.
    expect(gen[0]!.residentBytes).toBe(0);
    expect(gen[0]!.transientBytes).toBeGreaterThan(parameterCounts(L7).total * 2);
  });

  it('fits a forward-only inference call on one device by micro-batching, as training and generation fit theirs', () => {
    // A 7B reference model (13.5 GB of bf16 weights) scoring 512 sequences of 2048 tokens on one
    // 80 GB A100: a forward pass keeps no activations for a backward pass, and sequences can be
    // processed a few at a time, so the call fits. Training fits its micro-batches to free memory
    // and generation decodes in waves that fit; inference must not be rejected for memory it
    // never needs at once.
    const c = callCost(L7, 'inference', layout({}), BIG, A100, 8, { owner: true });
    expect(c.residentBytes + c.transientBytes).toBeLessThanOrEqual(A100.memoryBytes);
  });

  it('generation is memory-bandwidth bound: one sequence costs about the weights read once per token (hand-computed)', () => {
    const wl: Workload = { batch: 1, promptLen: 16, responseLen: 256, epochs: 1, minibatches: 1 };
    const perToken = (parameterCounts(L7).total * 2) / A100.memBandwidth + L7.layers * A100.layerOverhead;
    const c = callCost(L7, 'generate', layout({}), wl, A100, 8, { owner: true });
    expect(c.seconds / (256 * perToken)).toBeGreaterThan(0.99);
    expect(c.seconds / (256 * perToken)).toBeLessThan(1.05);
  });

  it('takes longer to decode longer responses', () => {
    const times = [64, 128, 256, 512, 1024, 2048].map((responseLen) => callCost(L7, 'generate', layout({ tp: 8 }), { ...BIG, responseLen }, A100, 8).seconds);
    for (let i = 1; i < times.length; i++) expect(times[i]!).toBeGreaterThan(times[i - 1]!);
    // And on one sequence, about twice as long for twice the tokens.
    const one = (responseLen: number) => callCost(L7, 'generate', layout({}), { batch: 1, promptLen: 16, responseLen, epochs: 1, minibatches: 1 }, A100, 8).seconds;
    expect(one(512) / one(256)).toBeGreaterThan(1.9);
    expect(one(512) / one(256)).toBeLessThan(2.1);
  });

  it('trains in time linear in the number of epochs', () => {
    const t = (epochs: number) => callCost(L7, 'train', layout({ tp: 8 }), { ...BIG, epochs }, A100, 8, { owner: true, trainable: true }).seconds;
    const t1 = t(1);
    expect(t1).toBeGreaterThan(0);
    expect(t(2) / t1).toBeCloseTo(2, 6);
    expect(t(4) / t1).toBeCloseTo(4, 6);
  });

  it('adds a pipeline bubble only with several stages', () => {
    expect(callCost(L7, 'train', layout({ tp: 8 }), BIG, A100, 8, { owner: true, trainable: true }).bubble).toBe(0);
    expect(callCost(L7, 'train', layout({ tp: 4, pp: 2 }), BIG, A100, 8, { owner: true, trainable: true }).bubble).toBeGreaterThan(0);
  });

  it('has no communication on one device; seconds are compute + communication + bubble', () => {
    for (const kind of ['generate', 'inference', 'train'] as const) {
      const c = callCost(L7, kind, layout({}), SMALL, A100, 8, { owner: true, trainable: kind === 'train' });
      expect(c.communication).toBe(0);
      expect(c.seconds).toBeCloseTo(c.compute + c.communication + c.bubble, 9);
      const t = callCost(L7, kind, layout({ tp: 4, pp: 2 }), BIG, A100, 8, { owner: true, trainable: kind === 'train' });
      expect(t.seconds).toBeCloseTo(t.compute + t.communication + t.bubble, 6);
    }
  });

  it('is slower when a tensor group crosses nodes than when it stays inside one', () => {
    // The same 8 ranks with tp = 8: inside one node of 8, or across two nodes of 4.
    for (const kind of ['generate', 'inference', 'train'] as const) {
      const opts = { owner: true, trainable: kind === 'train' };
      const inside = callCost(L7, kind, layout({ tp: 8 }), BIG, A100, 8, opts);
      const across = callCost(L7, kind, layout({ tp: 8 }), BIG, A100, 4, opts);
      expect(across.compute).toBeCloseTo(inside.compute, 6);
      expect(across.communication).toBeGreaterThan(inside.communication);
      expect(across.seconds).toBeGreaterThan(inside.seconds);
    }
    // A tensor pair on devices 7 and 8 of nodes of 8 (straddling nodes 0 and 1) against 0 and 1.
    const pairInside = callCost(L7, 'train', layout({ tp: 2 }, 0), SMALL, A100, 8, { owner: true, trainable: true });
    const pairAcross = callCost(L7, 'train', layout({ tp: 2 }, 7), SMALL, A100, 8, { owner: true, trainable: true });
    expect(pairAcross.communication).toBeGreaterThan(pairInside.communication);
    expect(pairAcross.seconds).toBeGreaterThan(pairInside.seconds);
  });

  it('is slower when the gradient all-reduce crosses nodes', () => {
    // dp = 2 × tp = 8 on 16 devices: one replica per node of 8, or both in one node of 16.
    const opts = { owner: true, trainable: true };
    const across = callCost(L7, 'train', layout({ dp: 2, tp: 8 }), BIG, A100, 8, opts);
    const inside = callCost(L7, 'train', layout({ dp: 2, tp: 8 }), BIG, A100, 16, opts);
    expect(across.communication).toBeGreaterThan(inside.communication);
  });

  it('scaledProfile: a machine twice as slow prices every call at twice the time', () => {
    const local: DeviceProfile = {
      name: 'l',
      flops: 1e10,
      memBandwidth: 1e10,
      memoryBytes: 1e12,
      intraBandwidth: 1e8,
      interBandwidth: 1e8,
      latency: 1e-3,
      layerOverhead: 1e-4,
      callOverhead: 1e-3,
      elementSeconds: 1e-7,
      decodeLayerOverhead: 1e-4,
      decodeStepOverhead: 1e-4,
      busBandwidth: 1e8,
      source: 't',
    };
    const tiny = localShape('tiny', 16, 2, 64, 4);
    const wl: Workload = { batch: 8, promptLen: 3, responseLen: 5, epochs: 1, minibatches: 1 };
    for (const kind of ['generate', 'inference', 'train'] as const) {
      for (const l of [layout({}), layout({ tp: 2 }), layout({ pp: 2 })]) {
        const one = callCost(tiny, kind, l, wl, local, 8, { owner: true, trainable: true }).seconds;
        const two = callCost(tiny, kind, l, wl, scaledProfile(local, 2), 8, { owner: true, trainable: true }).seconds;
        expect(two / one).toBeCloseTo(2, 9);
      }
    }
    expect(scaledProfile(local, 2).busBandwidth).toBe(5e7);
    const store = scaledProfile({ ...local, storeLatency: 0.02, storeBandwidth: 1e8 }, 2);
    expect([store.storeLatency, store.storeBandwidth]).toEqual([0.04, 5e7]);
    expect(scaledProfile(A100, 1.5).elementSeconds).toBeUndefined();
  });

  describe("a fitted local profile's terms (hand-computed)", () => {
    // A device whose only cost is the term under test: everything else free.
    const FREE: DeviceProfile = { name: 'free', flops: 1e30, memBandwidth: 1e30, memoryBytes: 1e12, intraBandwidth: 1e30, interBandwidth: 1e30, latency: 0, layerOverhead: 0, source: 'test' };
    const tiny = localShape('tiny', 16, 2, 64, 4);
    const wl: Workload = { batch: 8, promptLen: 3, responseLen: 5, epochs: 1, minibatches: 1 };
    const one = layout({});

    it('elementSeconds: tokens × (layers + 1) × width per pass, split by tp; training by trainElementFactor', () => {
      const dev = { ...FREE, elementSeconds: 1e-9 };
      // Inference: 8 rows × 8 tokens × 3 (two layers and the head) × 64.
      expect(callCost(tiny, 'inference', one, wl, dev, 8).compute).toBeCloseTo(8 * 8 * 3 * 64 * 1e-9, 15);
      expect(callCost(tiny, 'inference', layout({ tp: 2 }), wl, dev, 8).compute).toBeCloseTo((8 * 8 * 3 * 64 * 1e-9) / 2, 15);
      expect(callCost(tiny, 'train', one, wl, { ...dev, trainElementFactor: 4 }, 8, { owner: true, trainable: true }).compute).toBeCloseTo(4 * 8 * 8 * 3 * 64 * 1e-9, 15);
      // Generation: the prompt's pass (8 × 3 tokens), then one token per row at each of 5 steps.
      expect(callCost(tiny, 'generate', one, wl, dev, 8).compute).toBeCloseTo((8 * 3 + 8 * 5) * 3 * 64 * 1e-9, 15);
    });

    it("trainLayerOverhead: a training step's fixed cost per layer pass, fitted apart from inference's, which a replica pays whatever its rows", () => {
      const dev = { ...FREE, trainLayerOverhead: 1e-3 };
      const train = (l: Layout, w: Workload = wl) => callCost(tiny, 'train', l, w, dev, 8, { owner: true, trainable: true }).compute;
      // One step of one pass over two layers and the head.
      expect(train(one)).toBeCloseTo(3 * 1e-3, 12);
      // Four steps (2 epochs × 2 mini-batches): four passes.
      expect(train(one, { ...wl, epochs: 2, minibatches: 2 })).toBeCloseTo(4 * 3 * 1e-3, 12);
      // Each of two replicas takes half the rows and all of the fixed cost.
      expect(train(layout({ dp: 2 }))).toBeCloseTo(3 * 1e-3, 12);
      // Inference has none of it; without it, training pays trainPassFactor × layerOverhead.
      expect(callCost(tiny, 'inference', one, wl, dev, 8).compute).toBeLessThan(1e-20);
      const { trainLayerOverhead: _, ...factor } = { ...dev, layerOverhead: 1e-3, trainPassFactor: 2 };
      expect(callCost(tiny, 'train', one, wl, factor, 8, { owner: true, trainable: true }).compute).toBeCloseTo(3 * 2e-3, 12);
    });

    it('decodeLayerOverhead and decodeStepOverhead price each decoding step, not the prompt', () => {
      const perLayer = callCost(tiny, 'generate', one, wl, { ...FREE, decodeLayerOverhead: 1e-3 }, 8).compute;
      expect(perLayer).toBeCloseTo(5 * 3 * 1e-3, 12);
      const perStep = callCost(tiny, 'generate', one, wl, { ...FREE, decodeStepOverhead: 2e-3 }, 8).compute;
      expect(perStep).toBeCloseTo(5 * 2e-3, 12);
      // Without a decoding term of its own, a step pays the pass's per-layer cost.
      const pass = callCost(tiny, 'generate', one, wl, { ...FREE, layerOverhead: 1e-3 }, 8).compute;
      expect(pass).toBeCloseTo(3 * 1e-3 + 5 * 3 * 1e-3, 12);
      // Neither touches inference or training.
      expect(callCost(tiny, 'inference', one, wl, { ...FREE, decodeLayerOverhead: 1, decodeStepOverhead: 1 }, 8).compute).toBeLessThan(1e-20); // the FLOPs at 1e30 FLOP/s
    });
  });
});

describe('a long tail of response lengths', () => {
  it('is an exponential of the given mean, cut at the budget', () => {
    for (const [mean, budget] of [
      [4096, 16384],
      [100, 128],
      [10, 1000],
    ] as const) {
      const m = tailScale(mean, budget);
      expect(m * (1 - Math.exp(-budget / m))).toBeCloseTo(mean, 6);
    }
  });

  it('decodes every row to the budget without a mean; with one, the rows held halve as they end, until the longest', () => {
    expect(decodeSteps(32, 1024)).toEqual([{ rows: 32, steps: 1024 }]);
    const steps = decodeSteps(32, 16384, 4096);
    expect(steps.map((s) => s.rows)).toEqual(steps.map((_, k) => Math.max(1, Math.ceil(32 / 2 ** k))));
    // Each halving comes after m·ln 2 more steps (the last segment ends at the longest response).
    const per = tailScale(4096, 16384) * Math.LN2;
    for (const s of steps.slice(0, -1)) expect(s.steps).toBeCloseTo(per, 6);
    const longest = steps.reduce((n, s) => n + s.steps, 0);
    // The longest of 32 is far past the mean, below the budget.
    expect(longest).toBeGreaterThan(3 * 4096);
    expect(longest).toBeLessThan(16384);
    // One row alone: its expected length is the mean.
    expect(decodeSteps(1, 16384, 4096).reduce((n, s) => n + s.steps, 0)).toBeCloseTo(4096, 0);
  });

  it("makes generation cheaper than every row running to the budget, and its tail each step's weight read at least", () => {
    const H100 = DEVICES['h100-80gb']!;
    const Q7 = MODELS['qwen2.5-7b']!;
    const wl: Workload = { batch: 64, promptLen: 1024, responseLen: 16384, epochs: 1, minibatches: 1 };
    const full = callCost(Q7, 'generate', layout({ tp: 2 }), wl, H100, 8, { owner: false });
    const tail = callCost(Q7, 'generate', layout({ tp: 2 }), { ...wl, responseMean: 4096 }, H100, 8, { owner: false });
    expect(tail.seconds).toBeLessThan(full.seconds);
    const longest = decodeSteps(64, 16384, 4096).reduce((n, s) => n + s.steps, 0);
    const weightRead = (parameterCounts(Q7).total * Q7.dtypeBytes) / 2 / H100.memBandwidth;
    expect(tail.compute).toBeGreaterThan(longest * weightRead);
  });
});

describe('continuous generation (rl.slots)', () => {
  /** Decoding steps of `rows` responses through `slots` slots, each that ends refilled at once, as the runtime does (engine/generation/). */
  function simulated(rows: number, slots: number, budget: number, mean: number, seed: number): { steps: number; refills: number } {
    const m = tailScale(mean, budget);
    let x = seed;
    const uniform = () => ((x = (Math.imul(x, 1664525) + 1013904223) >>> 0) + 0.5) / 2 ** 32;
    const length = () => Math.min(budget, Math.max(1, Math.ceil(-m * Math.log(uniform()))));
    const left = Array.from({ length: Math.min(rows, slots) }, length);
    let next = left.length;
    let steps = 0;
    let refills = 0;
    while (left.length) {
      steps += 1;
      let ended = 0;
      for (let i = left.length - 1; i >= 0; i--) {
        if (--left[i]! > 0) continue;
        ended += 1;
        if (next < rows) {
          left[i] = length();
          next += 1;
        } else left.splice(i, 1);
      }
      if (ended && next <= rows && left.length === slots) refills += 1;
    }
    return { steps, refills };
  }

  it('is a wave where no row waits or every response runs to the budget; else the waiting rows over the slots, then a wave', () => {
    expect(continuousSteps(32, 32, 1024, 100)).toBeUndefined();
    expect(continuousSteps(64, 32, 1024)).toBeUndefined();
    const flow = continuousSteps(256, 32, 1024, 100)!;
    expect(flow.full).toBeCloseTo((224 * 100) / 32, 9);
    expect(flow.tail).toEqual(decodeSteps(32, 1024, 100));
  });

  it('prices the steps the runtime takes, within 10% (the median of 9 draws of the lengths)', () => {
    for (const [rows, slots, budget, mean] of [
      [256, 32, 1024, 100],
      [512, 16, 2048, 256],
      [128, 64, 512, 32],
    ] as const) {
      const flow = continuousSteps(rows, slots, budget, mean)!;
      const priced = flow.full + flow.tail.reduce((n, t) => n + t.steps, 0);
      const runs = Array.from({ length: 9 }, (_, k) => simulated(rows, slots, budget, mean, 17 + k).steps).sort((a, b) => a - b);
      expect(Math.abs(priced - runs[4]!) / runs[4]!, `${rows} rows, ${slots} slots, mean ${mean}: priced ${priced.toFixed(0)}, ran ${runs[4]}`).toBeLessThan(0.1);
      // By waves: each to its longest response, far more steps.
      const waves = Math.ceil(rows / slots) * decodeSteps(slots, budget, mean).reduce((n, t) => n + t.steps, 0);
      expect(waves).toBeGreaterThan(1.5 * priced);
    }
  });

  it('makes a long-tail generation that decodes in waves cheaper, and changes nothing where every row fits at once', () => {
    const H100 = DEVICES['h100-80gb']!;
    const Q7 = MODELS['qwen2.5-7b']!;
    const wl: Workload = { batch: 1024, promptLen: 1024, responseLen: 16384, responseMean: 4096, epochs: 1, minibatches: 1 };
    const waves = callCost(Q7, 'generate', layout({ tp: 2 }), wl, H100, 8, { owner: false });
    const slots = callCost(Q7, 'generate', layout({ tp: 2 }), { ...wl, slots: Number.MAX_SAFE_INTEGER }, H100, 8, { owner: false });
    expect(waves.slots).toBeLessThan(1024);
    expect(slots.slots).toBe(waves.slots);
    expect(slots.seconds).toBeLessThan(waves.seconds / 1.5);
    // On several stages: decoded by waves whatever rl.slots says.
    const staged = layout({ tp: 2, pp: 2 });
    expect(callCost(Q7, 'generate', staged, { ...wl, slots: 8 }, H100, 8, { owner: false }).seconds).toBe(callCost(Q7, 'generate', staged, wl, H100, 8, { owner: false }).seconds);
    const few = { ...wl, batch: 8 };
    expect(callCost(Q7, 'generate', layout({ tp: 2 }), { ...few, slots: 64 }, H100, 8, { owner: false }).seconds).toBe(
      callCost(Q7, 'generate', layout({ tp: 2 }), few, H100, 8, { owner: false }).seconds,
    );
  });
});

describe('episodes against an environment (hand-computed)', () => {
  // A device whose only cost is a decoding step's fixed cost (1 ms) and the environment's answers:
  // every pass of a group costs 1 ms, whatever its rows; the log-probabilities' pass costs nothing.
  const FREE: DeviceProfile = { name: 'free', flops: 1e30, memBandwidth: 1e30, memoryBytes: 1e12, intraBandwidth: 1e30, interBandwidth: 1e30, latency: 0, layerOverhead: 0, source: 'test' };
  const dev: DeviceProfile = { ...FREE, decodeStepOverhead: 1e-3, envAnswerSeconds: 2e-3 };
  const tiny = localShape('tiny', 16, 2, 64, 4);
  // 32 episodes of at most 4 actions of at most 2 tokens, in a response of 16.
  const wl = (groupSize: number, answerSeconds?: number): Workload => ({
    batch: 32,
    promptLen: 3,
    responseLen: 16,
    epochs: 1,
    minibatches: 1,
    episodes: { groupSize, maxTurns: 4, turnTokens: 2, ...(answerSeconds !== undefined ? { answerSeconds } : {}) },
  });
  const one = layout({});

  it('decodes in groups of group_size rows, a pass per token of every round, at the turn budget', () => {
    // 4 groups × 4 rounds × 2 passes, 1 ms each; decoding the whole budget at once would take 16 steps.
    expect(callCost(tiny, 'generate', one, wl(8), dev, 8).compute).toBeCloseTo(32e-3, 12);
    expect(callCost(tiny, 'generate', one, { ...wl(8), episodes: undefined }, dev, 8).compute).toBeCloseTo(16e-3, 12);
    // Replicas play their own rows: two of them, two groups each.
    expect(callCost(tiny, 'generate', layout({ dp: 2 }), wl(8), dev, 8).compute).toBeCloseTo(16e-3, 12);
  });

  it('waits for the first resets and the last steps where other groups keep the device busy', () => {
    // 32 ms of rounds; one group's chain, 5 answers (10 ms) and its 8 ms with the other three's
    // rounds queued before its own (3 × 2 ms), is shorter: the device waits only 2 answers.
    const c = callCost(tiny, 'generate', one, wl(8), dev, 8);
    expect(c.environment).toBeCloseTo(4e-3, 12);
    expect(c.seconds).toBeCloseTo(c.compute + c.communication + c.bubble + c.environment, 12);
  });

  it('waits for every answer in lock-step (one group), and prices what the environment itself takes', () => {
    // One group: 8 ms of rounds, and 5 answers of 2 ms it waits for with nothing else to do.
    expect(callCost(tiny, 'generate', one, wl(32), dev, 8).environment).toBeCloseTo(10e-3, 12);
    // Each answer 3 ms longer (environment.seconds): 5 × 5 ms.
    expect(callCost(tiny, 'generate', one, wl(32, 3e-3), dev, 8).environment).toBeCloseTo(25e-3, 12);
    // Without the profile's figure, an answer is a round trip over the bus: two latencies.
    const { envAnswerSeconds: _, ...bare } = dev;
    expect(callCost(tiny, 'generate', one, wl(32), { ...bare, latency: 1e-3 }, 8).environment).toBeCloseTo(10e-3, 12);
  });

  it("adds the log-probabilities' forward pass over the whole sequences", () => {
    const elements = { ...FREE, elementSeconds: 1e-9 };
    // Rounds: 4 groups × 8 passes of 8 rows × 3 × 64 elements; then 32 rows × 19 tokens × 3 × 64.
    const rounds = 4 * 8 * 8 * 3 * 64 * 1e-9;
    expect(callCost(tiny, 'generate', one, wl(8), elements, 8).compute).toBeCloseTo(rounds + 32 * 19 * 3 * 64 * 1e-9, 15);
  });
});
