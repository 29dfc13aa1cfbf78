// The wire layer: the NATS connection, subject names, the msgpack codec and the message schemas,
// chunked tensor transfers, the private nats-server, credentials, and the reward protocol. It knows
// nothing of models or algorithms.
export * from './auth.ts';
export * from './bus.ts';
export * from './codec.ts';
export * from './debian.ts';
export * from './events.ts';
export * from './issues.ts';
export * from './memory-bus.ts';
export * from './nats-server.ts';
export * from './protocol.ts';
export * from './reward-protocol.ts';
export * from './reward-serve.ts';
export * from './presence.ts';
export * from './env-protocol.ts';
export * from './env-client.ts';
export * from './env-serve.ts';
export * from './subjects.ts';
export * from './transfer.ts';
export * from './service.ts';
export * from './shelf.ts';
