import { describe, expect, it } from 'vitest';
import { NextViews, copyOf } from './next-views.ts';

/** A view that records its release. */
const view = (name: string, released: string[]) => ({ name, release: async () => void released.push(name) });

describe("the next version's views", () => {
  it('are taken by the iteration of their version, in the epoch and plan they were filled for', async () => {
    const released: string[] = [];
    const views = new NextViews<ReturnType<typeof view>>();
    const plan = {};
    views.prepare('actor.gen', 3, 0, plan, async () => view('v3', released));
    expect(await views.take('actor.gen', 3, 0, plan).view).toMatchObject({ name: 'v3' });
    expect(views.size).toBe(0);
    expect(released).toEqual([]);
    expect(views.take('actor.gen', 3, 0, plan)).toEqual({});
  });

  it('one filled for another version or plan is released, not taken; one of an earlier epoch comes back stale, with its plan, for the caller to release', async () => {
    const released: string[] = [];
    const views = new NextViews<ReturnType<typeof view>>();
    const plan = {};
    views.prepare('g', 2, 0, plan, async () => view('v2', released));
    expect(views.take('g', 3, 0, plan)).toEqual({});
    views.prepare('g', 3, 0, plan, async () => view('v3', released));
    expect(views.take('g', 3, 0, {})).toEqual({});
    views.prepare('g', 4, 0, plan, async () => view('v4', released));
    const { view: taken, stale } = views.take('g', 4, 1, plan);
    expect(taken).toBeUndefined();
    expect(stale!.plan).toBe(plan);
    expect(await stale!.view).toMatchObject({ name: 'v4' });
    await new Promise((r) => setTimeout(r, 0));
    expect(released).toEqual(['v2', 'v3']);
  });

  it('a second prepare releases the first; clear releases all; a fill that failed releases nothing and throws nothing there', async () => {
    const released: string[] = [];
    const views = new NextViews<ReturnType<typeof view>>();
    views.prepare('a', 1, 0, {}, async () => view('a1', released));
    views.prepare('a', 2, 0, {}, async () => view('a2', released));
    views.prepare('b', 2, 0, {}, async () => {
      throw new Error('device lost');
    });
    await views.clear();
    expect(released.sort()).toEqual(['a1', 'a2']);
    expect(views.size).toBe(0);
  });

  it('alternate copies by the parity of the version', () => {
    expect([0, 1, 2, 3].map(copyOf)).toEqual([0, 1, 0, 1]);
  });
});
