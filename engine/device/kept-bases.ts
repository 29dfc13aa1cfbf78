// Frozen bases kept beside released views. A model with LoRA adapters trains its adapters alone:
// the base a view of it was filled with is the same at the next iteration, so a device keeps it
// when the view is released and gives it to the view's next load, which then needs only the
// adapters moved. Never assumed: a base is kept under the digest of its owner's base (which the
// supervisor reads from the owner before every fill), for one layout and rank, and given back only
// to a load naming that same digest, and only while the kept bytes still hash as they did.
import type { NamedTensor } from '../../mesh/wire/index.ts';
import { modelDigest } from '../../mesh/wire/index.ts';
import { layoutKey, sliceShape, type Layout } from '../../mesh/parallel/index.ts';
import { trains, type GptRank } from '../model/index.ts';

interface KeptBase {
  layout: string;
  rank: number;
  /** The owner's base digest the view was filled from. */
  tag: string;
  /** The kept bytes' own digest, checked again when they are given back. */
  digest: string;
  tensors: NamedTensor[];
}

/** The parameters of a shard that do not train: with adapters, the base (and a policy's head). */
export function frozenNames(shard: GptRank): string[] {
  return shard.weights.parameterNames().filter((n) => !trains(shard.spec, n));
}

/** This shard's frozen slices, copied out, in parameter order. */
export function frozenTensors(shard: GptRank): NamedTensor[] {
  return slicesWhere(shard, (name) => !trains(shard.spec, name));
}

/** This shard's slices of the parameters `wanted` names, copied out, in parameter order. */
export function slicesWhere(shard: GptRank, wanted: (name: string) => boolean): NamedTensor[] {
  return shard.weights.slices.filter((s) => wanted(s.name)).map((s) => ({ name: s.name, shape: sliceShape(s), data: shard.weights.exportTensor(s.name) }));
}

export class KeptBases {
  private readonly kept = new Map<string, KeptBase>();

  /** Keeps the frozen base of a view being released, under its owner's base digest `tag`. */
  keep(model: string, shard: GptRank, layout: Layout, rank: number, tag: string): void {
    if (!shard.spec.lora) return;
    const tensors = frozenTensors(shard);
    this.kept.set(model, { layout: layoutKey(layout), rank, tag, digest: modelDigest(tensors), tensors });
  }

  /**
   * Gives a kept base to a new shard of the same view: true when it was kept for this layout and
   * rank under `tag` and its bytes hash as they did; the entry goes either way.
   */
  give(model: string, shard: GptRank, layout: Layout, rank: number, tag: string): boolean {
    const k = this.kept.get(model);
    this.kept.delete(model);
    if (!k || !shard.spec.lora || k.layout !== layoutKey(layout) || k.rank !== rank || k.tag !== tag) return false;
    const names = frozenNames(shard);
    if (names.length !== k.tensors.length || names.some((n, i) => k.tensors[i]!.name !== n)) return false;
    if (modelDigest(k.tensors) !== k.digest) return false;
    shard.weights.importTensors(k.tensors);
    return true;
  }

  drop(model: string): void {
    this.kept.delete(model);
  }

  clear(): void {
    this.kept.clear();
  }

  /** Bytes kept, for the device's memory accounting. */
  get bytes(): number {
    let n = 0;
    for (const k of this.kept.values()) for (const t of k.tensors) n += t.data.byteLength;
    return n;
  }
}
