"""The protocol-independent Predict of the development server.

:class:`Predictor` validates one Predict call (signature name, input names, dtype, rank,
UTF-8, batch size, input length against the export's limit) with TF Serving's messages, then
runs it through the servable's batcher. The REST and gRPC front ends both call it, so they
accept and reject exactly the same requests; the gRPC front end checks a tensor's declared
dtype, rank and size with the same messages (:func:`not_strings`, :func:`not_a_vector`,
:func:`batch_too_large`) before it reads any value.

A call holds a lease on the version it resolved (:meth:`ModelManager.lease`) until its answer
is computed, so a version being replaced finishes the requests it accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import numpy as np
import tensorflow as tf

from aiayn.export.manager import ModelManager
from aiayn.export.servables import Servable
from aiayn.export.serving_errors import ServingError, clip, closest, invalid, tf_error_to_serving

log = logging.getLogger("aiayn.export.server")

_DTYPE_NAMES = {np.dtype(np.float32): "DT_FLOAT", np.dtype(np.float64): "DT_DOUBLE",
                np.dtype(np.int32): "DT_INT32", np.dtype(np.int64): "DT_INT64",
                np.dtype(np.bool_): "DT_BOOL", np.dtype(object): "DT_STRING"}


def signature_or_default(key: str, servable: Servable) -> str:
    """The signature key to run ('' -> ``serving_default``), or INVALID_ARGUMENT if unknown."""
    key = key or "serving_default"
    if key not in servable.signatures:
        raise invalid(f"Serving signature key \"{clip(key)}\" not found. Available: "
                      f"{sorted(servable.signatures)}.{closest(key, list(servable.signatures))}")
    return key


def not_a_vector(input_name: str, shape: list[int]) -> ServingError:
    return invalid(f"Input '{clip(input_name)}' must be a vector of strings, shape [batch]; got "
                   f"shape {clip(str(list(shape)))}. Send one string per instance.")


def not_strings(input_name: str, dtype_name: str) -> ServingError:
    return invalid(f"Input '{clip(input_name)}' must be DT_STRING; got {dtype_name}. Send text.")


def batch_too_large(size: int, limit: int) -> ServingError:
    return invalid(f"Task size {size} is larger than maximum input batch size {limit}. Split "
                   f"the request into batches of at most {limit} (export.max_batch_size).")


def check_strings(values: np.ndarray, input_name: str) -> np.ndarray:
    """Validates a string input: rank 1, bytes, valid UTF-8. Returns an object array of bytes."""
    if values.ndim != 1:
        raise not_a_vector(input_name, list(values.shape))
    if values.dtype != object or not all(isinstance(v, bytes) for v in values):
        raise not_strings(input_name, _DTYPE_NAMES.get(values.dtype, str(values.dtype)))
    for i, value in enumerate(values):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise invalid(f"Input '{input_name}' element {i} is not valid UTF-8 (byte "
                          f"{err.start}: {value[err.start:err.start + 1]!r}). Send UTF-8 "
                          "text.") from None
    return values


def input_name_of(inputs: Iterable[str], expected: list[str]) -> str:
    """The one input of the signature, after checking the request names exactly the expected."""
    inputs = set(inputs)
    extra = sorted(inputs - set(expected))
    missing = sorted(set(expected) - inputs)
    if extra or missing:
        hint = closest(extra[0], expected) if extra else ""
        sent = clip(", ".join(sorted(inputs)), 200)
        raise invalid(f"input size does not match signature: {len(inputs)}!="
                      f"{len(expected)} len({{{sent}}}) != "
                      f"len({{{', '.join(expected)}}}). Sent extra: {clip(str(extra), 200)}. "
                      f"Missing but required: {missing}.{hint}")
    (input_name,) = expected
    return input_name


def _empty_outputs(servable: Servable, key: str) -> dict[str, np.ndarray]:
    """Outputs for a batch of zero rows, shaped and typed as the signature's."""
    return {k: np.zeros([0] + [d or 0 for d in spec.shape[1:]],
                        dtype=object if spec.dtype == tf.string else spec.dtype.as_numpy_dtype)
            for k, spec in servable.signature_outputs(key).items()}


class Predictor:
    """Validates and runs one Predict call; shared by the REST and gRPC front ends."""

    def __init__(self, manager: ModelManager):
        self.manager = manager

    def predict(self, name: str, version: int | None, signature_name: str,
                inputs: Mapping[str, np.ndarray], label: str | None = None
                ) -> tuple[Servable, str, dict[str, np.ndarray]]:
        """Resolves the servable (holding it until done), validates and runs one call."""
        with self.manager.lease(name, version, label) as servable:
            key, outputs = self.run(servable, signature_name, inputs)
        return servable, key, outputs

    def run(self, servable: Servable, signature_name: str, inputs: Mapping[str, np.ndarray]
            ) -> tuple[str, dict[str, np.ndarray]]:
        """Validates and runs one call on a servable the caller holds (a lease)."""
        key = signature_or_default(signature_name, servable)
        input_name = input_name_of(inputs, list(servable.signature_inputs(key)))
        values = np.asarray(inputs[input_name])
        if values.ndim == 1 and len(values) > servable.max_batch_size:
            raise batch_too_large(len(values), servable.max_batch_size)
        texts = check_strings(values, input_name)
        if len(texts) == 0:
            return key, _empty_outputs(servable, key)
        self._check_lengths(servable, texts)
        future = servable.batchers[key].submit(texts)
        try:
            outputs = future.result()
        except Exception as err:  # noqa: BLE001
            raise tf_error_to_serving(err) from None
        return key, outputs

    @staticmethod
    def _check_lengths(servable: Servable, texts: np.ndarray) -> None:
        """Rejects, or logs the truncation of, inputs over the export's token limit."""
        long = servable.long_inputs(texts)
        if long and servable.on_long_input == "reject":
            i, n = long[0]
            raise invalid(f"Input text is too long: element {i} has {n} subword tokens; the "
                          f"model accepts at most {servable.input_limit} "
                          "(export.max_input_tokens). Split it into sentences, or re-export "
                          "with export.on_long_input=truncate.")
        if long:
            log.warning("%s/%d: truncated %d input(s) to %d subword tokens: %s", servable.name,
                        servable.version, len(long), servable.input_limit,
                        ", ".join(f"#{i} ({n} tokens)" for i, n in long))
