"""Label-smoothed cross-entropy and token accuracy over real (non-padding) target tokens."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def output_positions(output_ids):
    """``output_ids`` (the token ids a model's logits cover, in their order) -> a function that
    maps int labels ``(B, T)`` to ``(positions, known)``: each label's column in those logits,
    and whether the label is one of them at all (a label outside them gets column 0 and
    ``known`` False). ``None`` (logits over the whole vocabulary): labels are their own
    columns, all known.
    """
    if output_ids is None:
        return lambda labels: (labels, None)
    ids = np.asarray(output_ids, dtype="int64")
    table = np.full(int(ids.max()) + 2, -1, dtype="int32")  # the last entry: any larger id
    table[ids] = np.arange(len(ids), dtype="int32")
    last = len(table) - 1

    def positions(labels):
        column = ops.take(ops.convert_to_tensor(table), ops.clip(labels, 0, last))
        return ops.maximum(column, 0), ops.greater_equal(column, 0)

    return positions


def _smoothed_cross_entropy(labels, logits, eps):
    """Cross-entropy against ``(1 - eps) * one_hot(label) + eps / V``, with its gradient.

    ``labels`` int32 ``(B, T)``, ``logits`` float32 ``(B, T, V)`` -> ``(B, T)``. With
    ``s = z - max(z)``, the value is ``log(sum(exp(s))) - (1 - eps) * s[label] - eps * mean(s)``
    and the gradient ``softmax(z) - eps / V``, less ``1 - eps`` at each label, written out by
    hand: one exp pass over the logits shared by both, and the label term scattered into the
    ``B * T`` label positions instead of a ``(B, T, V)`` one-hot.

    The logits are never reshaped here: under mixed precision they come from a cast of the
    model's bfloat16 projection, and TensorFlow's graph optimizer moves a widening cast below a
    reshape by giving that consumer its own copy of the cast, so reshaping them cost one extra
    ``(B * T, V)`` cast per reshaping consumer (two, with the accuracy metric's gather). The
    label gather reads ``s``, which is not a cast. A ``small`` step ran 1.09x faster than with
    the 2-D loss and one-hot gradient before it (``bench/train_step_profile.py``,
    docs/RECIPE.md "Throughput").
    """
    vocab = ops.shape(logits)[-1]

    @ops.custom_gradient
    def loss_fn(z):
        peak = ops.max(z, axis=-1, keepdims=True)  # (B, T, 1), for a stable exp
        shifted = z - peak
        exp = ops.exp(shifted)  # (B, T, V)
        total = ops.sum(exp, axis=-1, keepdims=True)  # (B, T, 1)
        index = (ops.arange(ops.size(labels), dtype="int32") * vocab
                 + ops.reshape(labels, (-1,)))
        label_shifted = ops.reshape(ops.take(ops.reshape(shifted, (-1,)), index),
                                    ops.shape(labels))
        value = (ops.log(total)[..., 0] - (1.0 - eps) * label_shifted
                 - eps * ops.mean(shifted, axis=-1))

        def grad(*args, upstream=None):
            if upstream is None:  # TensorFlow passes the upstream gradient positionally
                (upstream,) = args
            upstream = upstream[..., None]  # (B, T, 1)
            uniform = ops.cast(eps, z.dtype) / ops.cast(vocab, z.dtype)
            dz = exp * (upstream / total) - upstream * uniform  # (B, T, V)
            flat = ops.reshape(dz, (-1,))
            at_label = ops.take(flat, index) - (1.0 - eps) * ops.reshape(upstream, (-1,))
            return ops.reshape(ops.scatter_update(flat, index[:, None], at_label), ops.shape(z))

        return value, grad

    return loss_fn(logits)


@keras.saving.register_keras_serializable(package="aiayn")
class MaskedLabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against ``(1 - eps) * one_hot + eps / V`` (§5.4, eps_ls = 0.1).

    Padding positions (``y_true == pad_id``) get no loss and no weight: the result is the mean
    over real target tokens. With ``output_ids`` (a model whose logits cover only those ids,
    ``Transformer(output_ids=...)``), the labels are read as columns of those logits, the
    smoothing is spread over them, and a label outside them (a piece the model cannot produce)
    gets no loss and no weight either. The padding mask (times any ``sample_weight``) is handed to
    Keras's own reduction ``"mean_with_sample_weight"`` as the sample weight, which divides by
    the number of real tokens and scales by ``1 / num_replicas`` under ``tf.distribute`` (per
    replica: the mean over its real tokens; gradients summed over replicas average them).

    Args:
      label_smoothing: eps in ``[0, 1)``.
      pad_id: the padding id of the labels (from the tokenizer).
      output_ids: the token ids of the logits' columns, in order (``Transformer.output_ids``);
        None: every id of the vocabulary, column = id.

    Call args:
      y_true: int ``(batch_size, tgt_len)`` token ids; y_pred: logits ``(batch_size, tgt_len,
        V)`` (``V = len(output_ids)`` when given).

    Returns:
      float32 scalar.

    Raises:
      ValueError: ``label_smoothing`` outside ``[0, 1)``.
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy",
                 reduction="mean_with_sample_weight", dtype=None, output_ids=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1). Received: {label_smoothing}. "
                "The paper uses 0.1.")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id
        self.output_ids = None if output_ids is None else [int(i) for i in output_ids]
        self._positions = output_positions(self.output_ids)

    def __call__(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        weight = _token_weight(labels, self.pad_id, sample_weight)
        columns, known = self._positions(labels)
        if known is not None:
            weight = weight * ops.cast(known, "float32")
        return super().__call__(columns, y_pred, sample_weight=weight)

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")  # (B, T)
        logits = ops.cast(y_pred, "float32")  # (B, T, V)
        return _smoothed_cross_entropy(labels, logits, self.label_smoothing)  # (B, T)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id,
                      output_ids=self.output_ids)
        return config


def _token_weight(labels, pad_id, sample_weight):
    """1 for real tokens, 0 for padding, times ``sample_weight`` (per token or per sentence)."""
    weight = ops.cast(ops.not_equal(labels, pad_id), "float32")
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, "float32")
        if len(sample_weight.shape) == 1:  # one weight per sentence
            sample_weight = sample_weight[:, None]
        weight = weight * sample_weight
    return weight


@keras.saving.register_keras_serializable(package="aiayn")
class MaskedAccuracy(keras.metrics.Metric):
    """Share of real target tokens (``y_true != pad_id``) whose argmax prediction is right.

    A token is right when its label's logit is the largest of its row (a tie with another
    logit, which ``argmax`` would break by index, counts as right). That takes one max over
    the ``(B, T, V)`` logits and a gather of ``B * T`` values; ``keras.ops.argmax`` on the
    TensorFlow backend first rewrites every ``-0.0`` logit (a bitcast, a bitwise and, two
    compares and a select over all ``B * T * V`` values): 9% of the op time of a training step
    of the ``small`` preset on a 2-core CPU, whose steps ran 1.055x faster without it
    (docs/RECIPE.md, "Throughput").

    Keeps two sums (correct, real tokens), so it aggregates exactly across batches and
    replicas.

    Args:
      pad_id: the padding id of the labels.
      output_ids: as :class:`MaskedLabelSmoothedCrossEntropy`'s (a label outside them is not
        counted).
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype=None, output_ids=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.pad_id = pad_id
        self.output_ids = None if output_ids is None else [int(i) for i in output_ids]
        self._positions = output_positions(self.output_ids)
        self.correct = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                         name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        weight = _token_weight(labels, self.pad_id, sample_weight)  # (B, T)
        columns, known = self._positions(labels)
        if known is not None:
            weight = weight * ops.cast(known, "float32")
        label_logits = ops.take_along_axis(y_pred, columns[..., None], axis=-1)[..., 0]
        right = ops.greater_equal(label_logits, ops.max(y_pred, axis=-1))
        hits = ops.cast(right, "float32") * weight
        self.correct.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config.update(pad_id=self.pad_id, output_ids=self.output_ids)
        return config
