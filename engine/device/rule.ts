// A rule reward on a device: the task's rule, or a dataset's verifier, as a model without
// parameters whose inference scores whole sequences.
import type { ModelSpec } from '../../mesh/wire/index.ts';
import { TextTokenizer, responseLength } from '../model/index.ts';
import { CallRejected } from './checks.ts';
import { makeTask, TASKS, type TaskName } from './task.ts';
import { VERIFIERS, verifier, type VerifierName } from './verify.ts';

/**
 * A rule reward: a model with no parameters whose inference scores whole sequences. A digit
 * task's rule knows the answer from the prompt; a verifier reads each response through the
 * tokenizer and checks it against the reference answer the call carries for its row.
 */
export class RuleShard {
  private readonly score: (prompt: Int32Array, response: Int32Array, answer: string | undefined) => number;
  constructor(spec: Extract<ModelSpec, { kind: 'rule' }>) {
    const rules = [...TASKS, ...VERIFIERS];
    if ((VERIFIERS as readonly string[]).includes(spec.rule)) {
      if (spec.tokenizer === undefined) throw new CallRejected('malformed', `the '${spec.rule}' verifier reads responses as text; the rule names no tokenizer`);
      let tokenizer: TextTokenizer;
      try {
        tokenizer = TextTokenizer.load(spec.tokenizer);
      } catch (e) {
        throw new CallRejected('malformed', (e as Error).message);
      }
      const check = verifier(spec.rule as VerifierName);
      this.score = (_, response, answer) => {
        if (answer === undefined) throw new CallRejected('malformed', `the '${spec.rule}' verifier checks each response against its reference answer; the call carries none`);
        return check(tokenizer.decode(response.subarray(0, responseLength(response, tokenizer.eos)).filter((t) => t !== tokenizer.eos)), answer);
      };
    } else if ((TASKS as readonly string[]).includes(spec.rule)) {
      if (spec.digits === undefined || spec.base === undefined) throw new CallRejected('malformed', `the '${spec.rule}' rule needs the task's digits and base`);
      const task = makeTask(spec.rule as TaskName, spec.digits, spec.base);
      this.score = (prompt, response) => task.score(prompt, response);
    } else {
      throw new CallRejected('unsupported', `unknown reward rule '${spec.rule}'; expected one of ${rules.join(', ')}`);
    }
  }
  scores(tokens: Int32Array, batch: number, promptLen: number, answers?: readonly string[]): Float32Array {
    if (answers !== undefined && answers.length !== batch) throw new CallRejected('malformed', `answers: expected one per row (${batch}), got ${answers.length}`);
    const width = tokens.length / batch;
    const out = new Float32Array(batch);
    for (let b = 0; b < batch; b++) {
      const row = tokens.subarray(b * width, (b + 1) * width);
      out[b] = this.score(row.subarray(0, promptLen), row.subarray(promptLen), answers?.[b]);
    }
    return out;
  }
}
