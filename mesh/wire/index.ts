// The wire layer, in five rooms: bus/ (the connection, the in-memory bus, subject names, run
// events, credentials), server/ (the private nats-server and where its binary comes from),
// messages/ (the message schemas, the msgpack codec, what a run records), transfer/ (chunked
// tensor transfers, resends, the devices' snapshot buckets) and services/ (the reward and
// environment protocols, and the presence their instances share). It knows nothing of models or
// algorithms.
export * from './bus/auth.ts';
export * from './bus/bus.ts';
export * from './messages/codec.ts';
export * from './server/debian.ts';
export * from './bus/events.ts';
export * from './messages/issues.ts';
export * from './bus/memory-bus.ts';
export * from './server/nats-server.ts';
export * from './messages/protocol.ts';
export * from './services/reward-protocol.ts';
export * from './services/reward-serve.ts';
export * from './services/presence.ts';
export * from './services/env-protocol.ts';
export * from './services/env-client.ts';
export * from './services/env-serve.ts';
export * from './bus/subjects.ts';
export * from './transfer/transfer.ts';
export * from './services/service.ts';
export * from './transfer/shelf.ts';
