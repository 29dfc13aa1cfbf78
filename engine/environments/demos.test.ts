import { describe, expect, it } from 'vitest';
import type { EnvTask } from '../../mesh/wire/index.ts';
import { digitCodec } from '../episodes/index.ts';
import { DemoError, demoRows, type Demonstrate } from './demos.ts';

// Digits 0-9, '|' is 10, the end-of-turn token 11, fill 12.
const [END, FILL] = [11, 12];
const codec = digitCodec(10);

/** The expert of a game whose secret is the seed: it tries 5, then the secret. */
const expert: Demonstrate = async (_episode, task: EnvTask, maxTurns) => {
  const secret = task.seed % 10;
  const turns =
    secret === 5
      ? [{ action: '5', observation: '' }]
      : [
          { action: '5', observation: secret > 5 ? '1' : '0' },
          { action: String(secret), observation: '' },
        ];
  return { observation: '|', turns: turns.slice(0, maxTurns) };
};

const layout = (o: Partial<Parameters<typeof demoRows>[2]> = {}) => ({
  prompts: Int32Array.of(1, 2, 3, 4),
  tasks: [
    { prompt_text: '', seed: 7 },
    { prompt_text: '', seed: 5 },
  ],
  ids: ['w0', 'w1'],
  promptLen: 2,
  responseLen: 8,
  maxTurns: 4,
  eos: END,
  fill: FILL,
  ...o,
});

describe('demonstrations from an environment’s expert', () => {
  it('lays each out as an episode is: prompt, first observation, actions ended by the end-of-turn token, observations between; trains the actions only', async () => {
    const out = await demoRows(expert, codec, layout());
    expect(Array.from(out.tokens)).toEqual([
      ...[1, 2, 10, 5, END, 1, 7, END, FILL, FILL], // "|", "5", "1" (higher), "7"
      ...[3, 4, 10, 5, END, FILL, FILL, FILL, FILL, FILL], // found at once
    ]);
    expect(Array.from(out.mask)).toEqual([...[0, 1, 1, 0, 1, 1, 0, 0], ...[0, 1, 1, 0, 0, 0, 0, 0]]);
    expect(out.turns).toBe(1.5);
  });

  it('an action ending with a stop string takes no end-of-turn token; what does not fit is cut at the response’s end', async () => {
    const calc: Demonstrate = async () => ({
      observation: '',
      turns: [
        { action: '12|', observation: '3' },
        { action: '3', observation: '' },
      ],
    });
    const out = await demoRows(calc, codec, layout({ tasks: [{ prompt_text: '', seed: 0 }], ids: ['w0'], prompts: Int32Array.of(1, 2), stopStrings: ['|'] }));
    expect(Array.from(out.tokens)).toEqual([1, 2, 1, 2, 10, 3, 3, END, FILL, FILL]);
    expect(Array.from(out.mask)).toEqual([1, 1, 1, 0, 1, 1, 0, 0]);
    const cut = await demoRows(calc, codec, layout({ tasks: [{ prompt_text: '', seed: 0 }], ids: ['w0'], prompts: Int32Array.of(1, 2), responseLen: 4 }));
    expect(Array.from(cut.tokens)).toEqual([1, 2, 1, 2, 10, END]);
    expect(Array.from(cut.mask)).toEqual([1, 1, 1, 1]);
  });

  it('refuses a demonstration whose first observation does not fit, or that is not the task’s text, naming it', async () => {
    const wordy: Demonstrate = async () => ({ observation: '123456789', turns: [{ action: '1', observation: '' }] });
    await expect(demoRows(wordy, codec, layout({ responseLen: 4 }))).rejects.toThrow(DemoError);
    await expect(demoRows(wordy, codec, layout({ responseLen: 4 }))).rejects.toThrow(/demonstration w0: its first observation does not fit in the 4 tokens after the prompt/);
    const letters: Demonstrate = async () => ({ observation: '', turns: [{ action: 'five', observation: '' }] });
    await expect(demoRows(letters, codec, layout())).rejects.toThrow(/the action "five" has "f" at 0, which is not a token of this task/);
  });
});
