// Token in, token out at a turn's edges: an observation's ids, appended after the action's
// end-of-turn token, are the chat template's rendering of the whole conversation for a template
// that only appends (Qwen2's), and what the policy read turn by turn for one that rewrites earlier
// turns (Qwen3-style, dropping old reasoning); the shipped tokenizer and the digit tasks append
// plain ids.
import { describe, expect, it } from 'vitest';
import { TextTokenizer, type ChatMessage } from '../model/index.ts';
import { tokenizerJson } from '../../test/tokenizer-fixture.ts';
import { CodecError, digitCodec, tokenizerCodec } from './codec.ts';

const QWEN2 =
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
// Earlier assistant turns lose their reasoning: the last one keeps it.
const THINKING =
  "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** The fixture's byte-level BPE with Qwen2's chat tokens added. */
function chatTokenizer(template: string): TextTokenizer {
  const json = tokenizerJson() as ReturnType<typeof tokenizerJson> & { added_tokens: unknown[] };
  json.added_tokens.push(
    { id: 260, content: '<|im_start|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    { id: 261, content: '<|im_end|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
  );
  return new TextTokenizer(json, { eos_token: '<|im_end|>', chat_template: template });
}

/** A conversation played as an episode: the prompt rendered, then each action's ids (ending in <|im_end|>) and each observation's appended ids. */
function played(tok: TextTokenizer, prompt: string, turns: Array<{ action: string; observation?: string }>): number[] {
  const codec = tokenizerCodec(tok, true, tok.eos);
  const ids = tok.encode(tok.render([{ role: 'user', content: prompt }], true), false);
  for (const t of turns) {
    ids.push(...tok.encode(t.action, false), tok.eos!);
    if (t.observation !== undefined) ids.push(...codec.observation(t.observation, false));
  }
  return ids;
}

const TURNS = [
  { action: '<think>it is small</think><calc>37*12</calc>', observation: '<result>444</result>' },
  { action: '<think>so</think>hello, 444\n', observation: 'héllo ✓ again' },
  { action: 'done' },
];
const conversation = (prompt: string): ChatMessage[] => [
  { role: 'user', content: prompt },
  ...TURNS.flatMap((t): ChatMessage[] => [{ role: 'assistant', content: t.action }, ...(t.observation !== undefined ? [{ role: 'user' as const, content: t.observation }] : [])]),
];

describe('observations appended as ids', () => {
  it("Qwen2's template: the appended ids are the template's rendering of the whole conversation, the \\n after each <|im_end|> included", () => {
    const tok = chatTokenizer(QWEN2);
    const whole = tok.encode(tok.render(conversation('What is 37*12?'), false), false);
    // The rendering ends its last message with "\n", which no policy writes: the episode stops at <|im_end|>.
    expect(played(tok, 'What is 37*12?', TURNS)).toEqual(whole.slice(0, -1));
    expect(tok.decode(whole.slice(-1), false)).toBe('\n');
    const codec = tokenizerCodec(tok, true, tok.eos);
    expect(tok.decode(codec.observation('4', false), false)).toBe('\n<|im_start|>user\n4<|im_end|>\n<|im_start|>assistant\n');
  });

  it('a template that rewrites earlier turns: the sequence is what the policy read turn by turn, not the finished rendering (nothing is diffed or duplicated)', () => {
    const tok = chatTokenizer(THINKING);
    const ids = played(tok, 'Q', TURNS);
    const whole = tok.encode(tok.render(conversation('Q'), false), false).slice(0, -1);
    expect(ids).not.toEqual(whole);
    // Every action appears once, with its reasoning, as sampled.
    const text = tok.decode(ids, false);
    for (const t of TURNS) expect(text.split(t.action)).toHaveLength(2);
    expect(text.split('<result>444</result>')).toHaveLength(2);
  });

  it('without a template, and for the shipped character tokenizer and the digit tasks: plain ids, concatenating as the text does', () => {
    const arith = TextTokenizer.load('examples/arith/tokenizer');
    const codec = tokenizerCodec(arith, false, arith.eos);
    const action = arith.encode('<calc>37*12</calc>', false);
    expect(codec.action(action)).toBe('<calc>37*12</calc>');
    expect([...action, ...codec.observation('<result>444</result>', false)]).toEqual(arith.encode('<calc>37*12</calc><result>444</result>', false));
    const digits = digitCodec(10);
    expect(digits.observation('40|1', false)).toEqual([4, 0, 10, 1]);
    expect(digits.action([3, 1, 10, 11])).toBe('31|');
    expect(() => digits.observation('4a', false)).toThrow(CodecError);
    expect(() => digits.observation('4a', false)).toThrow(`the observation "4a" has "a" at 1, which is not a token of this task (digits 0-9 and '|')`);
    expect(() => tokenizerCodec(arith, true, arith.eos)).toThrow(/has no chat_template/);
  });
});
