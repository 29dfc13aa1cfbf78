// Scenario files: YAML validated against one schema, from which the JSON Schema for editors is
// generated too (`npm run schema`). Every key has a default or is required; an unknown key is an
// error naming its path, never a silent no-op.
// The schema (schema.ts), reading files against it (parse.ts) and what a scenario resolves to
// (resolve.ts); importers take all three from here.
export * from './schema.ts';
export * from './resolve.ts';
export * from './parse.ts';
