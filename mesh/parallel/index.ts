// The parallel layer: clusters and meshes, dp × tp × pp layouts, reallocation plans, slices of
// tensors, and the collectives between the ranks of a call. It knows no model and no algorithm.
export * from './cluster.ts';
export * from './comm.ts';
export * from './layout.ts';
export * from './realloc.ts';
export * from './relaid.ts';
export * from './slices.ts';
