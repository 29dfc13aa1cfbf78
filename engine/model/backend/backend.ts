// Picks the TensorFlow.js backend. `node-gpu` and `node` are optional peer dependencies (their
// install downloads libtensorflow, which fails without internet), so they are loaded only if a
// user has installed them; `wasm` is the default that always works; `cpu` is the pure-JS fallback.
import { installWasmKernels } from './wasm-kernels.ts';

export const BACKENDS = ['auto', 'wasm', 'cpu', 'node', 'node-gpu'] as const;
export type BackendChoice = (typeof BACKENDS)[number];

export class BackendError extends Error {
  override name = 'BackendError';
}

const NODE_PACKAGES = { 'node-gpu': '@tensorflow/tfjs-node-gpu', node: '@tensorflow/tfjs-node' } as const;

type Tf = typeof import('@tensorflow/tfjs');

async function tryBackend(tf: Tf, name: Exclude<BackendChoice, 'auto'>, threads: number): Promise<string | undefined> {
  if (name === 'node' || name === 'node-gpu') {
    try {
      // The package registers the 'tensorflow' backend with the tfjs engine as a side effect.
      await import(NODE_PACKAGES[name]);
    } catch {
      return undefined;
    }
    return (await tf.setBackend('tensorflow')) ? name : undefined;
  }
  if (name === 'wasm') {
    const wasm = await import('@tensorflow/tfjs-backend-wasm');
    // One thread: several workers share the cores, and a fixed thread count keeps results fixed.
    wasm.setThreadsCount(threads);
    if (!(await tf.setBackend('wasm'))) return undefined;
    installWasmKernels();
    return 'wasm';
  }
  return (await tf.setBackend('cpu')) ? 'cpu' : undefined;
}

/** Sets the backend and returns the one actually in use. */
export async function initBackend(choice: BackendChoice, threads = 1): Promise<string> {
  // Imported here, not at the top, so that processes that only read scenarios never load TensorFlow.js.
  const tf = await import('@tensorflow/tfjs');
  const order: Array<Exclude<BackendChoice, 'auto'>> = choice === 'auto' ? ['node-gpu', 'node', 'wasm', 'cpu'] : [choice];
  for (const name of order) {
    const used = await tryBackend(tf, name, threads);
    if (used) {
      await tf.ready();
      return used;
    }
  }
  const hint = choice === 'node' || choice === 'node-gpu' ? ` (npm install ${NODE_PACKAGES[choice]})` : '';
  throw new BackendError(`TensorFlow.js backend '${choice}' is not available${hint}; choose one of ${BACKENDS.join(', ')}`);
}
