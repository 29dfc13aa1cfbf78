// Where a response ends. A response runs to its first end-of-sequence token (which it keeps) or to
// the budget of `responseLen` tokens; the positions after the end are padding (the EOS token again)
// and count nowhere: not in log-probs, values, KL, advantages, losses or metrics. The mask is a
// pure function of the tokens and the EOS token, so everything that reads one gets the same ends.

/**
 * Each row's left padding: its leading `pad` tokens among its first `limit` (a prompt's length),
 * from rows of T tokens; undefined when no row has any, so that unpadded rows keep the plain masks.
 */
export function leftPadding(tokens: ArrayLike<number>, rows: number, T: number, limit: number, pad: number | undefined): Int32Array | undefined {
  if (pad === undefined) return undefined;
  const out = new Int32Array(rows);
  let any = false;
  for (let b = 0; b < rows; b++) {
    let n = 0;
    while (n < limit && tokens[b * T + n] === pad) n++;
    out[b] = n;
    any ||= n > 0;
  }
  return any ? out : undefined;
}

/** The length of one response (its tokens up to and with the first EOS, or all of them). */
export function responseLength(response: ArrayLike<number>, eos: number | undefined): number {
  if (eos === undefined) return response.length;
  for (let t = 0; t < response.length; t++) if (response[t] === eos) return t + 1;
  return response.length;
}

/** Each row's response length, from rows of `promptLen + responseLen` tokens. */
export function responseLengths(tokens: Int32Array, promptLen: number, responseLen: number, eos: number | undefined): Int32Array {
  const width = promptLen + responseLen;
  const rows = tokens.length / width;
  if (!Number.isInteger(rows)) throw new RangeError(`${tokens.length} tokens are not whole rows of ${promptLen} + ${responseLen}`);
  const out = new Int32Array(rows);
  for (let b = 0; b < rows; b++) out[b] = responseLength(tokens.subarray(b * width + promptLen, (b + 1) * width), eos);
  return out;
}

/** 1 at every response token a row really has, 0 after its end: [rows, responseLen]. */
export function maskOfLengths(lengths: ArrayLike<number>, responseLen: number): Float32Array {
  const out = new Float32Array(lengths.length * responseLen);
  for (let b = 0; b < lengths.length; b++) out.fill(1, b * responseLen, b * responseLen + lengths[b]!);
  return out;
}

/** The response mask of rows of tokens: [rows, responseLen]. */
export function responseMask(tokens: Int32Array, promptLen: number, responseLen: number, eos: number | undefined): Float32Array {
  return maskOfLengths(responseLengths(tokens, promptLen, responseLen, eos), responseLen);
}

/** Each row's length, back from a mask [rows, responseLen] (the count of its ones). */
export function lengthsOfMask(mask: ArrayLike<number>, responseLen: number): Int32Array {
  const out = new Int32Array(mask.length / responseLen);
  for (let b = 0; b < out.length; b++) {
    let n = 0;
    for (let t = 0; t < responseLen; t++) n += mask[b * responseLen + t]! > 0 ? 1 : 0;
    out[b] = n;
  }
  return out;
}

/** `values` with every padded position set to 0 (a new array). */
export function masked(values: Float32Array, mask: ArrayLike<number>): Float32Array {
  if (values.length !== mask.length) throw new RangeError(`${values.length} values and a mask of ${mask.length}`);
  return values.map((v, i) => (mask[i]! > 0 ? v : 0));
}
