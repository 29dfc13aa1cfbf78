// The clipped value loss: ½·max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²) over the tokens.
import * as tf from '@tensorflow/tfjs';
import { z } from 'zod';
import { defineLoss } from './define.ts';
import { tokenShare, valueLoss } from './reduce.ts';

export const clipValue = defineLoss({
  name: 'clip_value',
  summary: 'the clipped value loss ½·max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²)',
  head: 'value',
  params: z.strictObject({ clip: z.number().positive().default(0.2).describe('how far a value may move from V_old before it is clipped') }),
  ports: ['old', 'returns'],
  stats: ['clipfrac'],
  compute: ({ pred, data, mask, norm, params: p }) => ({
    loss: valueLoss(pred, data.old!, data.returns!, p.clip, mask, norm),
    stats: { clipfrac: tokenShare(tf.greater(tf.abs(tf.sub(pred, data.old!)), p.clip), mask, norm) },
  }),
});
