"""Encoding and decoding of TF Serving payloads, shared by the clients and the development server.

One place for the conversions both sides of the wire make:

* text inputs -> UTF-8 bytes, a ``tf.string`` tensor or a ``TensorProto``
  (:func:`encode_texts`, :func:`texts_tensor`, :func:`texts_proto`);
* ``TensorProto`` <-> numpy (:func:`proto_to_array`, :func:`array_to_proto`);
* numpy outputs -> JSON-able Python values, bytes decoded as UTF-8 (:func:`to_python`,
  :func:`protos_to_python`, :func:`tensors_to_python`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf


def encode_texts(texts: Iterable[str | bytes]) -> list[bytes]:
    """Strings as UTF-8 bytes; bytes pass unchanged."""
    return [t.encode("utf-8") if isinstance(t, str) else t for t in texts]


def texts_tensor(texts: Iterable[str | bytes]) -> tf.Tensor:
    """A ``tf.string`` tensor of shape ``(batch,)`` for a signature's text input."""
    return tf.constant(encode_texts(texts), tf.string)


def texts_proto(texts: Iterable[str | bytes]):
    """A ``DT_STRING`` TensorProto of shape ``[batch]`` (a gRPC PredictRequest input)."""
    return tf.make_tensor_proto(encode_texts(texts), dtype=tf.string)


def proto_to_array(proto) -> np.ndarray:
    """A TensorProto as numpy: strings as an object array of bytes.

    A tensor of another dtype becomes zeros of its shape and dtype, enough for the caller to
    report the dtype (or shape) it did not expect without reading the values.
    """
    if proto.dtype != tf.string.as_datatype_enum:
        return np.zeros([d.size for d in proto.tensor_shape.dim],
                        dtype=tf.as_dtype(proto.dtype).as_numpy_dtype)
    return tf.make_ndarray(proto)


def array_to_proto(value: np.ndarray):
    """A numpy output (numbers, or an object array of bytes) as a TensorProto."""
    return tf.make_tensor_proto(value)


def to_python(value: Any, errors: str = "strict") -> Any:
    """numpy -> JSON-able Python: arrays to (nested) lists, bytes to str, scalars to numbers.

    Args:
      value: a numpy array or scalar, bytes, or a Python value (returned as it is).
      errors: how undecodable UTF-8 is handled (``bytes.decode``'s `errors`).
    """
    if isinstance(value, np.ndarray):
        return [to_python(v, errors) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors=errors)
    if isinstance(value, np.generic):
        return value.item()
    return value


def protos_to_python(protos: Mapping[str, Any]) -> dict[str, Any]:
    """A PredictResponse's ``outputs`` map as ``{name: to_python(values)}``."""
    return {k: to_python(tf.make_ndarray(v)) for k, v in protos.items()}


def tensors_to_python(tensors: Mapping[str, tf.Tensor]) -> dict[str, Any]:
    """A signature's eager outputs as ``{name: to_python(values)}``."""
    return {k: to_python(v.numpy()) for k, v in tensors.items()}
