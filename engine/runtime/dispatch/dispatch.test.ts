// runExchange on an in-memory bus: go is sent only once every expected device has said ready for
// this exchange; a ready for another exchange, or from a device not in it, counts for nothing.
import { describe, expect, it } from 'vitest';
import { MemoryBus } from '../../../mesh/wire/bus/memory-bus.ts';
import { encode } from '../../../mesh/wire/messages/codec.ts';
import { PROTOCOL_VERSION } from '../../../mesh/wire/messages/protocol.ts';
import { subjects } from '../../../mesh/wire/bus/subjects.ts';
import { exchangeId, runExchange } from './dispatch.ts';

const settle = () => new Promise((r) => setTimeout(r, 20));

describe('runExchange', () => {
  it('sends go only after every expected device is ready for this exchange', async () => {
    const bus = new MemoryBus();
    const subj = subjects('x1');
    const id = exchangeId('ckpt-0-actor-0');
    const gone: string[] = [];
    bus.subscribe(subj.go(id), { callback: () => gone.push('go') });
    // The devices' calls end once go has come.
    const call = (() => new Promise((resolve) => bus.subscribe(subj.go(id), { callback: () => resolve({ fn: 'probe', received_bytes: 0, sent_bytes: 0 }) }))) as never;
    const ready = (realloc: string, device: number) => bus.publish(subj.ready(id), encode({ type: 'ready', v: PROTOCOL_VERSION, realloc, device }));
    const done = runExchange(bus, subj, call, id, 0, 'actor', [0, 1], () => ({ fn: 'probe' }) as never);
    await settle();
    ready('ckpt-0-actor-0-0000000000000000', 1); // device 1, but another exchange's id
    ready(id, 7); // a device that is not in the exchange
    ready(id, 0);
    ready(id, 0); // twice
    await settle();
    expect(gone).toEqual([]);
    ready(id, 1);
    await done;
    expect(gone).toEqual(['go']);
  });
});
