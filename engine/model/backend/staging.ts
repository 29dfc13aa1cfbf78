// New weights written in place. A reallocation's receiver used to assemble each new slice in a
// JavaScript array and then import it into the backend, holding the new shard twice; here the
// slices are allocated in the backend first and each chunk is written straight into the memory the
// backend will compute from. Where a backend keeps its memory out of the host's reach (WebGL,
// libtensorflow), the slices are assembled on the host and imported once, as before.
import * as tf from '@tensorflow/tfjs';

/** The parts of the wasm and cpu backends that hand out a tensor's own memory; their kernels use the same. */
interface HostMemory {
  typedArrayFromHeap?: (t: tf.TensorInfo) => Float32Array;
  data?: { get(dataId: object): { values?: Float32Array } | undefined };
}

/**
 * A view of a float32 tensor's own memory, where the backend keeps it in reach of the host: the
 * wasm heap, or the cpu backend's array; undefined elsewhere. Take a new view after anything that
 * may allocate: the wasm heap moves when it grows, and earlier views of it go empty.
 */
export function hostView(t: tf.Tensor): Float32Array | undefined {
  const backend = tf.backend() as unknown as HostMemory;
  const name = tf.getBackend();
  if (name === 'wasm' && backend.typedArrayFromHeap) return backend.typedArrayFromHeap(t);
  if (name === 'cpu') {
    const values = backend.data?.get(t.dataId)?.values;
    return values instanceof Float32Array && values.length === t.size ? values : undefined;
  }
  return undefined;
}

/** The part of the wasm backend that allocates a tensor in its heap without writing it. */
interface HeapAlloc {
  makeOutput?: (shape: number[], dtype: 'float32') => tf.TensorInfo;
}

/**
 * A float32 tensor of zeros allocated in the wasm heap and zeroed there: `tf.zeros` builds the
 * zeros in a JavaScript array first and copies them in, which for a reallocation's new shard is as
 * many bytes of garbage as the shard (and the collections that garbage sets off). Undefined on
 * other backends.
 */
function zerosInPlace(shape: readonly number[]): tf.Tensor | undefined {
  const backend = tf.backend() as unknown as HeapAlloc;
  if (tf.getBackend() !== 'wasm' || !backend.makeOutput) return undefined;
  const tensor = tf.engine().makeTensorFromTensorInfo(backend.makeOutput([...shape], 'float32'));
  hostView(tensor)!.fill(0);
  return tensor;
}

/** Slices being filled for a model: fresh, zeroed, and nobody's weights until taken. */
export class Staging {
  private readonly slots = new Map<string, { tensor: tf.Tensor; host?: Float32Array }>();

  constructor(shapes: ReadonlyMap<string, readonly number[]>) {
    for (const [name, shape] of shapes) {
      const tensor = zerosInPlace(shape) ?? tf.zeros([...shape]);
      this.slots.set(name, { tensor, host: hostView(tensor) ? undefined : new Float32Array(tensor.size) });
    }
  }

  get names(): string[] {
    return [...this.slots.keys()];
  }

  /** Where the elements of `name` go: a view of the backend's memory (taken anew on each call), or the host copy. */
  view(name: string): Float32Array {
    const slot = this.slots.get(name);
    if (!slot) throw new RangeError(`nothing is staged for '${name}'`);
    return slot.host ?? hostView(slot.tensor)!;
  }

  /** The filled tensors, whose ownership passes to the caller; the staging is empty afterwards. */
  take(): Map<string, tf.Tensor> {
    const out = new Map<string, tf.Tensor>();
    for (const [name, slot] of this.slots) {
      if (slot.host) {
        slot.tensor.dispose();
        out.set(name, tf.tensor(slot.host, slot.tensor.shape));
      } else out.set(name, slot.tensor);
    }
    this.slots.clear();
    return out;
  }

  dispose(): void {
    for (const slot of this.slots.values()) slot.tensor.dispose();
    this.slots.clear();
  }
}

/**
 * Bytes this process holds in tensors and in JavaScript ArrayBuffers (message buffers, decoded
 * chunks, host copies, garbage not yet collected), the wasm heap's unused reserve not counted.
 */
export function heldBytes(): number {
  return tf.memory().numBytes + process.memoryUsage().arrayBuffers;
}
