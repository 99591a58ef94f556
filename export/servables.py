"""One loaded version of the development server: :class:`Servable`, and its signature metadata.

:class:`Servable` is one loaded version of one model: its signatures, the export's serving
options (``assets.extra/verify_samples.json``), the source featuriser that checks input lengths,
a :class:`~aiayn.export.batcher.Batcher` per signature, and a count of the requests that hold
it. :func:`signature_def_map` is the metadata proto both front ends answer with. The versions are
managed by :class:`aiayn.export.manager.ModelManager`.
"""


from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops, as the stock server links them

from aiayn.export.batcher import Batcher
from aiayn.export.codec import texts_tensor
from aiayn.export.saved_model import SAMPLES_FILE, WARMUP_FILE
from aiayn.export.warmup import read_warmup_requests
from aiayn.models.protect import split_protected
from aiayn.models.tokenizer import SubwordTokenizer

log = logging.getLogger("aiayn.export.server")


class Servable:
    """One loaded version: its signatures, metadata and a batcher per signature."""

    def __init__(self, name: str, version: int, path: Path, max_batch_size: int | None,
                 batch_timeout_ms: float):
        self.name = name
        self.version = version
        self.path = path
        self.loaded = tf.saved_model.load(str(path))
        self.signatures = dict(self.loaded.signatures)
        self.samples = {}
        samples_path = path / "assets.extra" / SAMPLES_FILE
        if samples_path.exists():
            self.samples = json.loads(samples_path.read_text(encoding="utf-8"))
        options = self.samples.get("options", {})
        self.max_batch_size = int(max_batch_size or options.get("max_batch_size") or 64)
        self.input_limit = self.samples.get("input_limit")
        self.on_long_input = options.get("on_long_input", "truncate")
        # Exports made before protected spans translate every input whole.
        self.protect_pattern = options.get("protect_pattern", "")
        self.tokenizer = _source_tokenizer(path / "assets.extra" / "spm.model")
        self.batchers = {key: Batcher(self._runner(key), self.max_batch_size, batch_timeout_ms,
                                      name=f"{name}/{version}/{key}")
                         for key in self.signatures}
        self._inflight = 0
        self._idle = threading.Condition()

    # -- leases: requests that hold this version ------------------------------------------------
    def acquire(self) -> None:
        with self._idle:
            self._inflight += 1

    def release(self) -> None:
        with self._idle:
            self._inflight -= 1
            if self._inflight <= 0:
                self._idle.notify_all()

    @property
    def inflight(self) -> int:
        return self._inflight

    def wait_idle(self, timeout: float) -> bool:
        """Waits until no request holds this version; False if `timeout` s passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight <= 0, timeout)

    def _runner(self, key: str) -> Callable[[np.ndarray], dict[str, np.ndarray]]:
        fn = self.signatures[key]
        (input_name,) = fn.structured_input_signature[1].keys()

        def run(texts: np.ndarray) -> dict[str, np.ndarray]:
            out = fn(**{input_name: texts_tensor(texts)})
            return {k: v.numpy() for k, v in out.items()}

        return run

    def signature_inputs(self, key: str) -> dict[str, tf.TensorSpec]:
        return dict(self.signatures[key].structured_input_signature[1])

    def signature_outputs(self, key: str) -> dict[str, tf.TensorSpec]:
        return dict(self.signatures[key].structured_outputs)

    def long_inputs(self, texts: np.ndarray) -> list[tuple[int, int]]:
        """(index, token count) of inputs over the exported limit (needs spm in assets.extra).

        The counts come from the project's one source featuriser
        (:meth:`~aiayn.models.tokenizer.SubwordTokenizer.featurize_source`) with the export's
        ``input_limit``, so "too long" means exactly what the exported signature truncates:
        with protected spans (the export's ``protect_pattern``), the limit holds per translated
        piece, and the count is that of the input's longest piece.
        `texts` must be valid UTF-8 (the featuriser asserts it; the Predictor checks first).
        """
        if self.tokenizer is None or not self.input_limit:
            return []
        text = texts_tensor(texts)
        rows = tf.range(tf.shape(text, out_type=tf.int64)[0])  # (batch,): one piece each
        if self.protect_pattern:
            segments = split_protected(text, self.protect_pattern)
            translate = segments.translate.flat_values  # (pieces,)
            text = tf.boolean_mask(segments.pieces.flat_values, translate)  # (translated,)
            rows = tf.boolean_mask(segments.pieces.value_rowids(), translate)
        features = self.tokenizer.featurize_source(text, int(self.input_limit))
        over = features.truncated.numpy()  # (pieces,)
        longest: dict[int, int] = {}  # input -> its longest piece's token count
        for row, count in zip(rows.numpy()[over], features.lengths.numpy()[over]):
            longest[int(row)] = max(longest.get(int(row), 0), int(count))
        return sorted(longest.items())

    def warmup(self) -> int:
        """Replays ``assets.extra/tf_serving_warmup_requests``; returns the requests run."""
        path = self.path / "assets.extra" / WARMUP_FILE
        if not path.exists():
            return 0
        count = 0
        for entry in read_warmup_requests(path):
            request = entry.predict_log.request
            key = request.model_spec.signature_name or "serving_default"
            if key not in self.signatures:
                continue
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            self.signatures[key](**{k: tf.constant(v) for k, v in inputs.items()})
            count += 1
        return count

    def close(self) -> None:
        for batcher in self.batchers.values():
            batcher.close()


def _source_tokenizer(spm_path: Path) -> SubwordTokenizer | None:
    """The export's tokenizer for length checks; None (no check) if it is absent or unusable."""
    if not spm_path.exists():
        return None
    try:
        return SubwordTokenizer.from_file(spm_path)
    except (OSError, ValueError, tf.errors.OpError) as err:
        log.warning("No input length check for %s: %s", spm_path.parent.parent, err)
        return None


def signature_def_map(servable: Servable):
    """The servable's SignatureDefMap proto (as GetModelMetadata returns it)."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    sm = saved_model_pb2.SavedModel.FromString((servable.path / "saved_model.pb").read_bytes())
    result = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in sm.meta_graphs[0].signature_def.items():
        result.signature_def[key].CopyFrom(sig)
    return result
