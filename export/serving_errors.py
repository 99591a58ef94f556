"""TF Serving's error model for the development server.

Holds :class:`ServingError` (an error with a TF Serving status code such as
``INVALID_ARGUMENT``), the status code -> HTTP status mapping the REST front end answers with,
the helpers that build the common errors (:func:`invalid`, the "Did you mean ...?" hint of
:func:`closest`, :func:`clip` for names a client sent), and :func:`tf_error_to_serving`,
which turns whatever a signature call raised into a ServingError with a readable message.
"""

from __future__ import annotations

import difflib

import tensorflow as tf

# TF Serving's mapping of status codes to HTTP (tensorflow_serving/model_servers/http_server.cc).
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
               "NOT_FOUND": 404, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503,
               "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNKNOWN": 500,
               "DEADLINE_EXCEEDED": 504}


class ServingError(Exception):
    """An error with a TF Serving status code (``INVALID_ARGUMENT``, ``NOT_FOUND``, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def invalid(message: str) -> ServingError:
    """An ``INVALID_ARGUMENT`` error (HTTP 400)."""
    return ServingError("INVALID_ARGUMENT", message)


def clip(text: str, limit: int = 100) -> str:
    """`text` cut to `limit` characters (client-supplied names echoed in messages)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def closest(word: str, options: list[str]) -> str:
    """`` Did you mean '<option>'?`` for the nearest of `options`, or '' when none is near."""
    if len(word) > 100:  # no hint for absurd names (and no quadratic matching on them)
        return ""
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" Did you mean '{match[0]}'?" if match else ""


def tf_error_to_serving(err: Exception) -> ServingError:
    """What a signature call raised, as a ServingError (in-graph assertions -> INVALID_ARGUMENT)."""
    if isinstance(err, ServingError):
        return err
    if isinstance(err, tf.errors.InvalidArgumentError):
        message = err.message.split("\n")[0] if err.message else str(err)
        # Keep the in-graph assertion's message (and its data line) readable.
        lines = [line.strip() for line in (err.message or "").splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("[[") and "{{" not in line]
        return invalid(" ".join(lines[:3]) or message)
    if isinstance(err, tf.errors.OpError):
        return ServingError("INTERNAL", err.message)
    return ServingError("INTERNAL", f"{type(err).__name__}: {err}")
