import { describe, expect, it } from 'vitest';
import { abnormal, describeExit, Intensity, restarts, toRestart, type Exit } from './supervision.ts';

const normal: Exit = { code: 0, signal: null };
const crashed: Exit = { code: 1, signal: null };
const killed: Exit = { code: null, signal: 'SIGKILL' };

describe('abnormal', () => {
  it('is false only for code 0 without a signal', () => {
    expect(abnormal(normal)).toBe(false);
    expect(abnormal(crashed)).toBe(true);
    expect(abnormal({ code: 137, signal: null })).toBe(true);
    expect(abnormal(killed)).toBe(true);
    // A signal makes the exit abnormal even with a code of 0.
    expect(abnormal({ code: 0, signal: 'SIGTERM' })).toBe(true);
  });
});

describe('restarts', () => {
  it('permanent restarts after every exit', () => {
    expect(restarts('permanent', normal)).toBe(true);
    expect(restarts('permanent', crashed)).toBe(true);
    expect(restarts('permanent', killed)).toBe(true);
  });

  it('transient restarts only after an abnormal exit', () => {
    expect(restarts('transient', normal)).toBe(false);
    expect(restarts('transient', crashed)).toBe(true);
    expect(restarts('transient', { code: 2, signal: null })).toBe(true);
    expect(restarts('transient', killed)).toBe(true);
    expect(restarts('transient', { code: null, signal: 'SIGSEGV' })).toBe(true);
  });

  it('temporary never restarts', () => {
    expect(restarts('temporary', normal)).toBe(false);
    expect(restarts('temporary', crashed)).toBe(false);
    expect(restarts('temporary', killed)).toBe(false);
  });
});

describe('toRestart', () => {
  const children = ['a', 'b', 'c', 'd'] as const;

  it('one_for_one restarts the dead child alone', () => {
    expect(toRestart('one_for_one', children, 'a')).toEqual(['a']);
    expect(toRestart('one_for_one', children, 'c')).toEqual(['c']);
  });

  it('one_for_all restarts every child, in start order', () => {
    expect(toRestart('one_for_all', children, 'c')).toEqual(['a', 'b', 'c', 'd']);
    expect(toRestart('one_for_all', children, 'a')).toEqual(['a', 'b', 'c', 'd']);
  });

  it('rest_for_one restarts the dead child and those started after it, in order', () => {
    expect(toRestart('rest_for_one', children, 'a')).toEqual(['a', 'b', 'c', 'd']);
    expect(toRestart('rest_for_one', children, 'b')).toEqual(['b', 'c', 'd']);
    expect(toRestart('rest_for_one', children, 'd')).toEqual(['d']);
  });

  it("gives a copy, not the caller's array", () => {
    const list = ['x', 'y'];
    const out = toRestart('one_for_all', list, 'y');
    expect(out).toEqual(list);
    expect(out).not.toBe(list);
    out.push('z');
    expect(list).toEqual(['x', 'y']);
  });

  it('restarts nothing for a dead child that is not in the list', () => {
    for (const strategy of ['one_for_one', 'one_for_all', 'rest_for_one'] as const) {
      expect(toRestart(strategy, children as readonly string[], 'z')).toEqual([]);
      expect(toRestart(strategy, [] as string[], 'a')).toEqual([]);
    }
  });

  it('compares children by identity', () => {
    const a = { pid: 1 };
    const b = { pid: 2 };
    expect(toRestart('rest_for_one', [a, b], b)).toEqual([b]);
    expect(toRestart('one_for_one', [a, b], { pid: 2 })).toEqual([]);
  });
});

