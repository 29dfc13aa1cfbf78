// What the planner knows of models and hardware, from public specifications. Nothing here is
// tuned to reproduce a published result; the two efficiency factors are stated assumptions
// (sustained fraction of peak for large matrix products and for memory streaming) and apply to
// every strategy alike.

/** A decoder-only transformer's shape. */
export interface ModelShape {
  name: string;
  layers: number;
  width: number;
  /** Hidden size of the MLP. */
  ffn: number;
  heads: number;
  /** Key/value heads (grouped-query attention when fewer than `heads`). */
  kvHeads: number;
  vocab: number;
  /** Gated MLP (LLaMA's SwiGLU: three matrices) or plain (two). */
  gated: boolean;
  /** Bytes per parameter and activation element: 2 for bf16, 4 for float32. */
  dtypeBytes: number;
  /**
   * A model with LoRA adapters (docs/lora.md): the share of its parameters that train — what the
   * optimizer holds moments for, and, once the base is where it goes, what a view's fill moves and
   * a snapshot writes. Absent: 1 (every parameter trains).
   */
  trainedShare?: number;
}

/**
 * LLaMA-2 shapes (Touvron et al. 2023); 34B and 70B use grouped-query attention with 8 KV heads.
 * Qwen2.5-7B (its config.json: 28 layers, hidden 3584, MLP 18944, 28 heads with 4 KV heads,
 * 152,064 tokens) is the base of the 7B reasoning models that long-tail RL trains (DeepSeek-R1's
 * Qwen-7B distillation, which AReaL's 7B runs start from).
 */
export const MODELS: Record<string, ModelShape> = {
  'llama2-7b': { name: 'llama2-7b', layers: 32, width: 4096, ffn: 11008, heads: 32, kvHeads: 32, vocab: 32000, gated: true, dtypeBytes: 2 },
  'llama2-13b': { name: 'llama2-13b', layers: 40, width: 5120, ffn: 13824, heads: 40, kvHeads: 40, vocab: 32000, gated: true, dtypeBytes: 2 },
  'llama2-34b': { name: 'llama2-34b', layers: 48, width: 8192, ffn: 22016, heads: 64, kvHeads: 8, vocab: 32000, gated: true, dtypeBytes: 2 },
  'llama2-70b': { name: 'llama2-70b', layers: 80, width: 8192, ffn: 28672, heads: 64, kvHeads: 8, vocab: 32000, gated: true, dtypeBytes: 2 },
  'qwen2.5-7b': { name: 'qwen2.5-7b', layers: 28, width: 3584, ffn: 18944, heads: 28, kvHeads: 4, vocab: 152064, gated: true, dtypeBytes: 2 },
};

/** ferry's own small GPT (engine/model.ts) as a shape: float32, plain 4× MLP. */
export function localShape(name: string, vocab: number, layers: number, width: number, heads: number, arch: { ffn?: number; kvHeads?: number; gated?: boolean } = {}): ModelShape {
  return { name, layers, width, ffn: arch.ffn ?? 4 * width, heads, kvHeads: arch.kvHeads ?? heads, vocab, gated: arch.gated ?? false, dtypeBytes: 4 };
}

