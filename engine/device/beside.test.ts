import { describe, expect, it } from 'vitest';
import { PROTOCOL_VERSION, type Call, type CallBody } from '../../mesh/wire/index.ts';
import { besideProblem, touches } from './beside.ts';

const call = (model: string, body: CallBody, beside = false): Call => ({
  type: 'call',
  v: PROTOCOL_VERSION,
  id: `${model}-${body.fn}`,
  model,
  iteration: 0,
  body,
  ...(beside ? { beside: true as const } : {}),
});
const realloc = (source: string, gives: boolean, takes: boolean): CallBody => ({
  fn: 'realloc',
  realloc: 'x',
  source,
  sends: gives ? [{ transfer: 't', pieces: [], to: [1] }] : [],
  recvs: takes ? [{ transfer: 't', pieces: [], from: 0 }] : [],
  locals: [],
  chunkBytes: 1024,
});
const generate: CallBody = { fn: 'generate', prompts: new Int32Array(2), batch: 1, promptLen: 2, responseLen: 2, seeds: new Uint32Array(1), temperature: 1, topP: 1 } as CallBody;

describe('calls beside the running one', () => {
  it('a reallocation reads its source where it sends and changes its target where it receives', () => {
    expect(touches(call('v1', realloc('actor', true, false)))).toEqual({ reads: ['actor'], writes: [] });
    expect(touches(call('v1', realloc('actor', false, true)))).toEqual({ reads: [], writes: ['v1'] });
    expect(touches(call('v1', generate))).toEqual({ reads: ['v1'], writes: [] });
  });

  it("the next version's view fills beside a generation on the last one", () => {
    const running = call('actor@gen', generate);
    expect(
      besideProblem(
        running,
        call('actor@gen~1', { fn: 'load', role: 'actor', spec: { kind: 'policy', vocab: 5, context: 6, layers: 1, width: 8, heads: 2 }, layout: { devices: [0], dp: 1, tp: 1, pp: 1 }, rank: 0 }, true),
      ),
    ).toBeUndefined();
    expect(besideProblem(running, call('actor@gen~1', realloc('actor', true, true), true))).toBeUndefined();
    expect(besideProblem(running, call('actor@gen', { fn: 'release' }, true))).toMatch(/both touch 'actor@gen'/);
  });

  it('nothing that changes what the running call reads, or the other way round, and only load, realloc and release beside', () => {
    const training = call('actor', { fn: 'release' });
    expect(besideProblem(training, call('v', realloc('actor', true, false), true))).toMatch(/both touch 'actor'/);
    expect(besideProblem(call('actor', generate), call('actor', generate, true))).toMatch(/'generate' cannot run beside another call/);
    expect(besideProblem(call('a', generate), call('b', generate))).toMatch(/not marked to run beside/);
    expect(besideProblem(call('a', generate), call('*', { fn: 'reset', epoch: 1 }, true))).toMatch(/cannot run beside/);
  });
});
