// Episodes of several turns against environments on the bus: the play loop a generating device
// runs, and the codecs between an episode's tokens and the environment's text.
export * from './play.ts';
export * from './codec.ts';
export * from './recorded.ts';
export * from './slots.ts';