/** A device and the links between devices. Rates are sustained, in bytes or FLOP per second. */
export interface DeviceProfile {
  name: string;
  /** Sustained FLOP/s of large matrix products. */
  flops: number;
  /** Sustained memory bandwidth, bytes/s (decoding reads every weight once per token). */
  memBandwidth: number;
  memoryBytes: number;
  /** Per-device bandwidth to devices of the same node, and to other nodes, bytes/s. */
  intraBandwidth: number;
  interBandwidth: number;
  /** Fixed cost of one message or collective step, seconds (the α of an α–β model). */
  latency: number;
  /** Fixed cost per layer per pass (kernel launches, framework overhead), seconds. */
  layerOverhead: number;
  /** Fixed cost of one call (dispatch, the reply, the caller's share of the work), seconds. */
  callOverhead?: number;
  /**
   * Seconds per activation element of a layer pass (a token's width, per layer and per rank): the
   * memory-bound element-wise work that dominates CPU backends at small widths; 0 unless fitted.
   */
  elementSeconds?: number;
  /** A training step's element-wise work over a forward pass's; 3 unless fitted. */
  trainElementFactor?: number;
  /** The fixed cost per layer of one decoding step, where it differs from a pass's (fitted locally). */
  decodeLayerOverhead?: number;
  /**
   * The fixed cost of one decoding step beyond its layers: sampling, reading the logits back, the
   * step's masks (fitted locally; 0 unless fitted).
   */
  decodeStepOverhead?: number;
  /**
   * A training step's FLOPs over a forward pass's: 3 where backward costs twice the forward (the
   * usual count for large matrix products); fitted for the local machine.
   */
  trainFactor?: number;
  /** The same for the fixed per-layer costs (kernel launches, framework overhead); 3 unless fitted. */
  trainPassFactor?: number;
  /**
   * The fixed cost per layer of a training step's pass (forward, backward and the optimizer's
   * update of the layer's weights, whatever the rows), where it is fitted on its own (locally:
   * inference may show no fixed cost per layer, training does). Absent: trainPassFactor ×
   * layerOverhead.
   */
  trainLayerOverhead?: number;
  /**
   * Generation recomputes the whole prefix for every new token (no KV cache). Neither ferry's
   * runtime (engine/model/kv-cache.ts) nor GPU serving engines do; it prices a runtime that does.
   */
  recomputeDecode?: boolean;
  /**
   * Devices that share processors: when set, at most this many calls compute at full speed at
   * once (the local machine runs several worker processes on few cores). Absent for GPUs.
   */
  sharedCores?: number;
  /**
   * With sharedCores: how much slower each of two calls runs when they compute at once than one
   * alone (the cores' shared caches and memory, and the processes around them); 1 unless fitted.
   */
  parallelSlowdown?: number;
  /**
   * The rate at which checkpoints reach the supervisor over the bus, bytes/s: every rank of every
   * kept model streams its shard to it after each checkpointed iteration. Absent: checkpoints are
   * not priced (the cluster profiles describe devices, not the bus a run's supervisor listens on).
   */
  busBandwidth?: number;
  /**
   * A snapshot's fixed seconds (`npm run profile` times them on this machine's private server,
   * which syncs every write): a device's write into its bucket (the object's chunks, its metadata
   * and the old object's purge, each acknowledged) and the supervisor's write of the manifest to the
   * run's store. Absent: two call overheads.
   */
  storeLatency?: number;
  /** The rate at which one device writes its snapshot objects into its bucket, bytes/s. Absent: busBandwidth. */
  storeBandwidth?: number;
  /**
   * Seconds the generating device waits for an environment's answer that takes the environment no
   * time (a reset or a step of an episode over the bus, as `npm run profile` times them against an
   * environment that answers at once). Absent: a round trip, two latencies.
   */
  envAnswerSeconds?: number;
  /**
   * The speed probe's seconds when the profile was fitted (`npm run profile`): a fixed set of
   * calls, timed again later to see how much faster or slower the machine runs now.
   */
  probeSeconds?: number;
  /** Where the numbers come from. */
  source: string;
}

/**
 * The profile of the same machine running `factor` times as long (a shared machine's speed
 * drifts): every time it prices is multiplied by `factor`, every rate divided by it.
 */
export function scaledProfile(dev: DeviceProfile, factor: number): DeviceProfile {
  const t = (x: number | undefined) => (x === undefined ? undefined : x * factor);
  const r = (x: number) => x / factor;
  const out: DeviceProfile = {
    ...dev,
    flops: r(dev.flops),
    memBandwidth: r(dev.memBandwidth),
    intraBandwidth: r(dev.intraBandwidth),
    interBandwidth: r(dev.interBandwidth),
    latency: dev.latency * factor,
    layerOverhead: dev.layerOverhead * factor,
  };
  for (const k of ['callOverhead', 'elementSeconds', 'decodeLayerOverhead', 'decodeStepOverhead', 'trainLayerOverhead', 'storeLatency', 'envAnswerSeconds'] as const)
    if (dev[k] !== undefined) out[k] = t(dev[k]);
  for (const k of ['busBandwidth', 'storeBandwidth'] as const) if (dev[k] !== undefined) out[k] = r(dev[k]);
  return out;
}

/** Sustained fractions of peak (assumptions, applied to every plan alike). */
const MATMUL_EFFICIENCY = 0.5;
const STREAM_EFFICIENCY = 0.8;

/**
 * A100-80GB SXM: 312 TFLOP/s dense bf16, ~2.0 TB/s HBM2e, 600 GB/s NVLink (all directions), nodes
 * of 8 with 200 Gb/s per GPU between nodes. H100-80GB SXM: ~989 TFLOP/s, 3.35 TB/s, 900 GB/s.
 */
export const DEVICES: Record<string, DeviceProfile> = {
  'a100-80gb': {
    name: 'a100-80gb',
    flops: 312e12 * MATMUL_EFFICIENCY,
    memBandwidth: 2.0e12 * STREAM_EFFICIENCY,
    memoryBytes: 80e9,
    intraBandwidth: (600e9 / 2) * STREAM_EFFICIENCY,
    interBandwidth: (200e9 / 8) * STREAM_EFFICIENCY,
    latency: 10e-6,
    layerOverhead: 20e-6,
    source: 'NVIDIA A100 datasheet (SXM 80GB); 200 Gb/s per GPU between nodes',
  },
  'h100-80gb': {
    name: 'h100-80gb',
    flops: 989e12 * MATMUL_EFFICIENCY,
    memBandwidth: 3.35e12 * STREAM_EFFICIENCY,
    memoryBytes: 80e9,
    intraBandwidth: (900e9 / 2) * STREAM_EFFICIENCY,
    interBandwidth: (200e9 / 8) * STREAM_EFFICIENCY,
    latency: 10e-6,
    layerOverhead: 15e-6,
    source: 'NVIDIA H100 datasheet (SXM 80GB); 200 Gb/s per GPU between nodes',
  },
};

export const DEVICE_NAMES = ['local', ...Object.keys(DEVICES)] as const;
