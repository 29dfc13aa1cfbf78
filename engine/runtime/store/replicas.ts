// Data-parallel replicas hold the same state (gradients all-reduced in a fixed order, the same
// optimizer steps), so a checkpoint keeps each once: the ranks that share a checkpoint are
// written as one entry and an index per rank, and read back as one record per rank again.
import type { Checkpoint } from '../../../mesh/wire/index.ts';
import type { CheckpointSet } from '../run/setup.ts';

export class ReplicaError extends Error {
  override name = 'ReplicaError';
}

/** The set as a file keeps it: each distinct checkpoint once, and which one each rank holds. */
export function packReplicas(set: CheckpointSet): { models: CheckpointSet; replicas?: Record<string, number[]> } {
  const models: CheckpointSet = {};
  const replicas: Record<string, number[]> = {};
  let shared = false;
  for (const [model, ranks] of Object.entries(set)) {
    const kept: Checkpoint[] = [];
    replicas[model] = ranks.map((c) => {
      const at = kept.indexOf(c);
      if (at >= 0) {
        shared = true;
        return at;
      }
      return kept.push(c) - 1;
    });
    models[model] = kept;
  }
  return shared ? { models, replicas } : { models: set };
}

/** One checkpoint per rank again; `where` names the file in an error. */
export function unpackReplicas(models: CheckpointSet, replicas: Record<string, number[]> | undefined, where: string): CheckpointSet {
  if (!replicas) return models;
  const out: CheckpointSet = {};
  for (const [model, kept] of Object.entries(models)) {
    const index = replicas[model];
    if (!index) {
      out[model] = kept;
      continue;
    }
    out[model] = index.map((i, rank) => {
      const c = kept[i];
      if (!c) throw new ReplicaError(`${where}: rank ${rank} of '${model}' holds checkpoint ${i}; the file has ${kept.length} for it`);
      return c;
    });
  }
  for (const model of Object.keys(replicas)) if (!(model in models)) throw new ReplicaError(`${where}: replicas name '${model}', which the file holds no checkpoint of`);
  return out;
}
