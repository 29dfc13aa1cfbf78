// The TypeScript API for writing a reward actor: see mesh/reward-serve.ts for serveReward, and
// docs/reward-protocol.md for the protocol it serves (which any language can implement).
export { serveReward, type RewardActor, type ServeRewardOptions } from '../mesh/wire/index.ts';
export type { RewardItem } from '../mesh/wire/index.ts';
