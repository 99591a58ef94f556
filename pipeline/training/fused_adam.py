"""Keras's Adam with each variable's update in TensorFlow's fused ``ResourceApplyAdam`` kernel.

Keras 3's ``Adam.update_step`` builds the update of every variable from about twenty small ops
(two powers, the step size, then sub, mul and assign for each moment and the variable), each a
pass over the variable. TensorFlow's ``ResourceApplyAdam`` does the same arithmetic in one
pass. The formula is the same as Keras's (``alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)``;
``m += (g - m) * (1 - beta_1)``; ``v += (g^2 - v) * (1 - beta_2)``;
``var -= alpha * m / (sqrt(v) + epsilon)``), on the same slot variables, so checkpoints,
``BackupAndRestore``, gradient accumulation, clipping and loss scaling (all outside
``update_step``) are unchanged. For the ``small`` preset on a 2-core CPU the optimizer's op time
per step fell from 28 to 11 ms and a step ran about 1.04x faster (``bench/train_step_profile.py``,
docs/RECIPE.md "Throughput"). ``amsgrad`` keeps Keras's own update.

With ``use_ema`` (``train.ema_momentum``) the moving average is Keras's, but it does not replace
the weights at the end of ``fit``: the run keeps its trained weights (its last checkpoint), and
``checkpoints.StepCheckpoints`` writes the average beside them (``ema-<step>.weights.h5``) as
one more candidate for the final weights.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="aiayn")
class FusedAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` (same arguments, same slots) with a fused per-variable update."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        # The TensorFlow backend hands over the tf.Variable (``keras.Variable.value``).
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.value.handle, v=v.value.handle,
            beta1_power=tf.pow(beta_1, local_step), beta2_power=tf.pow(beta_2, local_step),
            lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype),
            use_locking=False)

    def finalize_variable_values(self, var_list):
        """Leaves the trained weights in place (Keras would copy the moving average into them)."""
