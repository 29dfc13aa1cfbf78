// The TypeScript API for writing a reward actor: see mesh/reward-serve.ts for serveReward, and
// docs/reward-protocol.md for the protocol it serves (which any language can implement).
export { serveReward, type RewardActor, type ServeRewardOptions } from '../mesh/reward-serve.ts';
export type { RewardItem } from '../mesh/reward-protocol.ts';
