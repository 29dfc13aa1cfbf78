// A PPO scenario's head on four devices, as scenarios/chaos.yaml and scenarios/elastic.yaml plan
// it: the actor trained data-parallel on 0-1 and generating tensor-parallel on 2-3 (so weights
// move between meshes), the critic pipelined, the reward on device 3. Tests add rl: and the rest.
export const FOUR_DEVICES = `
seed: 5
task: { name: sort, digits: 4, base: 10 }
model: { layers: 2, width: 32, heads: 4 }
cluster: { nodes: 1, devices_per_node: 4 }
plan:
  actor.train: { mesh: "0:0-1", dp: 2 }
  actor.generate: { mesh: "0:2-3", tp: 2 }
  critic.train: { mesh: "0:0-1", pp: 2 }
  critic.inference: { mesh: "0:2-3", dp: 2 }
  reference.inference: { mesh: "0:2-3", tp: 2 }
  reward.inference: { mesh: "0:3" }
`;

/** The plan the elastic scenario's search chooses on devices 0-2 once device 3 is lost for good: a device each, no model split. */
export const WITHOUT_DEVICE_3 = {
  'actor.train': { mesh: '0:0', dp: 1, tp: 1, pp: 1 },
  'actor.generate': { mesh: '0:0', dp: 1, tp: 1, pp: 1 },
  'critic.train': { mesh: '0:1', dp: 1, tp: 1, pp: 1 },
  'critic.inference': { mesh: '0:1', dp: 1, tp: 1, pp: 1 },
  'reference.inference': { mesh: '0:2', dp: 1, tp: 1, pp: 1 },
  'reward.inference': { mesh: '0:1', dp: 1, tp: 1, pp: 1 },
};
