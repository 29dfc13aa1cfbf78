import { describe, expect, it } from 'vitest';
import { stagesOfPlan, trainedStages } from './plan-stages.ts';
import { MemoryStore } from './store.ts';

describe('stage records by plan', () => {
  it('a plan reads only what it wrote; the scenario’s plan keeps the stage’s own name', async () => {
    const store = new MemoryStore();
    const [first, second] = [stagesOfPlan(store, 0), stagesOfPlan(store, 1)];
    await first.saveStage(3, 'actor__generate', { on: 0 });
    expect(await store.loadStage(3, 'actor__generate')).toEqual({ on: 0 });
    expect(await second.loadStage(3, 'actor__generate')).toBeUndefined();
    await second.saveStage(3, 'actor__generate', { on: 1 });
    expect(await second.loadStage(3, 'actor__generate')).toEqual({ on: 1 });
    expect(await first.loadStage(3, 'actor__generate')).toEqual({ on: 0 });
  });

  it('what trained an iteration is the newest plan’s record of it', async () => {
    const store = new MemoryStore();
    // Plan 0 ran iterations 0-2 (2 was cut short by a loss); plan 1 went back to 1's snapshot and ran 2-3.
    for (const i of [0, 1, 2]) await stagesOfPlan(store, 0).saveStage(i, 's', { plan: 0 });
    for (const i of [2, 3]) await stagesOfPlan(store, 1).saveStage(i, 's', { plan: 1 });
    const trained = trainedStages(store, 1);
    expect(await Promise.all([0, 1, 2, 3, 4].map((i) => trained.loadStage(i, 's')))).toEqual([{ plan: 0 }, { plan: 0 }, { plan: 1 }, { plan: 1 }, undefined]);
  });
});
