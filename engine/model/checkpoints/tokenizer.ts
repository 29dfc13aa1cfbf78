// A Hugging Face tokenizer: `tokenizer.json` through @huggingface/tokenizers (a pure-JavaScript
// implementation of the Rust crate's BPE, WordPiece and Unigram models), with
// `tokenizer_config.json` when there is one for the special tokens and the chat template, which
// @huggingface/jinja renders. The digit tasks keep their own small vocabularies and never come here.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';

export class TokenizerError extends Error {
  override name = 'TokenizerError';
}

export const TOKENIZER_FILE = 'tokenizer.json';
export const TOKENIZER_CONFIG_FILE = 'tokenizer_config.json';

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export class TextTokenizer {
  private readonly tokenizer: Tokenizer;
  private readonly template?: Template;
  /** The end-of-sequence token's id, when the tokenizer names one. */
  readonly eos?: number;
  readonly bos?: number;
  /** The padding token's id, when the tokenizer names one (pad_token). */
  readonly pad?: number;
  /** Ids in use: one past the largest (added tokens included). */
  readonly vocabSize: number;

  constructor(
    readonly json: Record<string, unknown>,
    readonly config: Record<string, unknown> = {},
    readonly where = 'tokenizer',
  ) {
    try {
      this.tokenizer = new Tokenizer(json, config);
    } catch (e) {
      throw new TokenizerError(`${where}: ${TOKENIZER_FILE} is not a tokenizer this library reads: ${(e as Error).message}`);
    }
    const special = (key: string) => {
      const v = config[key];
      const text = typeof v === 'string' ? v : typeof v === 'object' && v !== null && typeof (v as { content?: unknown }).content === 'string' ? (v as { content: string }).content : undefined;
      if (text === undefined) return undefined;
      const id = this.tokenizer.token_to_id(text);
      if (id === undefined) throw new TokenizerError(`${where}: ${TOKENIZER_CONFIG_FILE} names ${key} ${JSON.stringify(text)}, which is not in the vocabulary`);
      return id;
    };
    this.eos = special('eos_token');
    this.bos = special('bos_token');
    this.pad = special('pad_token');
    let largest = -1;
    for (const id of this.tokenizer.get_vocab(true).values()) largest = Math.max(largest, id);
    this.vocabSize = largest + 1;
    const chat = config.chat_template;
    if (typeof chat === 'string') {
      try {
        this.template = new Template(chat);
      } catch (e) {
        throw new TokenizerError(`${where}: the chat_template in ${TOKENIZER_CONFIG_FILE} does not parse: ${(e as Error).message}`);
      }
    }
  }

  /** The tokenizer of a model directory: tokenizer.json, and tokenizer_config.json if present. */
  static load(dir: string): TextTokenizer {
    const read = (name: string) => {
      const file = join(dir, name);
      try {
        const v = JSON.parse(readFileSync(file, 'utf8')) as unknown;
        if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('expected a JSON object');
        return v as Record<string, unknown>;
      } catch (e) {
        throw new TokenizerError(`${file}: ${(e as Error).message}`);
      }
    };
    if (!existsSync(join(dir, TOKENIZER_FILE))) throw new TokenizerError(`${dir}: expected ${TOKENIZER_FILE}, found none`);
    const config = existsSync(join(dir, TOKENIZER_CONFIG_FILE)) ? read(TOKENIZER_CONFIG_FILE) : {};
    return new TextTokenizer(read(TOKENIZER_FILE), config, dir);
  }

  get hasChatTemplate(): boolean {
    return this.template !== undefined;
  }

  /** Token ids of `text`; special tokens (a BOS, say) as the tokenizer's post-processor adds them, unless told not to. */
  encode(text: string, addSpecial = true): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: addSpecial }).ids;
  }

  /** The text of `ids`; nothing for none (a response that ended at once), which the library refuses. */
  decode(ids: ArrayLike<number>, skipSpecial = true): string {
    if (ids.length === 0) return '';
    return this.tokenizer.decode(Array.from(ids), { skip_special_tokens: skipSpecial });
  }

  /** The chat template applied to `messages`, ending where the assistant's turn begins. */
  chat(messages: readonly ChatMessage[]): string {
    return this.render(messages, true);
  }

  /** The chat template applied to `messages`; with `generationPrompt`, the assistant's turn begun after them. */
  render(messages: readonly ChatMessage[], generationPrompt: boolean): string {
    if (!this.template) throw new TokenizerError(`${this.where}: ${TOKENIZER_CONFIG_FILE} has no chat_template; set chat: false to use prompts as they are`);
    const token = (key: string) => {
      const v = this.config[key];
      return typeof v === 'string' ? v : ((v as { content?: string } | undefined)?.content ?? '');
    };
    return this.template.render({ messages, add_generation_prompt: generationPrompt, bos_token: token('bos_token'), eos_token: token('eos_token') });
  }
}
