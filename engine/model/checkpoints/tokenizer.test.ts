// Tokenizers: a byte-level BPE tokenizer.json written here, on text with multi-byte characters,
// its special tokens, and a chat template.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { TextTokenizer, TokenizerError } from './tokenizer.ts';
import { tokenizerJson } from '../../../test/tokenizer-fixture.ts';

/** The ids the tokenizer should give, worked out by hand: each UTF-8 byte is its own token unless merged. */
const byteIds = (text: string) => [...new TextEncoder().encode(text)];

const dir = mkdtempSync(join(tmpdir(), 'ferry-tokenizer-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('TextTokenizer', () => {
  const config = { eos_token: '<|endoftext|>', chat_template: '{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}' };

  it('encodes multi-byte characters byte by byte and merges what the merges say (hand-worked ids)', () => {
    const t = new TextTokenizer(tokenizerJson(), config);
    // "héllo": h, é (two bytes), ll, o. " ✓": a space and three bytes. " hell": a space, then hell.
    expect(t.encode('héllo')).toEqual([...byteIds('h'), ...byteIds('é'), 257, ...byteIds('o')]);
    expect(t.encode(' ✓')).toEqual(byteIds(' ✓'));
    expect(t.encode(' hell')).toEqual([...byteIds(' '), 258]);
    for (const text of ['héllo ✓ hell', '日本語のテキスト', 'emoji 👩‍💻 and tabs\t!', '']) expect(t.decode(t.encode(text))).toBe(text);
    expect(t.decode([])).toBe(''); // a response that ended at once
  });

  it('knows its end token and vocabulary size, and skips special tokens when decoding unless asked', () => {
    const t = new TextTokenizer(tokenizerJson(), config);
    expect(t.eos).toBe(259);
    expect(t.bos).toBeUndefined();
    expect(t.vocabSize).toBe(260);
    const ids = [...t.encode('hell'), 259];
    expect(t.decode(ids)).toBe('hell');
    expect(t.decode(ids, false)).toBe('hell<|endoftext|>');
  });

  it('renders the chat template up to the assistant turn', () => {
    const t = new TextTokenizer(tokenizerJson(), config);
    expect(t.chat([{ role: 'user', content: 'hi ✓' }])).toBe('<user>hi ✓\n<assistant>');
    const plain = new TextTokenizer(tokenizerJson(), { eos_token: '<|endoftext|>' });
    expect(plain.hasChatTemplate).toBe(false);
    expect(() => plain.chat([{ role: 'user', content: 'x' }])).toThrow(/has no chat_template; set chat: false/);
  });

  it('loads a directory, and refuses what it cannot use with the file named', () => {
    writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizerJson()));
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
    expect(TextTokenizer.load(dir).encode('hell')).toEqual([258]);
    writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: '</s>' }));
    expect(() => TextTokenizer.load(dir)).toThrow(TokenizerError);
    expect(() => TextTokenizer.load(dir)).toThrow(/names eos_token "<\/s>", which is not in the vocabulary/);
    writeFileSync(join(dir, 'tokenizer_config.json'), '{ not json');
    expect(() => TextTokenizer.load(dir)).toThrow(/tokenizer_config\.json: /);
    const empty = mkdtempSync(join(tmpdir(), 'ferry-tokenizer-'));
    expect(() => TextTokenizer.load(empty)).toThrow(/expected tokenizer\.json, found none/);
    rmSync(empty, { recursive: true });
  });
});
