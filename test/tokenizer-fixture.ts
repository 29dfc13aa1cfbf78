// A byte-level BPE tokenizer.json, written here: GPT-2's byte table (256 tokens), three merges (he,
// ll, hell) and an end token, for tests of tokenizers and of models that read text.

/** GPT-2's byte → character table: printable bytes stand for themselves, the rest from U+0100 on. */
function byteChars(): string[] {
  const out: string[] = [];
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out.push(String.fromCodePoint(printable ? b : next++));
  }
  return out;
}
const BYTES = byteChars();

/** 256 byte tokens, three merges (he, ll, hell), and an end token: ids 0–255, 256–258, 259. */
export function tokenizerJson() {
  const vocab: Record<string, number> = Object.fromEntries(BYTES.map((c, i) => [c, i]));
  vocab.he = 256;
  vocab.ll = 257;
  vocab.hell = 258;
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [{ id: 259, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab, merges: ['h e', 'l l', 'he ll'] },
  };
}
