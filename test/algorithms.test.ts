// The built-in on-policy algorithms under chaos (test/algorithms-chaos.ts): PPO, GRPO, RLOO, ReMax.
import { chaosCases } from './algorithms-chaos.ts';

chaosCases('every algorithm under chaos: ppo, grpo, rloo, remax', [0, 1, 2, 3]);
