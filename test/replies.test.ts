// Replies on a real bus go to inboxes only: a forged call (or hello) whose reply subject is a run
// subject — the results stream's, say — makes no one write there. And exchange ids cannot be guessed.
import { describe, expect, it } from 'vitest';
import { withWorkers } from '../engine/cli/workers.ts';
import { exchangeId } from '../engine/runtime/dispatch/dispatch.ts';
import { PROTOCOL_VERSION, encode } from '../mesh/wire/index.ts';

describe('replies go to inboxes only', () => {
  it('a worker process does not answer a call whose reply subject is the results stream’s, and still answers real ones', async () => {
    await withWorkers(1, 'replies', async ({ nc, subj, d }) => {
      const written: string[] = [];
      const sub = nc.subscribe(subj.allResults, {
        callback: (_e, msg) => {
          written.push(msg.subject);
        },
      });
      const call = { type: 'call', v: PROTOCOL_VERSION, id: 'forged-1', model: '*', iteration: 0, epoch: 0, body: { fn: 'stats' } };
      nc.publish(subj.call(0), encode(call), { reply: subj.results(0, 'rollout') });
      // Malformed bytes with the same reply subject: not answered either.
      nc.publish(subj.call(0), new Uint8Array([1, 2, 3]), { reply: subj.results(0, 'scored') });
      await nc.flush();
      await new Promise((r) => setTimeout(r, 1500));
      expect(written).toEqual([]);
      sub.unsubscribe();
      const stats = await d.call(0, '*', 0, { fn: 'stats' });
      expect(stats).toBeDefined();
    });
  }, 90_000);
});

describe('exchange ids', () => {
  it('carry 64 random bits after their readable stem', () => {
    const a = exchangeId('ckpt-0-actor-3');
    expect(a).toMatch(/^ckpt-0-actor-3-[0-9a-f]{16}$/);
    expect(exchangeId('ckpt-0-actor-3')).not.toBe(a);
  });
});
