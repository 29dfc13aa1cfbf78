// PPO's losses in TensorFlow.js, over [batch, responseLen] tensors (every response token counts).
import * as tf from '@tensorflow/tfjs';

/** Clipped surrogate: mean over tokens of −min(r·A, clip(r, 1−ε, 1+ε)·A), r = exp(logp − old). */
export function policyLoss(logprobs: tf.Tensor, old: tf.Tensor, advantages: tf.Tensor, clip: number): tf.Scalar {
  return tf.tidy(() => {
    const ratio = tf.exp(tf.sub(logprobs, old));
    const unclipped = tf.mul(ratio, advantages);
    const clipped = tf.mul(tf.clipByValue(ratio, 1 - clip, 1 + clip), advantages);
    return tf.neg(tf.mean(tf.minimum(unclipped, clipped))) as tf.Scalar;
  });
}

/** Clipped value loss: ½·mean(max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²)). */
export function valueLoss(values: tf.Tensor, old: tf.Tensor, returns: tf.Tensor, clip: number): tf.Scalar {
  return tf.tidy(() => {
    const clippedValues = tf.add(old, tf.clipByValue(tf.sub(values, old), -clip, clip));
    const a = tf.square(tf.sub(values, returns));
    const b = tf.square(tf.sub(clippedValues, returns));
    return tf.mul(0.5, tf.mean(tf.maximum(a, b))) as tf.Scalar;
  });
}

/** Bradley–Terry: mean of −log σ(r_chosen − r_rejected) = softplus(r_rejected − r_chosen). */
export function preferenceLoss(chosen: tf.Tensor, rejected: tf.Tensor): tf.Scalar {
  return tf.tidy(() => tf.mean(tf.softplus(tf.sub(rejected, chosen))) as tf.Scalar);
}
