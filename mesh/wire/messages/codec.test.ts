import { describe, it, expect } from 'vitest';
import { Packr } from 'msgpackr';
import { FRAME, ProtocolError, decode, encode, encodeSized } from './codec.ts';
import { Call, Chunk, PROTOCOL_VERSION, Reply, type Call as CallT } from './protocol.ts';
import { REWARD_PROTOCOL_VERSION, RewardReply } from '../services/reward-protocol.ts';

const SUBJECT = 'ferry.r1.dev.0.call';
// A plain msgpack encoder, to produce bytes that ferry's own `encode` would never write.
const raw = new Packr({ useRecords: false, moreTypes: true, mapsAsObjects: true });

const bits = (a: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/** Decodes and returns the ProtocolError it throws; fails if it does not throw one. */
function decodeError(bytes: Uint8Array, schema: Parameters<typeof decode>[2] = Call): ProtocolError {
  try {
    decode(SUBJECT, bytes, schema);
  } catch (e) {
    expect(e).toBeInstanceOf(ProtocolError);
    return e as ProtocolError;
  }
  throw new Error('decode did not throw');
}

const generateCall = (): CallT => ({
  type: 'call',
  v: PROTOCOL_VERSION,
  id: 'r1.0.actor.generate.0',
  model: 'actor',
  iteration: 0,
  body: {
    fn: 'generate',
    prompts: new Int32Array([3, 1, 2, 10, -7, 2147483647, -2147483648, 10]),
    batch: 2,
    promptLen: 4,
    responseLen: 3,
    seeds: new Uint32Array([0, 1, 0xffffffff, 0x80000000]),
    temperature: 0.7,
  },
});

const trainCall = (): CallT => ({
  type: 'call',
  v: PROTOCOL_VERSION,
  id: 'r1.3.critic.train.9',
  model: 'critic',
  iteration: 3,
  body: {
    fn: 'train',
    tokens: new Int32Array([1, 2, 3, 4]),
    batch: 1,
    promptLen: 2,
    responseLen: 2,
    seed: 5,
    epochs: 2,
    minibatches: 1,
    loss: { name: 'clip_value', params: { clip: 0.2 } },
    data: {
      // Values chosen for their bit patterns: -0, a subnormal, NaN, ±Infinity, and 0.1 (inexact).
      old: new Float32Array([-0, 1e-45, 0.1]),
      returns: new Float32Array([NaN, Infinity, -Infinity]),
    },
  },
});

describe('encode/decode round trip', () => {
  it('a generate call: Int32Array and Uint32Array come back as the same classes, bit-exact', () => {
    const call = generateCall();
    const back = decode(SUBJECT, encode(call), Call);
    expect(back.body.fn).toBe('generate');
    if (back.body.fn !== 'generate' || call.body.fn !== 'generate') throw new Error('unreachable');
    expect(back.body.prompts).toBeInstanceOf(Int32Array);
    expect(back.body.seeds).toBeInstanceOf(Uint32Array);
    expect(bits(back.body.prompts)).toBe(bits(call.body.prompts));
    expect(bits(back.body.seeds)).toBe(bits(call.body.seeds));
    expect(back).toEqual(call);
  });

  it('a train call: Float32Array comes back as Float32Array, bit-exact (incl. -0, NaN, subnormal)', () => {
    const call = trainCall();
    const back = decode(SUBJECT, encode(call), Call);
    if (back.body.fn !== 'train' || call.body.fn !== 'train') throw new Error('expected a train call');
    expect(back.body.tokens).toBeInstanceOf(Int32Array);
    expect(back.body.data.old).toBeInstanceOf(Float32Array);
    expect(back.body.data.returns).toBeInstanceOf(Float32Array);
    expect(bits(back.body.data.old!)).toBe(bits(call.body.data.old!));
    expect(bits(back.body.data.returns!)).toBe(bits(call.body.data.returns!));
    expect(Object.is(back.body.data.old![0], -0)).toBe(true);
    expect(back.body.loss).toEqual(call.body.loss);
    expect([back.body.epochs, back.body.minibatches]).toEqual([2, 1]);
  });

  it('a subarray view travels as its own elements only', () => {
    const whole = new Float32Array([9, 8, 7, 6, 5]);
    const chunk = {
      type: 'chunk',
      v: PROTOCOL_VERSION,
      transfer: 't',
      from: 0,
      tensor: 'wte',
      offset: 1,
      total: 5,
      data: whole.subarray(1, 4),
      digest: 'x',
      whole: 'y',
    } as const;
    const back = decode('s', encode(chunk), Chunk);
    expect(back.data).toBeInstanceOf(Float32Array);
    expect(Array.from(back.data)).toEqual([8, 7, 6]);
  });

  it('typed arrays are not spelled out as numbers: payload size tracks the byte length', () => {
    const data = new Float32Array(1000);
    const bytes = encode({ type: 'chunk', v: PROTOCOL_VERSION, transfer: 't', tensor: 'x', offset: 0, total: 1000, data, digest: '', whole: '' });
    // 4000 bytes of floats plus a few dozen bytes of framing; a list of 1000 float32 numbers
    // would be 5000 bytes (1 tag byte + 4 per number).
    expect(bytes.length).toBeGreaterThanOrEqual(4000);
    expect(bytes.length).toBeLessThan(4100);
  });

  it('a chunk travels framed: its elements follow the header raw, bit for bit, and are read where they arrived', () => {
    const data = new Float32Array([-0, 1e-45, Number.NaN, Infinity, 0.1, -3.5]);
    const chunk = { type: 'chunk', v: PROTOCOL_VERSION, transfer: 't', from: 'supervisor', tensor: 'wte', offset: 0, total: 6, data, digest: 'a', whole: 'b' } as const;
    const bytes = encode(chunk);
    expect(Array.from(bytes.subarray(0, 4))).toEqual(Array.from(FRAME));
    // The elements end the message, as they are in memory.
    expect(bits(bytes.subarray(bytes.length - data.byteLength))).toBe(bits(data));
    const back = decode('s', bytes, Chunk);
    expect(bits(back.data)).toBe(bits(data));
    expect({ ...back, data: undefined }).toEqual({ ...chunk, data: undefined });
    // On a 4-byte boundary the elements are a view of the message, not a copy.
    expect(back.data.buffer).toBe(bytes.buffer);
    // Off it (a message that arrived at an odd place in a read), they are copied, equal.
    const odd = new Uint8Array(bytes.length + 1).subarray(1);
    odd.set(bytes);
    const moved = decode('s', odd, Chunk);
    expect(moved.data.buffer).not.toBe(odd.buffer);
    expect(bits(moved.data)).toBe(bits(data));
    // Messages come as Node.js Buffers, often views of a larger pool: the copy is the elements alone.
    const pool = Buffer.alloc(bytes.length + 4096);
    const inPool = pool.subarray(1, 1 + bytes.length);
    inPool.set(bytes);
    const pooled = decode('s', inPool, Chunk);
    expect(pooled.data.length).toBe(data.length);
    expect(bits(pooled.data)).toBe(bits(data));
  });

  it('a chunk framed into reused bytes is the same message: every byte of the frame is written, none past it', () => {
    const data = new Float32Array([1, 2, 3, 4, 5]);
    // A header whose length is not a multiple of 4, so that the frame has padding to write.
    for (const tensor of ['w', 'wt', 'wte', 'wtee']) {
      const chunk = { type: 'chunk', v: PROTOCOL_VERSION, transfer: 't', from: 0, tensor, offset: 0, total: 5, data, digest: 'a', whole: 'b' } as const;
      const fresh = encode(chunk);
      const dirty = new Uint8Array(fresh.length + 64).fill(0xab);
      const reused = encode(chunk, (size) => {
        expect(size).toBe(fresh.length);
        return dirty;
      });
      expect(bits(reused)).toBe(bits(fresh));
      expect(reused.buffer).toBe(dirty.buffer);
      expect(dirty[fresh.length]).toBe(0xab);
    }
  });

  it('a large message encoded into an array of its own is the same bytes, whether the room was enough or not, and the messages after it are unchanged', () => {
    const weights = Float32Array.from({ length: 300_000 }, (_, i) => Math.sin(i));
    const moments = Float32Array.from({ length: 300_000 }, (_, i) => i / 7);
    const message = { type: 'shard', v: PROTOCOL_VERSION, model: 'actor', rank: 0, checkpoint: { tensors: [{ name: 'w', shape: [300_000], data: weights }], moments: [moments] } };
    const plain = encode(message);
    const small = encode({ type: 'ping', v: PROTOCOL_VERSION, n: 1 });
    const typed = weights.byteLength + moments.byteLength;
    const sized = encodeSized(message, typed);
    expect(bits(sized)).toBe(bits(plain));
    expect(sized.byteOffset).toBe(0); // an array of its own
    // Too little room: msgpackr grows it, the bytes the same.
    expect(bits(encodeSized(message, 1000))).toBe(bits(plain));
    expect(bits(encode({ type: 'ping', v: PROTOCOL_VERSION, n: 1 }))).toBe(bits(small));
    // A message encoded after it does not share its array.
    expect(encode({ type: 'ping', v: PROTOCOL_VERSION, n: 2 }).buffer).not.toBe(sized.buffer);
  });

  it('replies decode with the Reply union', () => {
    const ok = decode('s', encode({ type: 'result', v: PROTOCOL_VERSION, id: 'a', body: { x: new Float32Array([1.5]) } }), Reply);
    expect(ok.type).toBe('result');
    const err = decode('s', encode({ type: 'error', v: PROTOCOL_VERSION, id: 'a', code: 'busy', message: 'm' }), Reply);
    expect(err).toEqual({ type: 'error', v: PROTOCOL_VERSION, id: 'a', code: 'busy', message: 'm' });
  });
});

describe('decode errors name the subject and the problem', () => {
  const framed = (header: Uint8Array, tail: Uint8Array = new Uint8Array(0), length = header.length) => {
    const pad = (4 - ((8 + header.length) % 4)) % 4;
    const out = new Uint8Array(8 + header.length + pad + tail.length);
    out.set(FRAME);
    new DataView(out.buffer).setUint32(4, length, true);
    out.set(header, 8);
    out.set(tail, 8 + header.length + pad);
    return out;
  };
  const chunkHeader = { type: 'chunk', v: PROTOCOL_VERSION, transfer: 't', from: 0, tensor: 'x', offset: 0, total: 2, digest: 'a', whole: 'b' };

  it('a frame whose header runs past its end', () => {
    const e = decodeError(framed(raw.pack(chunkHeader), new Uint8Array(8), 4096), Chunk);
    expect(e.message).toContain('says its header has 4096 bytes, past its end');
  });

  it("a frame whose header is not msgpack, or not a map, or holds 'data'", () => {
    expect(decodeError(framed(new Uint8Array([0x82, 0xa1])), Chunk).message).toContain("a framed message's header (2 bytes) is not msgpack");
    expect(decodeError(framed(raw.pack([1, 2])), Chunk).message).toContain("expected a framed message's header to be a msgpack map, got an array");
    expect(decodeError(framed(raw.pack({ ...chunkHeader, data: 1 }), new Uint8Array(8)), Chunk).message).toContain("may not hold 'data'");
  });

  it('a frame whose elements are not whole float32s', () => {
    const e = decodeError(framed(raw.pack(chunkHeader), new Uint8Array(7)), Chunk);
    expect(e.message).toContain('expected a multiple of 4 bytes after the header, got 7');
  });

  it('a frame that is not a chunk goes through the schema like any message', () => {
    const e = decodeError(framed(raw.pack({ ...chunkHeader, offset: -1 }), new Uint8Array(8)), Chunk);
    expect(e.message).toMatch(/offset/);
  });

  it('garbage bytes (not msgpack)', () => {
    const e = decodeError(new TextEncoder().encode('hello world'));
    expect(e.subject).toBe(SUBJECT);
    expect(e.message).toContain(`bad message on ${SUBJECT}:`);
    expect(e.problem).toMatch(/^not msgpack \(11 bytes\): /);
    expect(e.cause).toBeInstanceOf(Error);
  });

  it('truncated msgpack', () => {
    const whole = encode(generateCall());
    const e = decodeError(whole.subarray(0, whole.length - 5));
    expect(e.problem).toMatch(new RegExp(`^not msgpack \\(${whole.length - 5} bytes\\)`));
  });

  it('a msgpack number instead of a map', () => {
    const e = decodeError(raw.pack(42));
    expect(e.subject).toBe(SUBJECT);
    expect(e.problem).toBe("expected a msgpack map with 'type' and 'v', got number");
  });

  it('a msgpack array instead of a map', () => {
    const e = decodeError(raw.pack([1, 2]));
    expect(e.problem).toMatch(/^expected a msgpack map with 'type' and 'v'/);
  });

  it('a wrong protocol version', () => {
    const e = decodeError(raw.pack({ ...generateCall(), v: PROTOCOL_VERSION - 1 }));
    expect(e.problem).toBe(`expected protocol version v=${PROTOCOL_VERSION}, got ${PROTOCOL_VERSION - 1}`);
  });

  it('no protocol version', () => {
    const { v: _v, ...rest } = generateCall();
    const e = decodeError(raw.pack(rest));
    expect(e.problem).toBe(`expected protocol version v=${PROTOCOL_VERSION}, got none`);
  });

  it('a missing type', () => {
    const { type: _type, ...rest } = generateCall();
    const e = decodeError(raw.pack(rest));
    expect(e.subject).toBe(SUBJECT);
    // Issue lines start with the field path; the missing value is reported as "nothing".
    expect(e.problem).toMatch(/^message type undefined: type: .*\(got nothing\)$/);
  });

  it('a message wrong in many places gives a short error: three problems and a count of the rest', () => {
    // A reward actor that scores NaN for 64 items.
    const reply = { type: 'reward.reply', v: REWARD_PROTOCOL_VERSION, id: 'r1', instance: 'i', scores: Array.from({ length: 64 }, (_, i) => ({ id: `${i}`, score: Number.NaN })) };
    let problem = '';
    try {
      decode(SUBJECT, raw.pack(reply), RewardReply, REWARD_PROTOCOL_VERSION);
    } catch (e) {
      problem = (e as ProtocolError).problem;
    }
    expect(problem).toMatch(/^message type "reward\.reply": scores\[0\]\.score: .*; scores\[1\]\.score: .*; scores\[2\]\.score: .*; … and 61 more$/);
    expect(problem.length).toBeLessThan(400);
  });

  it('a wrong field type names the field path', () => {
    const call = generateCall();
    const e = decodeError(raw.pack({ ...call, body: { ...call.body, batch: 'two' } }));
    expect(e.problem).toMatch(/^message type "call": body\.batch: expected number.*\(got "two"\)$/);
  });

  it('a plain array where a typed array is required names the path and what came', () => {
    const call = generateCall();
    const e = decodeError(raw.pack({ ...call, body: { ...call.body, prompts: [1, 2, 3] } }));
    expect(e.problem).toBe('message type "call": body.prompts: expected a Int32Array (got an array of 3)');
  });

  it('the wrong typed array class is refused (Float32Array where Int32Array is required)', () => {
    const call = generateCall();
    const e = decodeError(encode({ ...call, body: { ...call.body, prompts: new Float32Array([1, 2]) } }));
    expect(e.problem).toBe('message type "call": body.prompts: expected a Int32Array (got Float32Array(2))');
  });

  it('an unknown key at the top level (strict objects)', () => {
    const e = decodeError(raw.pack({ ...generateCall(), extra: 1 }));
    expect(e.problem).toBe(`message type "call": extra: unknown key`);
  });

  it('an unknown key in a nested object names where', () => {
    const call = trainCall();
    if (call.body.fn !== 'train') throw new Error('unreachable');
    const e = decodeError(raw.pack({ ...call, body: { ...call.body, loss: { ...call.body.loss, paramz: {} } } }));
    expect(e.problem).toBe(`message type "call": body.loss.paramz: unknown key`);
  });

  it('an error reply with an unknown code', () => {
    const e = decodeError(raw.pack({ type: 'error', v: PROTOCOL_VERSION, code: 'oops', message: 'm' }), Reply);
    expect(e.problem).toMatch(/^message type "error": code: /);
    expect(e.problem).toContain('(got "oops")');
  });
});
