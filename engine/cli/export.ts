// npm run export -- RUN_DIR [--model NAME] [--dtype f32|bf16] [--adapter | --merge] --out DIR
// Writes a run's policy (its last checkpoint) as a Hugging Face model directory, or its LoRA
// adapters as a PEFT adapter.
import { UsageError, args, runMain } from '../../actors/host.ts';
import { exportRun } from '../runtime/index.ts';

const USAGE = `usage: npm run export -- RUN_DIR [--model NAME] [--dtype f32|bf16] [--adapter | --merge] --out DIR
  RUN_DIR   a run directory: its last checkpoint is exported
  --model   which of the run's policy models (default: the trained one)
  --dtype   f32 (default) or bf16
  --adapter a run with LoRA adapters: write them alone as a PEFT adapter (adapter_config.json,
            adapter_model.safetensors), which PEFT loads onto the base model
  --merge   a run with LoRA adapters: write the model with them merged in (the default)
  --out     the directory to write: config.json, model.safetensors, and the run's tokenizer files`;

runMain(async () => {
  const { values, positionals } = args(USAGE, {
    model: { type: 'string' },
    dtype: { type: 'string' },
    out: { type: 'string' },
    adapter: { type: 'boolean', default: false },
    merge: { type: 'boolean', default: false },
  });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`expected one run directory, got ${positionals.length ? positionals.map((p) => JSON.stringify(p)).join(' ') : 'none'}\n${USAGE}`);
  if (!values.out) throw new UsageError(`--out: expected the directory to write\n${USAGE}`);
  const dtype = values.dtype ?? 'f32';
  if (dtype !== 'f32' && dtype !== 'bf16') throw new UsageError(`--dtype: expected f32 or bf16, got ${JSON.stringify(dtype)}\n${USAGE}`);
  if (values.adapter && values.merge) throw new UsageError(`--adapter and --merge: expected one of them (the adapters alone, or merged into the model)\n${USAGE}`);
  const done = await exportRun(positionals[0]!, { ...(values.model === undefined ? {} : { model: values.model }), dtype, out: values.out, adapter: values.adapter });
  console.log(`exported ${done.model} to ${values.out}: ${done.files.join(', ')} (${(done.bytes / 1e6).toFixed(1)} MB of weights, ${dtype})`);
  return 0;
});
