// A replacement for one kernel of TensorFlow.js's wasm backend (4.x). Its Slice reads the whole
// source tensor out of the wasm heap into a fresh copy before taking the slice (`readSync` without
// a range), so a slice costs the size of its source, not of its result: 64 slices of a 2 MiB
// tensor took 117 ms here. The replacement reads through a view of the heap, as the backend's own
// Concat does, and copies only the result's elements. Batched products over many small matrices
// (attention's) are made of such slices (see blocks.ts), so this is on the training path.
import * as tf from '@tensorflow/tfjs';

/** The parts of the wasm backend the kernel uses; the backend's own kernels use the same. */
interface WasmBackend {
  makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
  typedArrayFromHeap(t: tf.TensorInfo): Float32Array | Int32Array | Uint8Array;
}

let installed = false;

/** Installs the fixed Slice for the wasm backend (once; the original serves string tensors). */
export function installWasmKernels(): void {
  if (installed) return;
  const original = tf.getKernel('Slice', 'wasm');
  if (!original) return;
  installed = true;
  tf.unregisterKernel('Slice', 'wasm');
  tf.registerKernel({
    kernelName: 'Slice',
    backendName: 'wasm',
    setupFunc: original.setupFunc,
    disposeFunc: original.disposeFunc,
    kernelFunc: (args) => {
      const x = args.inputs.x as tf.TensorInfo;
      if (x.dtype === 'string') return original.kernelFunc(args);
      const backend = args.backend as unknown as WasmBackend;
      const { begin, size } = args.attrs as unknown as { begin: number[]; size: number[] };
      const [b, s] = tf.slice_util.parseSliceParams(x as tf.Tensor, begin, size);
      // The output first: making it may grow the heap, which detaches earlier views of it.
      const out = backend.makeOutput(s, x.dtype);
      const from = backend.typedArrayFromHeap(x);
      const to = backend.typedArrayFromHeap(out);
      copySlice(from, x.shape, b, s, to);
      return out;
    },
  });
}

/** Copies the block of `from` (of `shape`) starting at `begin`, of `size`, into `to`, row by row of the last axis. */
export function copySlice<T extends Float32Array | Int32Array | Uint8Array>(from: T, shape: readonly number[], begin: readonly number[], size: readonly number[], to: T): void {
  const rank = shape.length;
  if (size.some((n) => n === 0)) return;
  if (rank === 0) {
    to[0] = from[0]!;
    return;
  }
  const strides = new Array<number>(rank);
  strides[rank - 1] = 1;
  for (let i = rank - 2; i >= 0; i--) strides[i] = strides[i + 1]! * shape[i + 1]!;
  // Leading axes of size 1 and trailing axes taken whole make one contiguous run.
  let contiguousFrom = rank - 1;
  while (contiguousFrom > 0 && size[contiguousFrom] === shape[contiguousFrom]) contiguousFrom--;
  let start = 0;
  for (let i = 0; i < rank; i++) start += begin[i]! * strides[i]!;
  const run = size.slice(contiguousFrom).reduce((a, n) => a * n, 1);
  const outer = size.slice(0, contiguousFrom);
  if (outer.every((n) => n === 1)) {
    to.set(from.subarray(start, start + run));
    return;
  }
  const index = new Array<number>(outer.length).fill(0);
  for (let at = 0; ; at += run) {
    let offset = start;
    for (let i = 0; i < outer.length; i++) offset += index[i]! * strides[i]!;
    to.set(from.subarray(offset, offset + run), at);
    let axis = outer.length - 1;
    while (axis >= 0 && ++index[axis]! === outer[axis]!) index[axis--] = 0;
    if (axis < 0) return;
  }
}
