// Every dp × tp × pp strategy over 2 and 4 devices again, now with the ranks as real worker
// processes on a real nats-server: activations, gradients and partial sums cross NATS. Tokens
// must equal the unsharded model's; log-probabilities and the parameters after a training call
// must match it (same tolerance as engine/sharded.test.ts, which explains it).
import { describe, expect, it } from 'vitest';
import { rankCoords, shardSlices, type Layout } from '../mesh/parallel/layout.ts';
import type { Optim } from '../mesh/wire/messages/protocol.ts';
import { cut } from '../mesh/parallel/slices.ts';
import { initBackend } from '../engine/model/backend/backend.ts';
import { withWorkers } from '../engine/cli/workers.ts';
import { modelInfo, type GptSpec } from '../engine/model/params.ts';
import { callMesh } from '../engine/runtime/run/run.ts';
import { ReferenceGpt } from './reference-gpt.ts';

const spec: GptSpec = { kind: 'policy', vocab: 11, context: 9, layers: 4, width: 16, heads: 4 };
const optim: Optim = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-3, clipNorm: 1 };
const loss = { name: 'clip_policy', params: { clip: 0.2 } };
const B = 8;
const P = 5;
const R = 4;
const prompts = Int32Array.from({ length: B * P }, (_, i) => (i % P === P - 1 ? 10 : (i * 7 + 3) % 10));
const seeds = Uint32Array.from({ length: B }, (_, i) => 1000 + i);
const adv = Float32Array.from({ length: B * R }, (_, i) => Math.sin(i));

function layouts(): Layout[] {
  const out: Layout[] = [];
  for (const n of [2, 4]) {
    for (let dp = 1; dp <= n; dp *= 2) for (let tp = 1; dp * tp <= n; tp *= 2) out.push({ devices: Array.from({ length: n }, (_, i) => i), dp, tp, pp: n / (dp * tp) });
  }
  return out;
}

function worstRelative(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let worst = 0;
  for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / Math.max(Math.abs(got[i]!), Math.abs(want[i]!), 0.01));
  return worst;
}

describe('3D-parallel shards as worker processes over NATS', () => {
  it('match the unsharded model for every strategy over 2 and 4 devices', async () => {
    await initBackend('wasm');
    const ref = new ReferenceGpt(spec, 7, optim);
    const gen = await ref.generate(prompts, B, P, R, seeds, 1);
    const logprobs = ref.logprobs(gen.tokens, B, P);
    await ref.train(gen.tokens, B, P, R, loss, { old: logprobs, advantages: adv }, 1, 1, 11);
    const trained = new Map(ref.exportTensors().map((t) => [t.name, t.data]));
    const info = modelInfo(spec);
    const all = layouts();
    expect(all).toHaveLength(9);

    await withWorkers(4, 'strategies', async ({ d }) => {
      for (const [i, layout] of all.entries()) {
        const name = `m${i}`;
        const what = `dp=${layout.dp} tp=${layout.tp} pp=${layout.pp}`;
        await Promise.all(layout.devices.map((dev, rank) => d.call(dev, name, 0, { fn: 'load', role: 'actor', spec, layout, rank, seed: 7, optim })));
        const g = await callMesh(d, layout, name, 0, { fn: 'generate', prompts, batch: B, promptLen: P, responseLen: R, seeds, temperature: 1 });
        expect(Array.from(g.tokens), what).toEqual(Array.from(gen.tokens));
        const inf = await callMesh(d, layout, name, 0, { fn: 'inference', tokens: g.tokens, batch: B, promptLen: P, responseLen: R });
        expect(worstRelative((inf as { logprobs: Float32Array }).logprobs, logprobs), `${what}: log-probs`).toBeLessThanOrEqual(1e-5);
        await callMesh(d, layout, name, 0, {
          fn: 'train',
          tokens: g.tokens,
          batch: B,
          promptLen: P,
          responseLen: R,
          seed: 11,
          epochs: 1,
          minibatches: 1,
          loss,
          data: { old: logprobs, advantages: adv },
        });
        for (const [rank, dev] of layout.devices.entries()) {
          const { tensors } = await d.call(dev, name, 0, { fn: 'weights' });
          const held = new Map(tensors.map((t) => [t.name, t.data]));
          for (const s of shardSlices(info, layout, rank)) {
            const want = cut(trained.get(s.name)!, { ...s, axis: null, start: 0, end: s.shape[0]! }, s);
            expect(worstRelative(held.get(s.name)!, want), `${what}: ${s.name} on rank ${rank} (${JSON.stringify(rankCoords(layout, rank))})`).toBeLessThanOrEqual(1e-5);
          }
        }
        await Promise.all(layout.devices.map((dev) => d.call(dev, name, 0, { fn: 'release' })));
      }
    });
  }, 180_000);
});
