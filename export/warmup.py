"""TF Serving warmup requests: one sentence per length bucket, replayed before a version serves.

``assets.extra/tf_serving_warmup_requests`` is a TFRecord of ``PredictionLog`` protos (at most
1000 are read by the stock server). :func:`warmup_texts` picks the sentences,
:func:`write_warmup_requests` writes the file, :func:`read_warmup_requests` reads it back (the
development server and the verifier replay it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from aiayn.export.codec import texts_proto

SERVING_SIGNATURE = "serving_default"
NBEST_SIGNATURE = "n_best"
INPUT_KEY = "text"


def _text_of_length(tokenizer: Any, n_tokens: int, offset: int) -> str:
    """A deterministic sentence of about ``n_tokens`` subword pieces of the vocabulary."""
    specials = {tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id}
    ordinary = [i for i in range(min(tokenizer.vocabulary_size, 4096)) if i not in specials]
    ids = [ordinary[(offset + 7 * k) % len(ordinary)] for k in range(max(n_tokens, 1))]
    text = tokenizer.detokenize(tf.ragged.constant([ids], dtype=tf.int32))
    return text.numpy()[0].decode("utf-8", errors="replace")


def warmup_texts(tokenizer: Any, bucket_boundaries: Sequence[int], limit: int) -> list[str]:
    """One sentence per length bucket (capped at the input limit)."""
    lengths = sorted({min(b, limit) for b in bucket_boundaries} | {min(4, limit)})
    texts = []
    for i, n in enumerate(lengths):
        # Detokenise-then-tokenise need not round-trip: shorten until it fits the limit (a
        # warmup request that the export rejects would stop the server loading the version).
        for k in range(n, 0, -1):
            text = _text_of_length(tokenizer, k, offset=i)
            count = int(tokenizer.tokenize(tf.constant([text])).row_lengths()[0])
            if count <= limit:
                texts.append(text)
                break
    return texts


def write_warmup_requests(path: str | os.PathLike, model_name: str, texts: Sequence[str],
                          batch_sizes: Sequence[int] = (1, 8), n_best_texts: int = 1) -> int:
    """Writes PredictionLog records (PredictRequests) TF Serving replays before serving.

    Args:
      path: ``assets.extra/tf_serving_warmup_requests``.
      model_name: the servable name in each request's ModelSpec.
      texts: one text per length bucket; each becomes a request per batch size.
      batch_sizes: batch sizes to warm (the batcher pads to these shapes).
      n_best_texts: how many of the texts also warm the ``n_best`` signature.

    Returns:
      The number of records written (TF Serving reads at most 1000).
    """
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    count = 0
    with tf.io.TFRecordWriter(str(path)) as writer:
        def emit(signature: str, batch: list[str]) -> None:
            nonlocal count
            request = predict_pb2.PredictRequest()
            request.model_spec.name = model_name
            request.model_spec.signature_name = signature
            request.inputs[INPUT_KEY].CopyFrom(texts_proto(batch))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
            count += 1

        for text in texts:
            for size in batch_sizes:
                emit(SERVING_SIGNATURE, [text] * size)
        for text in texts[:n_best_texts]:
            emit(NBEST_SIGNATURE, [text])
    return count


def read_warmup_requests(path: str | os.PathLike) -> list[Any]:
    """Parses the warmup file back into PredictionLog protos (for tests and the verifier)."""
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record.numpy())
        logs.append(log)
    return logs


