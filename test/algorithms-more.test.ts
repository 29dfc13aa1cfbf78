// REINFORCE++, DPO and a user's algorithm and loss from a file under chaos (test/algorithms-chaos.ts).
import { chaosCases } from './algorithms-chaos.ts';

chaosCases('every algorithm under chaos: reinforce_pp, dpo, and files of the user', [4, 5, 6, 7]);
