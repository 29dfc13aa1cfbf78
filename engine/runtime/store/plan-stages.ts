// Stage results belong to the plan that computed them. A call's outputs (a rollout, log-probs,
// values, scores), an environment's recorded answers and a free-running run's written-ahead
// schedule are kept so that a recovery on the same plan reads them back instead of computing them
// again: there, computing them again would give the same bits. A re-plan changes the layouts, and
// with them the order of every reduction: what the old plan computed past the snapshot the run
// goes back to is not what the new plan computes. Read back, it would make the run depend on which
// calls happened to end before the loss, a run no one can state, let alone repeat. So each plan
// keeps its own records, under its number (0: the scenario's plan; n: after the n-th re-plan that
// changed it), and a plan reads only its own: a run that re-planned goes on exactly as the run
// stopped at that snapshot and resumed on the new plan (--resume) does.
import type { RunStore } from './store.ts';

/** What an iteration keeps and reads back of its stages. */
export type StageRecords = Pick<RunStore, 'loadStage' | 'saveStage'>;

/** The name plan `plan` keeps a stage under: the scenario's plan, the stage's own name. */
export const stageOnPlan = (stage: string, plan: number): string => (plan === 0 ? stage : `plan${plan}-${stage}`);

/** The stage records of plan number `plan`: it reads only what it wrote. */
export function stagesOfPlan(store: StageRecords, plan: number): StageRecords {
  return {
    saveStage: (iteration, stage, value) => store.saveStage(iteration, stageOnPlan(stage, plan), value),
    loadStage: (iteration, stage) => store.loadStage(iteration, stageOnPlan(stage, plan)),
  };
}

/**
 * Each iteration's record of a stage as the run last computed it, for accounting what was trained
 * once a run is done: the newest plan's, up to plan `plan`. A plan computes every iteration from
 * the one after its snapshot on, so the newest plan that has a record of an iteration is the one
 * that trained it.
 */
export function trainedStages(store: Pick<RunStore, 'loadStage'>, plan: number): Pick<RunStore, 'loadStage'> {
  return {
    loadStage: async <T>(iteration: number, stage: string) => {
      for (let p = plan; p >= 0; p--) {
        const found = await store.loadStage<T>(iteration, stageOnPlan(stage, p));
        if (found !== undefined) return found;
      }
      return undefined;
    },
  };
}
