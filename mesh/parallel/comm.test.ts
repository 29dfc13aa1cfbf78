// Collectives come on their sender's own subject: a message that names another sender than its
// subject's is dropped, so a device cannot send activations, gradients or an abort as another.
import { describe, expect, it } from 'vitest';
import { MemoryBus, PROTOCOL_VERSION, encode, subjects } from '../wire/index.ts';
import { Comm } from './comm.ts';

const subj = subjects('comm');
const coll = (from: number, tag: string, data: Float32Array) => encode({ type: 'coll', v: PROTOCOL_VERSION, group: 'g0-1-[actor.train]-0', tag, from, part: 0, parts: 1, data });

describe('Comm', () => {
  it('takes a message only from its sender’s own subject', async () => {
    const bus = new MemoryBus();
    const comm = new Comm(bus, subj, 1, 5000);
    // Device 3 claims to be device 2: a forged value and a forged abort, each on device 3's subject.
    bus.publish(subj.collective(1, 3), coll(2, 'fwd', Float32Array.from([9, 9])));
    bus.publish(subj.collective(1, 3), coll(2, '!abort', new Float32Array(0)));
    await bus.flush();
    bus.publish(subj.collective(1, 2), coll(2, 'fwd', Float32Array.from([1, 2])));
    expect(await comm.recv('g0-1-[actor.train]-0', 2, 'fwd')).toEqual(Float32Array.from([1, 2]));
    comm.close();
  });
});
