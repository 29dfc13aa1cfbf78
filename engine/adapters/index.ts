// Adapters: small trained matrices beside a frozen base model (LoRA), as parameters the rest of
// ferry moves, stores and plans like any other, and their Hugging Face PEFT form.
export * from './lora.ts';
export * from './peft.ts';