describe('Intensity', () => {
  it('allows exactly `intensity` failures within the period and escalates on the next', () => {
    const limit = new Intensity(3, 10);
    expect(limit.record({ at: 1_000, actor: 'device 0', reason: 'killed by SIGKILL' })).toBeUndefined();
    expect(limit.record({ at: 2_000, actor: 'device 1', reason: 'no heartbeat' })).toBeUndefined();
    expect(limit.record({ at: 3_000, actor: 'supervisor', reason: 'exited with code 1' })).toBeUndefined();
    const message = limit.record({ at: 4_000, actor: 'device 2', reason: 'killed by SIGSEGV' });
    expect(message).toBeDefined();
    expect(message).toContain('device 2 failed');
    expect(message).toContain('4 failures within 10 s');
    expect(message).toContain('supervision.intensity allows 3');
    expect(message).toContain('Last failures:');
    expect(message).toContain('device 0: killed by SIGKILL');
    expect(message).toContain('device 1: no heartbeat');
    expect(message).toContain('supervisor: exited with code 1');
    expect(message).toContain('device 2: killed by SIGSEGV');
    // The failures are listed oldest first.
    expect(message!.indexOf('device 0:')).toBeLessThan(message!.indexOf('device 2:'));
    expect(limit.count).toBe(4);
  });

  it('escalates on the very first failure when intensity is 0', () => {
    const limit = new Intensity(0, 60);
    const message = limit.record({ at: 5, actor: 'w', reason: 'r' });
    expect(message).toContain('w failed');
    expect(message).toContain('1 failures within 60 s');
    expect(message).toContain('allows 0');
  });

  it('does not count failures older than the period', () => {
    const limit = new Intensity(2, 5);
    expect(limit.record({ at: 0, actor: 'a', reason: 'old' })).toBeUndefined();
    expect(limit.record({ at: 1_000, actor: 'b', reason: 'old too' })).toBeUndefined();
    // 5 s and more later: both are out of the window, so two more are allowed.
    expect(limit.record({ at: 6_000, actor: 'c', reason: 'new' })).toBeUndefined();
    expect(limit.record({ at: 6_500, actor: 'd', reason: 'new' })).toBeUndefined();
    const message = limit.record({ at: 7_000, actor: 'e', reason: 'third' });
    expect(message).toContain('3 failures within 5 s');
    expect(message).not.toContain('a: old');
    expect(message).not.toContain('b: old too');
    expect(message).toContain('c: new');
    expect(limit.count).toBe(5);
  });

  it('treats a failure exactly one period old as outside the window', () => {
    const limit = new Intensity(1, 2);
    expect(limit.record({ at: 0, actor: 'a', reason: 'x' })).toBeUndefined();
    expect(limit.record({ at: 2_000, actor: 'b', reason: 'y' })).toBeUndefined();
    expect(limit.record({ at: 2_001, actor: 'c', reason: 'z' })).toContain('2 failures within 2 s');
  });

  it('lists only the last five failures', () => {
    const limit = new Intensity(1, 100);
    let message: string | undefined;
    for (let i = 0; i < 8; i++) message = limit.record({ at: i, actor: `w${i}`, reason: `r${i}` });
    expect(message).toContain('8 failures within 100 s');
    const listed = message!
      .split('Last failures:\n')[1]!
      .split('\n')
      .map((l) => l.trim());
    expect(listed).toEqual(['w3: r3', 'w4: r4', 'w5: r5', 'w6: r6', 'w7: r7']);
  });

  it('keeps escalating while the window stays over the limit', () => {
    const limit = new Intensity(1, 10);
    limit.record({ at: 0, actor: 'a', reason: 'x' });
    expect(limit.record({ at: 1, actor: 'a', reason: 'x' })).toBeDefined();
    expect(limit.record({ at: 2, actor: 'a', reason: 'x' })).toContain('3 failures');
  });
});

describe('describeExit', () => {
  it('names the signal when there is one, else the code', () => {
    expect(describeExit(killed)).toBe('killed by SIGKILL');
    expect(describeExit({ code: 0, signal: 'SIGTERM' })).toBe('killed by SIGTERM');
    expect(describeExit(crashed)).toBe('exited with code 1');
    expect(describeExit(normal)).toBe('exited with code 0');
  });
});
