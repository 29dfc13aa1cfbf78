// The model layer: the GPT (one device, and one rank of a mesh), its parameters, Adam, the loss
// registry, seeded randomness, the TensorFlow.js backend, and a Hugging Face model's files: the
// safetensors checkpoint format and its tokenizer. A loss is named, never an algorithm.
export * from './adam.ts';
export * from './backend/backend.ts';
export * from './gpt.ts';
export * from './losses/index.ts';
export * from './params.ts';
export * from './rng.ts';
export * from './steps.ts';
export * from './rank.ts';
export * from './row-decoder.ts';
export * from './backend/staging.ts';
export * from './mask.ts';
export * from './kv-cache.ts';
export * from './checkpoints/safetensors.ts';
export * from './checkpoints/tokenizer.ts';
export * from './checkpoints/hf.ts';
export * from './checkpoints/peft-files.ts';
