// The supervision layer: the supervisor machine that sequences a run (setup, iterations,
// snapshots, recoveries, re-plans), its stages, the membership of the devices, Erlang/OTP's
// restart policies and the chaos kill points; and the same machine run in one process with no bus.
// It sits above the runtime and the elastic layers, which it drives.
export * from './chaos.ts';
export * from './local-run.ts';
export * from './membership.ts';
export * from './supervision.ts';
export * from './supervisor.machine.ts';
