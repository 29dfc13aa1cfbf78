// Between an episode's tokens and the environment's text, at a turn's edges only. An action's
// tokens are read as text once, to send it; an observation's text is tokenized once, when it
// arrives, and its ids are appended after the action's end-of-turn token. With a chat template,
// the ids are what the template renders after the assistant's end-of-turn token for one more user
// message and the assistant's next turn (Qwen2's "\n<|im_start|>user\n…<|im_end|>\n<|im_start|>
// assistant\n"), so the sequence is the template's rendering of the whole conversation, for a
// template that only appends. For one that rewrites earlier turns (Qwen3's drops the reasoning of
// earlier answers) the sequence is what the policy read turn by turn, which is what it is trained
// on: nothing is rendered again, diffed or duplicated.
import type { TurnCodecSpec } from '../../mesh/wire/index.ts';
import { TextTokenizer, type ChatMessage } from '../model/index.ts';
import type { TurnCodec } from './play.ts';

export class CodecError extends Error {
  override name = 'CodecError';
}

/** A digit task's codec: token t is the base-36 digit t, the separator `|`; the end token has no text. */
export function digitCodec(base: number): TurnCodec {
  const text = (t: number) => (t < base ? t.toString(36) : t === base ? '|' : '');
  const tokens = (what: string, s: string) =>
    Array.from(s, (c, i) => {
      const t = c === '|' ? base : Number.parseInt(c, 36);
      if (!(c === '|' || (t >= 0 && t < base)))
        throw new CodecError(`the ${what} ${JSON.stringify(s.slice(0, 40))} has ${JSON.stringify(c)} at ${i}, which is not a token of this task (digits 0-${(base - 1).toString(36)} and '|')`);
      return t;
    });
  return {
    action: (toks) => toks.map(text).join(''),
    observation: (obs) => tokens('observation', obs),
    actionTokens: (act) => tokens('action', act),
  };
}

/** A tokenizer's codec; with `template`, observations are appended as the chat template renders a user message. */
export function tokenizerCodec(tok: TextTokenizer, template: boolean, endOfTurn: number | undefined): TurnCodec {
  const action = (toks: readonly number[]) => tok.decode(toks, true);
  const actionTokens = (text: string) => tok.encode(text, false);
  if (!template) return { action, actionTokens, observation: (obs) => tok.encode(obs, false) };
  if (endOfTurn === undefined) throw new CodecError(`${tok.where}: a chat template's turns end with a token; the tokenizer names no eos_token`);
  const eot = tok.decode([endOfTurn], false);
  // Probe messages whose text cannot occur in a template, to find where the assistant's turn ends.
  const probe: ChatMessage[] = [
    { role: 'user', content: '\u0001' },
    { role: 'assistant', content: '\u0002' },
  ];
  const before = tok.render(probe, false);
  const at = before.indexOf(`\u0002${eot}`);
  if (at < 0) throw new CodecError(`${tok.where}: the chat template does not end an assistant's message with the end-of-turn token ${JSON.stringify(eot)}; observations cannot be appended after it`);
  const kept = before.slice(0, at + 1 + eot.length);
  return {
    action,
    actionTokens,
    observation(obs) {
      const full = tok.render([...probe, { role: 'user', content: obs }], true);
      if (!full.startsWith(kept)) {
        throw new CodecError(`${tok.where}: the chat template is not append-only (one more message changes how the earlier ones render); ferry appends observations and cannot use it`);
      }
      return tok.encode(full.slice(kept.length), false);
    },
  };
}

/** The codec a generate call names. */
export function turnCodec(spec: TurnCodecSpec, endOfTurn: number | undefined): TurnCodec {
  if (spec.kind === 'digits') return digitCodec(spec.base);
  return tokenizerCodec(TextTokenizer.load(spec.dir), spec.template, endOfTurn);
}
