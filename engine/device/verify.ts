// Verifiable rewards: a response scored against a dataset's reference answer by a rule, not a
// model. `exact`: the response, trimmed and with runs of white space made one, equals the answer.
// `math`: the number the response gives as its answer equals the reference's, within a tolerance;
// the answer is the last `\boxed{…}`, else what follows the last `####`, else the last number in
// the text. Numbers may carry thousands separators, a sign, a decimal part, an exponent or be a
// fraction (`3/4`); `\frac{a}{b}` and `\dfrac{a}{b}` read as a/b.

export const VERIFIERS = ['exact', 'math'] as const;
export type VerifierName = (typeof VERIFIERS)[number];

/** Relative tolerance of the math check (with an absolute floor for answers near 0). */
export const MATH_TOLERANCE = 1e-6;

const normalise = (s: string) => s.trim().replace(/\s+/g, ' ');

export function exactMatch(response: string, answer: string): boolean {
  return normalise(response) === normalise(answer);
}

/** The contents of the last `\boxed{…}`, with its braces balanced; undefined if there is none. */
export function lastBoxed(text: string): string | undefined {
  const at = text.lastIndexOf('\\boxed');
  if (at < 0) return undefined;
  let i = at + '\\boxed'.length;
  while (text[i] === ' ') i++;
  if (text[i] !== '{') return undefined;
  let depth = 0;
  for (let j = i; j < text.length; j++) {
    if (text[j] === '{') depth++;
    else if (text[j] === '}' && --depth === 0) return text.slice(i + 1, j);
  }
  return undefined; // never closed
}

const NUMBER = /[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*\/\s*[-+]?\d+(?:\.\d+)?)?|[-+]?\.\d+/g;

/** A number as written: separators dropped, `a/b` divided; NaN for a division by zero. */
export function parseNumber(text: string): number {
  const s = text.replace(/,/g, '').replace(/\s+/g, '');
  const slash = s.indexOf('/');
  if (slash > 0) return Number(s.slice(0, slash)) / Number(s.slice(slash + 1));
  return Number(s);
}

/** The last number written in `text` (with `\frac{a}{b}` read as a/b), or undefined. */
export function lastNumber(text: string): number | undefined {
  const plain = text.replace(/\\d?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}/g, '$1/$2');
  const all = plain.match(NUMBER);
  if (!all) return undefined;
  const n = parseNumber(all[all.length - 1]!);
  return Number.isFinite(n) ? n : undefined;
}

/** The number a response gives as its answer: `\boxed{…}`, else after the last `####`, else the last number. */
export function extractAnswer(response: string): number | undefined {
  const boxed = lastBoxed(response);
  if (boxed !== undefined) return lastNumber(boxed);
  const hashes = response.lastIndexOf('####');
  if (hashes >= 0) return lastNumber(response.slice(hashes + 4)) ?? lastNumber(response.slice(0, hashes));
  return lastNumber(response);
}

export function mathMatch(response: string, answer: string, tolerance = MATH_TOLERANCE): boolean {
  const want = extractAnswer(answer);
  const got = extractAnswer(response);
  if (want === undefined || got === undefined) return false;
  return Math.abs(got - want) <= tolerance * Math.max(1, Math.abs(want));
}

/** A verifier by name: 1 for a right answer, 0 otherwise. */
export function verifier(name: VerifierName): (response: string, answer: string) => number {
  return name === 'exact' ? (r, a) => (exactMatch(r, a) ? 1 : 0) : (r, a) => (mathMatch(r, a) ? 1 : 0);
}
