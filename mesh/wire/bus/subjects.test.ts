import { describe, it, expect } from 'vitest';
import { SubjectError, runId, senderOf, subjects, token } from './subjects.ts';

describe('token', () => {
  it('accepts letters, digits, - and _ and numbers', () => {
    expect(token('run id', 'a-B_9')).toBe('a-B_9');
    expect(token('device', 12)).toBe('12');
  });

  it.each([
    ['a.b', 'dot'],
    ['a b', 'space'],
    ['a\tb', 'tab'],
    ['*', 'wildcard *'],
    ['a>', 'wildcard >'],
    ['', 'empty'],
    ['ü', 'non-ASCII letter'],
  ])('rejects %j (%s) with a SubjectError naming the kind and the value', (value) => {
    let error: unknown;
    try {
      token('transfer id', value);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(SubjectError);
    const message = (error as Error).message;
    expect((error as Error).name).toBe('SubjectError');
    expect(message).toContain('transfer id must be letters, digits');
    expect(message).toContain(`got ${JSON.stringify(value)}`);
  });

  it('rejects a fractional device number (its dot would split the subject)', () => {
    expect(() => token('device', 1.5)).toThrow(SubjectError);
    // '-1' is a valid token character-wise; it is kept, not silently altered.
    expect(token('device', -1)).toBe('-1');
  });
});

describe('subjects', () => {
  const s = subjects('run-1');

  it('builds every subject under ferry.<run>', () => {
    expect(s.root).toBe('ferry.run-1');
    expect(s.join).toBe('ferry.run-1.join');
    expect(s.call(3)).toBe('ferry.run-1.dev.3.call');
    expect(s.heartbeat(0)).toBe('ferry.run-1.hb.0');
    expect(s.heartbeats).toBe('ferry.run-1.hb.*');
    // A transfer's chunks and receipts, and collectives, each on its sender's own subject.
    expect(s.chunks('t-7', 2)).toBe('ferry.run-1.xfer.t-7.chunk.2');
    expect(s.chunks('t-7', 'supervisor')).toBe('ferry.run-1.xfer.t-7.chunk.supervisor');
    expect(s.receipts('t-7', 1)).toBe('ferry.run-1.xfer.t-7.receipt.1');
    expect([s.transferChunks('t-7'), s.transferReceipts('t-7')]).toEqual(['ferry.run-1.xfer.t-7.chunk.*', 'ferry.run-1.xfer.t-7.receipt.*']);
    expect([s.chunksFrom(2), s.receiptsFrom('supervisor')]).toEqual(['ferry.run-1.xfer.*.chunk.2', 'ferry.run-1.xfer.*.receipt.supervisor']);
    expect([senderOf(s.chunks('t-7', 2)), senderOf(s.receipts('t-7', 'supervisor')), senderOf(s.collective(3, 0)), senderOf(s.join)]).toEqual([2, 'supervisor', 0, undefined]);
    expect(s.ready('r-7')).toBe('ferry.run-1.realloc.r-7.ready');
    expect(s.go('r-7')).toBe('ferry.run-1.realloc.r-7.go');
    expect(s.collective(3, 1)).toBe('ferry.run-1.coll.3.1');
    expect([s.collectivesTo(3), s.collectivesFrom(1)]).toEqual(['ferry.run-1.coll.3.*', 'ferry.run-1.coll.*.1']);
    expect(s.event('done')).toBe('ferry.run-1.events.done');
    expect(s.events).toBe('ferry.run-1.events.>');
    // The wildcards that permissions (auth.ts) and subscribers use.
    expect([s.calls, s.allChunks, s.allReady, s.allGo, s.collectives]).toEqual([
      'ferry.run-1.dev.*.call',
      'ferry.run-1.xfer.*.chunk.*',
      'ferry.run-1.realloc.*.ready',
      'ferry.run-1.realloc.*.go',
      'ferry.run-1.coll.*.*',
    ]);
  });

  it('has exactly the documented keys', () => {
    expect(Object.keys(s).sort()).toEqual([
      'allChunks',
      'allGo',
      'allReady',
      'allReceipts',
      'allResults',
      'allSamples',
      'allTurns',
      'call',
      'calls',
      'chaos',
      'chunks',
      'chunksFrom',
      'collective',
      'collectives',
      'collectivesFrom',
      'collectivesTo',
      'cordon',
      'event',
      'events',
      'go',
      'heartbeat',
      'heartbeats',
      'join',
      'joinAs',
      'joins',
      'ready',
      'receipts',
      'receiptsFrom',
      'results',
      'root',
      'samples',
      'supervisorBeat',
      'transferChunks',
      'transferReceipts',
      'turns',
    ]);
  });

  it('rejects a run id that would change the subject hierarchy', () => {
    expect(() => subjects('a.b')).toThrow(/run id must be letters/);
    expect(() => subjects('>')).toThrow(SubjectError);
  });

  it('rejects bad parts of per-device and per-transfer subjects', () => {
    expect(() => s.chunks('x.y', 0)).toThrow(/transfer id/);
    expect(() => s.ready('*')).toThrow(/reallocation id/);
    expect(() => s.call(0.5)).toThrow(/device/);
  });

  it('heartbeats matches every heartbeat subject and only those (NATS wildcard semantics)', () => {
    const matches = (pattern: string, subject: string) => {
      const p = pattern.split('.');
      const t = subject.split('.');
      return p.length === t.length && p.every((x, i) => x === '*' || x === t[i]);
    };
    expect(matches(s.heartbeats, s.heartbeat(0))).toBe(true);
    expect(matches(s.heartbeats, s.heartbeat(17))).toBe(true);
    expect(matches(s.heartbeats, s.call(0))).toBe(false);
    expect(matches(s.heartbeats, subjects('other').heartbeat(0))).toBe(false);
  });
});

describe('runId', () => {
  const at = new Date('2026-11-21T07:16:22.345Z');

  it('is the name, a dash and a compact UTC stamp', () => {
    expect(runId('quickstart', at)).toBe('quickstart-20261121-071622');
  });

  it('replaces runs of unsafe characters by one dash and trims dashes', () => {
    expect(runId('my scenario.v2', at)).toBe('my-scenario-v2-20261121-071622');
    expect(runId('  a..b**c  ', at)).toBe('a-b-c-20261121-071622');
    expect(runId('--x--', at)).toBe('x-20261121-071622');
  });

  it('falls back to "run" when nothing usable is left', () => {
    expect(runId('', at)).toBe('run-20261121-071622');
    expect(runId('...', at)).toBe('run-20261121-071622');
  });

  it('always yields a valid subject token', () => {
    for (const name of ['a b', 'ü', 'x.y.z', '*>', 'ok_name']) {
      const id = runId(name, at);
      expect(token('run id', id)).toBe(id);
      expect(() => subjects(id)).not.toThrow();
    }
  });
});
