// An in-memory mesh for the model's tests: the ranks of a layout as Device objects over a memory
// bus in this process, every dp × tp × pp strategy over up to 4 devices, and the 1e-5 comparison
// the layouts are held to against the unsharded model.
import { expect } from 'vitest';
import { MemoryBus } from '../mesh/wire/bus/memory-bus.ts';
import { rankCoords, type Layout } from '../mesh/parallel/layout.ts';
import { PROTOCOL_VERSION, type Call, type CallBody } from '../mesh/wire/messages/protocol.ts';
import { subjects } from '../mesh/wire/bus/subjects.ts';
import { Device } from '../engine/device/device.ts';

export function strategies(maxDevices: number): Layout[] {
  const out: Layout[] = [];
  for (const n of [1, 2, 4].filter((x) => x <= maxDevices)) {
    for (let dp = 1; dp <= n; dp *= 2) for (let tp = 1; dp * tp <= n; tp *= 2) out.push({ devices: Array.from({ length: n }, (_, i) => i), dp, tp, pp: n / (dp * tp) });
  }
  return out;
}

/** A mesh of devices in this process, and a way to run one call on all its ranks. */
export function mesh(layout: Layout) {
  const bus = new MemoryBus();
  const subj = subjects('sharded');
  const devices = layout.devices.map((d) => new Device(d, bus, subj, { transferTimeoutMs: 20_000 }));
  let seq = 0;
  const run = async (model: string, body: (rank: number) => CallBody) => {
    const id = `c${seq++}`;
    return Promise.all(devices.map((d, rank) => d.run({ type: 'call', v: PROTOCOL_VERSION, id, group: id, model, iteration: 0, body: body(rank) } satisfies Call)));
  };
  const speaking = (layout: Layout) => layout.devices.map((_, r) => r).filter((r) => rankCoords(layout, r).pp === layout.pp - 1 && rankCoords(layout, r).tp === 0);
  const gather = <T extends Float32Array | Int32Array>(outs: Array<Record<string, unknown>>, key: string): T => {
    const parts = speaking(layout).map((r) => outs[r]![key] as T);
    const n = parts.reduce((a, p) => a + p.length, 0);
    const out = new (parts[0]!.constructor as { new (n: number): T })(n);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  };
  return { devices, run, gather, bus, subj };
}

/**
 * Worst |a − b| / max(|a|, |b|, 0.01) must be at most 1e-5. The floor is the scale of the model's
 * initial weights (N(0, 0.02)): biases that start at zero hold values near 1e-5 after one step,
 * where a relative error would only measure summation order.
 */
export function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, what: string) {
  expect(got.length, `${what}: length`).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    const a = got[i]!;
    const b = want[i]!;
    const err = Math.abs(a - b) / Math.max(Math.abs(a), Math.abs(b), 0.01);
    worst = Math.max(worst, err);
  }
  expect(worst, `${what}: worst relative error`).toBeLessThanOrEqual(1e-5);
}
