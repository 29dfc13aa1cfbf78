import { describe, expect, it } from 'vitest';
import { decode, encode } from '../../../mesh/wire/messages/codec.ts';
import { CheckpointFile, PROTOCOL_VERSION } from '../../../mesh/wire/messages/protocol.ts';
import { ReplicaError, packReplicas, unpackReplicas } from './replicas.ts';

const shard = (x: number) => ({
  tensors: [{ name: 'w', shape: [3], data: new Float32Array([x, x + 1, x + 2]) }],
  optimizer: { step: 2, moments: [{ name: 'w', m: new Float32Array(3), v: new Float32Array(3) }] },
});

describe('packReplicas / unpackReplicas', () => {
  it('keeps data-parallel replicas once, and gives every rank its checkpoint back through a file', () => {
    const a = shard(1);
    const b = shard(5);
    // dp 2 × tp 2: ranks 0 and 2 share a, ranks 1 and 3 share b.
    const set = { actor: [a, b, a, b], reference: [shard(9)] };
    const packed = packReplicas(set);
    expect(packed.models.actor).toHaveLength(2);
    expect(packed.replicas).toEqual({ actor: [0, 1, 0, 1], reference: [0] });
    const bytes = encode({ type: 'checkpoint', v: PROTOCOL_VERSION, iteration: 3, ...packed });
    expect(bytes.length).toBeLessThan(encode({ type: 'checkpoint', v: PROTOCOL_VERSION, iteration: 3, models: set }).length * 0.7);
    const file = decode('x', bytes, CheckpointFile);
    const back = unpackReplicas(file.models, file.replicas, 'x');
    expect(back.actor!.map((c) => Array.from(c.tensors[0]!.data))).toEqual([
      [1, 2, 3],
      [5, 6, 7],
      [1, 2, 3],
      [5, 6, 7],
    ]);
    expect(back.reference![0]!.tensors[0]!.data).toEqual(new Float32Array([9, 10, 11]));
  });

  it('writes a set without shared checkpoints as it is, and refuses an index past what the file holds', () => {
    const set = { actor: [shard(1), shard(2)] };
    expect(packReplicas(set)).toEqual({ models: set });
    expect(() => unpackReplicas(set, { actor: [0, 2] }, 'snap')).toThrow(new ReplicaError("snap: rank 1 of 'actor' holds checkpoint 2; the file has 2 for it"));
    expect(() => unpackReplicas(set, { critic: [0] }, 'snap')).toThrow(/replicas name 'critic', which the file holds no checkpoint of/);
  });
});
