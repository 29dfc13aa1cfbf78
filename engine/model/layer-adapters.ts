// A rank's LoRA adapters as its blocks read them (engine/adapters names them; blocks.ts computes
// with them): each adapted matrix's A and B, this rank's slices, and a switch that turns them all
// off for a call of the base alone (a reference that is the policy's base).
import type { AdapterOf } from '../adapters/index.ts';
import { adapterMap } from '../adapters/index.ts';
import type { Adapter, MlpAdapters } from './blocks.ts';
import type { AttnWeights } from './gpt.ts';
import { archOf, type GptSpec } from './params.ts';
import type { ShardWeights } from './weights.ts';

export class LayerAdapters {
  /** Each adapted matrix's adapter, by the matrix's name; empty without adapters. */
  private readonly byMatrix: Map<string, AdapterOf>;
  /** During a call of the base alone: the adapters are off. */
  private off = false;

  constructor(
    spec: GptSpec,
    private readonly weights: ShardWeights,
  ) {
    this.byMatrix = spec.lora ? adapterMap(archOf(spec).family, spec.layers, spec.lora) : new Map();
  }

  /** The adapter of layer l's matrix `part` (attn.wq, mlp.w1, …), if it has one and they are on. */
  of(l: number, part: string): Adapter | undefined {
    if (this.off) return undefined;
    const ad = this.byMatrix.get(`h${l}.${part}`);
    return ad && { a: this.weights.get(ad.a), b: this.weights.get(ad.b), scale: ad.scale, aName: ad.a, bName: ad.b };
  }

  /** Layer l's attention adapters, or none. */
  attn(l: number): AttnWeights['lora'] {
    if (!this.byMatrix.size) return undefined;
    return { wq: this.of(l, 'attn.wq'), wk: this.of(l, 'attn.wk'), wv: this.of(l, 'attn.wv'), wo: this.of(l, 'attn.wo') };
  }

  /** Layer l's MLP adapters. */
  mlp(l: number): MlpAdapters {
    if (!this.byMatrix.size) return {};
    return { w1: this.of(l, 'mlp.w1'), w2: this.of(l, 'mlp.w2'), w3: this.of(l, 'mlp.w3') };
  }

  /** Runs `f` with the adapters off when `base` says so, and on again after, whatever happens. */
  async withBase<T>(base: boolean, f: () => Promise<T>): Promise<T> {
    this.off = base;
    try {
      return await f();
    } finally {
      this.off = false;
    }
  }
}
