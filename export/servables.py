"""Loaded versions and the version manager of the development server.

:class:`Servable` is one loaded version of one model: its signatures, the export's serving
options (``assets.extra/verify_samples.json``), the source featuriser that checks input lengths,
and a :class:`~aiayn.export.batcher.Batcher` per signature. :class:`ModelManager` scans the
base directory, loads and warms up the newest version of each model and unloads the old one
(TF Serving's latest-1 policy). :func:`signature_def_map` and :func:`model_status_proto` are
the metadata and status protos both front ends answer with.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops, as the stock server links them

from aiayn.export.batcher import Batcher
from aiayn.export.codec import texts_tensor
from aiayn.export.saved_model import (SAMPLES_FILE, WARMUP_FILE, list_versions,
                                      read_warmup_requests)
from aiayn.export.serving_errors import ServingError
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
        self.tokenizer = _source_tokenizer(path / "assets.extra" / "spm.model")
        self.batchers = {key: Batcher(self._runner(key), self.max_batch_size, batch_timeout_ms,
                                      name=f"{name}/{version}/{key}")
                         for key in self.signatures}

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
        ``input_limit``, so "too long" means exactly what the exported signature truncates.
        `texts` must be valid UTF-8 (the featuriser asserts it; the Predictor checks first).
        """
        if self.tokenizer is None or not self.input_limit:
            return []
        features = self.tokenizer.featurize_source(texts_tensor(texts), int(self.input_limit))
        lengths = features.lengths.numpy()  # (batch,) token counts before truncation
        return [(int(i), int(lengths[i])) for i in np.flatnonzero(features.truncated.numpy())]

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


class ModelManager:
    """Watches ``base_dir`` and keeps the latest version of each model loaded.

    Args:
      base_dir: the export base directory (``<base_dir>/<name>/<version>/``).
      model_names: serve only these names; default: every folder with integer versions.
      poll_seconds: how often the directory is scanned for new versions.
      max_batch_size: batch limit; default: the export's own (``export.max_batch_size``).
      batch_timeout_ms: how long a request waits for batch-mates.
      warmup: replay the export's warmup requests before serving a version.
    """

    def __init__(self, base_dir: str | Path, model_names: list[str] | None = None,
                 poll_seconds: float = 2.0, max_batch_size: int | None = None,
                 batch_timeout_ms: float = 5.0, warmup: bool = True):
        self.base_dir = Path(base_dir)
        self.model_names = list(model_names) if model_names else None
        self.poll_seconds = poll_seconds
        self.max_batch_size = max_batch_size
        self.batch_timeout_ms = batch_timeout_ms
        self.warmup = warmup
        self._servables: dict[str, dict[int, Servable]] = {}
        self._failed: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _candidates(self) -> list[str]:
        if self.model_names:
            return self.model_names
        if not self.base_dir.is_dir():
            return []
        return sorted(p.name for p in self.base_dir.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and list_versions(p))

    def scan(self) -> None:
        """Loads any newer version and unloads older ones (TF Serving's latest-1 policy)."""
        for name in self._candidates():
            versions = list_versions(self.base_dir / name)
            if not versions:
                continue
            latest = versions[-1]
            current = self._servables.get(name, {})
            if latest in current or (name, latest) in self._failed:
                continue
            servable = self._load(name, latest)
            if servable is None:
                continue
            with self._lock:
                old = self._servables.get(name, {})
                self._servables[name] = {latest: servable}
            for servable_old in old.values():
                servable_old.close()

    def _load(self, name: str, version: int) -> Servable | None:
        """Loads and warms up one version; None (and never again) if that fails."""
        path = self.base_dir / name / str(version)
        try:
            started = time.monotonic()
            servable = Servable(name, version, path, self.max_batch_size, self.batch_timeout_ms)
            warmed = servable.warmup() if self.warmup else 0
            log.info("Loaded %s version %d in %.1fs (%d warmup requests).", name, version,
                     time.monotonic() - started, warmed)
            return servable
        except Exception as err:  # noqa: BLE001 - keep serving the old version
            log.error("Could not load %s: %s", path, err)
            self._failed[(name, version)] = time.time()
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("Scanning %s failed.", self.base_dir)

    def start(self) -> None:
        self.scan()
        self._thread = threading.Thread(target=self._loop, name="version-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            servables = [s for by_v in self._servables.values() for s in by_v.values()]
            self._servables = {}
        for servable in servables:
            servable.close()

    def get(self, name: str, version: int | None = None) -> Servable:
        """The servable for a request, or NOT_FOUND in TF Serving's words."""
        with self._lock:
            by_version = self._servables.get(name)
            if not by_version:
                request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
                raise ServingError("NOT_FOUND", f"Servable not found for request: {request}")
            if version is None:
                return by_version[max(by_version)]
            if version not in by_version:
                raise ServingError(
                    "NOT_FOUND", f"Servable not found for request: Specific({name}, {version}). "
                                 f"Available version(s): {sorted(by_version)}")
            return by_version[version]

    def versions(self, name: str) -> list[int]:
        with self._lock:
            return sorted(self._servables.get(name, {}))


def signature_def_map(servable: Servable):
    """The servable's SignatureDefMap proto (as GetModelMetadata returns it)."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    sm = saved_model_pb2.SavedModel.FromString((servable.path / "saved_model.pb").read_bytes())
    result = get_model_metadata_pb2.SignatureDefMap()
    for key, sig in sm.meta_graphs[0].signature_def.items():
        result.signature_def[key].CopyFrom(sig)
    return result


def model_status_proto(manager: ModelManager, name: str, version: int | None):
    """GetModelStatusResponse for a model (every loaded version) or one version; NOT_FOUND else."""
    from tensorflow_serving.apis import get_model_status_pb2

    versions = manager.versions(name)
    if not versions:
        raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
    if version is not None and version not in versions:
        raise ServingError("NOT_FOUND", f"Could not find version {version} of model {name}")
    response = get_model_status_pb2.GetModelStatusResponse()
    for v in ([version] if version is not None else versions):
        status = response.model_version_status.add()
        status.version = v
        status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
        status.status.error_code = 0
        status.status.error_message = ""
    return response
