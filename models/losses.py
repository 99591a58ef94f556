"""Label-smoothed cross-entropy and token accuracy over real (non-padding) target tokens."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="aiayn")
class MaskedLabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against ``(1 - eps) * one_hot + eps / V`` (§5.4, eps_ls = 0.1).

    Padding positions (``y_true == pad_id``) get no loss and no weight: the result is the mean
    over real target tokens. The padding mask (times any ``sample_weight``) is handed to
    Keras's own reduction ``"mean_with_sample_weight"`` as the sample weight, which divides by
    the number of real tokens and scales by ``1 / num_replicas`` under ``tf.distribute`` (per
    replica: the mean over its real tokens; gradients summed over replicas average them).

    Args:
      label_smoothing: eps in ``[0, 1)``.
      pad_id: the padding id of the labels (from the tokenizer).

    Call args:
      y_true: int ``(batch_size, tgt_len)``; y_pred: logits ``(batch_size, tgt_len, V)``.

    Returns:
      float32 scalar.

    Raises:
      ValueError: ``label_smoothing`` outside ``[0, 1)``.
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy",
                 reduction="mean_with_sample_weight", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1). Received: {label_smoothing}. "
                "The paper uses 0.1.")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def __call__(self, y_true, y_pred, sample_weight=None):
        weight = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:  # one weight per sentence
                sample_weight = sample_weight[:, None]
            weight = weight * sample_weight
        return super().__call__(y_true, y_pred, sample_weight=weight)

    def call(self, y_true, y_pred):
        labels = ops.cast(y_true, "int32")  # (B, T)
        logits = ops.cast(y_pred, "float32")  # (B, T, V)
        # -log p(label): the fused sparse softmax cross-entropy kernel (no (B, T, V) one-hot,
        # no gather of log-probabilities and its scatter gradient).
        nll = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # (B, T)
        # Cross-entropy with the uniform part of the smoothed target:
        # -mean_v log p_v = logsumexp(logits) - mean_v logits, and logsumexp(logits) =
        # nll + logits[label]; so the smoothed loss (1 - eps) nll + eps (lse - mean) is
        # nll + eps (logits[label] - mean). No second softmax pass over the vocabulary: the
        # label logit is one gather from the flattened logits (its gradient a scatter).
        vocab = ops.shape(logits)[-1]
        flat_labels = ops.reshape(labels, (-1,))  # (B * T,)
        rows = ops.arange(ops.shape(flat_labels)[0], dtype="int32")
        picked = ops.take(ops.reshape(logits, (-1,)), rows * vocab + flat_labels)  # (B * T,)
        picked = ops.reshape(picked, ops.shape(labels))  # (B, T)
        losses = nll + self.label_smoothing * (picked - ops.mean(logits, axis=-1))
        return losses  # (B, T); padding is weighted 0 in __call__

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id)
        return config


@keras.saving.register_keras_serializable(package="aiayn")
class MaskedAccuracy(keras.metrics.Metric):
    """Share of real target tokens (``y_true != pad_id``) whose argmax prediction is right.

    Keeps two sums (correct, real tokens), so it aggregates exactly across batches and
    replicas.

    Args:
      pad_id: the padding id of the labels.
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                         name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weight = ops.cast(ops.not_equal(labels, self.pad_id), "float32")  # (B, T)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:
                sample_weight = sample_weight[:, None]
            weight = weight * sample_weight
        hits = ops.cast(ops.equal(labels, predictions), "float32") * weight
        self.correct.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        config = super().get_config()
        config.update(pad_id=self.pad_id)
        return config
