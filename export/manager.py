"""The development server's version manager: TF Serving's AspiredVersionsManager, simplified.

:class:`ModelManager` manages versions as TF Serving does with the availability-preserving
policy:

* the versions to serve come from each model's ``model_version_policy`` in ``models.config``
  (latest N, specific, all; default latest 1), re-read when the file changes;
* a new version is loaded and warmed up before it takes traffic; a version directory that is
  still changing (being copied) is not loaded until two scans see it the same;
* a version that fails to load is shown as ``END`` with its error in the status and retried
  with exponential back-off, at once when its directory changes (a copy completed);
* an old version stops taking new requests once a version the policy wants is available, and
  is closed when the requests that hold it have finished (``drain_timeout`` at most);
* ``version_labels`` name versions; requests hold a lease (:meth:`ModelManager.lease`) from the
  moment the version is resolved until the answer is computed.

:func:`model_status_proto` is the status proto both front ends answer with.
"""


from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops, as the stock server links them

from aiayn.export.model_config import (
    DEFAULT_POLICY,
    ModelConfigError,
    ModelPolicy,
    read_models_config,
)
from aiayn.export.saved_model import (
    MODELS_CONFIG,
    list_versions,
)
from aiayn.export.servables import Servable
from aiayn.export.serving_errors import ServingError, clip, invalid

log = logging.getLogger("aiayn.export.server")


# TF Serving's ModelVersionStatus.State numbers, by name.
STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}


@dataclasses.dataclass
class VersionState:
    """What the status APIs report for one version (TF Serving's ModelVersionStatus)."""

    version: int
    state: str = "START"
    error_code: int = 0  # tensorflow.error.Code: 0 OK, 2 UNKNOWN, 5 NOT_FOUND, ...
    error_message: str = ""
    attempts: int = 0  # load attempts so far
    next_retry: float = 0.0  # time.monotonic() of the next attempt after a failure
    fingerprint: tuple = ()  # the directory's files when last looked at


def _fingerprint(path: Path) -> tuple:
    """(relative path, size, mtime) of every file under `path`; it changes while a copy runs."""
    entries = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            entries.append((os.path.relpath(full, path), st.st_size, st.st_mtime_ns))
    return tuple(entries)


def _load_error(err: Exception) -> tuple[int, str]:
    """(tensorflow.error.Code, one readable line) of why a version did not load."""
    if isinstance(err, tf.errors.OpError):
        code = int(err.error_code)
        message = err.message or str(err)
    else:
        code = 5 if isinstance(err, OSError) else 2  # NOT_FOUND, UNKNOWN
        message = f"{type(err).__name__}: {err}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return code, clip(" ".join(lines[:3]), 500)


class ModelManager:
    """Watches ``base_dir`` and serves the versions each model's policy asks for.

    Args:
      base_dir: the export base directory (``<base_dir>/<name>/<version>/``).
      model_names: serve only these names; default: every folder with integer versions, and
        every model named in ``models.config``.
      poll_seconds: how often the directory (and ``models.config``) is scanned.
      max_batch_size: batch limit; default: the export's own (``export.max_batch_size``).
      batch_timeout_ms: how long a request waits for batch-mates.
      warmup: replay the export's warmup requests before serving a version.
      model_config_file: ``models.config`` to read policies and labels from; default
        ``<base_dir>/models.config`` when it exists (latest 1, no labels otherwise).
      load_retry_seconds: the first wait before retrying a version that failed to load; it
        doubles with each failure up to `max_load_retry_seconds`. A change in the version's
        directory triggers a retry at once.
      drain_timeout: how long a replaced version may finish its requests before it is closed.
    """

    def __init__(self, base_dir: str | Path, model_names: list[str] | None = None,
                 poll_seconds: float = 2.0, max_batch_size: int | None = None,
                 batch_timeout_ms: float = 5.0, warmup: bool = True, *,
                 model_config_file: str | Path | None = None, load_retry_seconds: float = 5.0,
                 max_load_retry_seconds: float = 60.0, drain_timeout: float = 30.0):
        self.base_dir = Path(base_dir)
        self.model_names = list(model_names) if model_names else None
        self.poll_seconds = poll_seconds
        self.max_batch_size = max_batch_size
        self.batch_timeout_ms = batch_timeout_ms
        self.warmup = warmup
        self.model_config_file = (Path(model_config_file) if model_config_file
                                  else self.base_dir / MODELS_CONFIG)
        self._explicit_config = model_config_file is not None
        self.load_retry_seconds = load_retry_seconds
        self.max_load_retry_seconds = max_load_retry_seconds
        self.drain_timeout = drain_timeout
        self.config_error = ""
        self._policies: dict[str, ModelPolicy] = {}
        self._config_stamp: tuple | None = None
        self._servables: dict[str, dict[int, Servable]] = {}
        self._states: dict[str, dict[int, VersionState]] = {}
        self._unloading: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- configuration -------------------------------------------------------------------------
    def policy(self, name: str) -> ModelPolicy:
        return self._policies.get(name, DEFAULT_POLICY)

    def _reload_config(self) -> None:
        """Re-reads models.config when it changed; a broken file keeps the previous policies."""
        path = self.model_config_file
        try:
            st = path.stat()
            stamp: tuple | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._config_stamp:
            return
        self._config_stamp = stamp
        if stamp is None:
            if self._explicit_config:
                self.config_error = f"{path} does not exist"
                log.error("Model config %s does not exist; serving with the default policy "
                          "(latest 1).", path)
            policies: dict[str, ModelPolicy] = {}
        else:
            try:
                policies = read_models_config(path)
            except (OSError, ModelConfigError, ImportError) as err:
                self.config_error = str(err)
                log.error("Ignoring the new %s (keeping the previous policies): %s", path, err)
                return
        self.config_error = ""
        if policies != self._policies:
            for name, policy in sorted(policies.items()):
                log.info("Model %s: version policy %s%s.", name, policy.describe(),
                         f", labels {dict(policy.labels)}" if policy.labels else "")
        with self._lock:
            self._policies = policies

    def _model_dir(self, name: str) -> Path:
        model_dir = self.base_dir / name
        base_path = self.policy(name).base_path
        if model_dir.is_dir() or not base_path:
            return model_dir
        return Path(base_path)

    def _candidates(self) -> list[str]:
        if self.model_names:
            return self.model_names
        names = set(self._policies)
        if self.base_dir.is_dir():
            names |= {p.name for p in self.base_dir.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and list_versions(p)}
        return sorted(names)

    # -- scanning, loading, unloading ----------------------------------------------------------
    def scan(self, initial: bool = False) -> None:
        """Loads the versions the policies want, retries failures, retires replaced versions.

        A version first seen by a later scan is loaded once a scan sees its directory
        unchanged (a copy in progress is not loaded half-way); `initial` loads at once.
        """
        self._reload_config()
        for name in self._candidates():
            if self._stop.is_set():
                return
            try:
                self._scan_model(name, initial)
            except Exception:  # noqa: BLE001 - one model's trouble must not stop the others
                log.exception("Scanning model %s failed.", name)

    def _scan_model(self, name: str, initial: bool) -> None:
        model_dir = self._model_dir(name)
        on_disk = list_versions(model_dir)
        policy = self.policy(name)
        aspired = policy.aspired(on_disk)
        # With a latest-N policy and nothing loaded (say the newest version is half-copied
        # when the server starts), older versions are tried too, newest first, so the model
        # is served; the newest replaces them once it loads.
        fallback = ([v for v in sorted(on_disk, reverse=True) if v not in aspired]
                    if policy.kind == "latest" else [])
        with self._lock:
            states = self._states.setdefault(name, {})
            for version in list(states):  # forget what is neither wanted nor loaded
                if (version not in aspired and version not in fallback
                        and states[version].state in ("START", "END")):
                    del states[version]
        for version in sorted(aspired, reverse=True):  # the newest first
            if self._stop.is_set():
                return
            self._consider(name, model_dir, version, initial, aspired)
        for version in fallback:
            with self._lock:
                if self._servables.get(name) or self._stop.is_set():
                    break
            if self._consider(name, model_dir, version, initial, aspired):
                log.warning("Serving %s version %d until version(s) %s load.", name, version,
                            aspired)
        with self._lock:
            retired = self._take_replaced(name, aspired)
        self._unload_later(retired)

    def _consider(self, name: str, model_dir: Path, version: int, initial: bool,
                  aspired: list[int]) -> bool:
        """Loads `version` if it is due (new and unchanged since the last scan, or failed and
        changed or past its back-off); True if it is loaded now."""
        states = self._states[name]
        with self._lock:
            if version in self._servables.get(name, {}):
                return True
        path = model_dir / str(version)
        fingerprint = _fingerprint(path)
        state = states.get(version)
        if state is None:
            with self._lock:
                state = states[version] = VersionState(version, fingerprint=fingerprint)
            if not initial:
                return False  # load it when the next scan sees the same files
        elif state.state == "START":
            if fingerprint != state.fingerprint:
                state.fingerprint = fingerprint
                return False  # still being written
        elif state.state == "END":
            if fingerprint != state.fingerprint:
                log.info("%s changed since it failed to load; trying again when it stops "
                         "changing.", path)
                state.fingerprint = fingerprint
                state.next_retry = 0.0
                return False
            if time.monotonic() < state.next_retry:
                return False
        else:  # LOADING elsewhere, or UNLOADING: leave it
            return False
        return self._load(name, version, path, state, aspired)

    def _load(self, name: str, version: int, path: Path, state: VersionState,
              aspired: list[int]) -> bool:
        """Loads and warms up one version; on failure records the error and the next retry."""
        with self._lock:
            state.state = "LOADING"
            state.attempts += 1
        started = time.monotonic()
        try:
            servable = Servable(name, version, path, self.max_batch_size, self.batch_timeout_ms)
            try:
                warmed = servable.warmup() if self.warmup else 0
            except Exception:
                servable.close()
                raise
        except Exception as err:  # noqa: BLE001 - keep serving what is loaded
            code, message = _load_error(err)
            delay = min(self.max_load_retry_seconds,
                        self.load_retry_seconds * 2 ** (state.attempts - 1))
            with self._lock:
                state.state = "END"
                state.error_code = code
                state.error_message = message
                state.next_retry = time.monotonic() + delay
                serving = sorted(self._servables.get(name, {}))
            log.error("Could not load %s (attempt %d): %s. Serving %s meanwhile; next try in "
                      "%.0f s, or as soon as the directory changes.", path, state.attempts,
                      message, f"version(s) {serving}" if serving else "nothing", delay)
            return False
        with self._lock:
            if self._stop.is_set():
                servable.close()
                return False
            self._servables.setdefault(name, {})[version] = servable
            state.state = "AVAILABLE"
            state.error_code = 0
            state.error_message = ""
            retired = self._take_replaced(name, aspired)  # in the same step: no overlap
        log.info("Loaded %s version %d in %.1fs (%d warmup requests); it takes traffic now.",
                 name, version, time.monotonic() - started, warmed)
        self._unload_later(retired)
        return True

    def _take_replaced(self, name: str, aspired: list[int]) -> list[Servable]:
        """Stops routing to versions the policy no longer wants, once one it wants is available
        (call with the lock held).

        Until then the old versions keep serving (TF Serving's availability-preserving policy).
        """
        served = self._servables.get(name, {})
        if not any(v in served for v in aspired):
            return []
        retired = [served.pop(v) for v in sorted(served) if v not in aspired]
        for servable in retired:
            state = self._states.setdefault(name, {}).setdefault(
                servable.version, VersionState(servable.version))
            state.state = "UNLOADING"
        return retired

    def _unload_later(self, retired: list[Servable]) -> None:
        """Closes each retired version once the requests that hold it have finished."""
        for servable in retired:
            name = servable.name
            log.info("Unloading %s version %d after its %d in-flight request(s) finish.",
                     name, servable.version, servable.inflight)
            thread = threading.Thread(target=self._unload, args=(servable,),
                                      name=f"unload-{name}-{servable.version}", daemon=True)
            self._unloading = [t for t in self._unloading if t.is_alive()] + [thread]
            thread.start()

    def _unload(self, servable: Servable) -> None:
        if not servable.wait_idle(self.drain_timeout):
            log.warning("%s version %d still has %d request(s) after %.0f s; closing it.",
                        servable.name, servable.version, servable.inflight, self.drain_timeout)
        servable.close()
        with self._lock:
            states = self._states.get(servable.name, {})
            if servable.version in states and states[servable.version].state == "UNLOADING":
                del states[servable.version]
        log.info("Unloaded %s version %d.", servable.name, servable.version)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("Scanning %s failed.", self.base_dir)

    def start(self) -> None:
        self.scan(initial=True)
        self._thread = threading.Thread(target=self._loop, name="version-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.poll_seconds))
        with self._lock:
            servables = [s for by_v in self._servables.values() for s in by_v.values()]
            self._servables = {}
        for servable in servables:
            servable.close()
        for thread in self._unloading:
            thread.join(timeout=0.1)

    # -- requests ------------------------------------------------------------------------------
    def _resolve(self, name: str, version: int | None, label: str | None) -> Servable:
        """The servable a request names (call with the lock held); TF Serving's errors."""
        by_version = self._servables.get(name)
        if not by_version:
            if label is not None:
                request = f"Label({clip(name)}, {clip(label)})"
            elif version is None:
                request = f"Latest({clip(name)})"
            else:
                request = f"Specific({clip(name)}, {version})"
            raise ServingError("NOT_FOUND", f"Servable not found for request: {request}")
        if label is not None:
            labels = self.policy(name).labels
            if label not in labels:
                known = f" Known labels: {sorted(labels)}." if labels else (
                    " No version_labels are configured for this model in models.config.")
                raise invalid(f"Unrecognized servable version label: {clip(label)}.{known}")
            version = labels[label]
        if version is None:
            return by_version[max(by_version)]
        if version not in by_version:
            raise ServingError(
                "NOT_FOUND", f"Servable not found for request: Specific({clip(name)}, "
                             f"{version}). Available version(s): {sorted(by_version)}")
        return by_version[version]

    def get(self, name: str, version: int | None = None, label: str | None = None) -> Servable:
        """The servable for a request, or NOT_FOUND in TF Serving's words (no lease taken)."""
        with self._lock:
            return self._resolve(name, version, label)

    @contextlib.contextmanager
    def lease(self, name: str, version: int | None = None,
              label: str | None = None) -> Iterator[Servable]:
        """Resolves a request's servable and holds it until the block ends.

        A version being replaced stays open while a lease holds it, so a request that resolved
        it always gets its answer.
        """
        with self._lock:
            servable = self._resolve(name, version, label)
            servable.acquire()
        try:
            yield servable
        finally:
            servable.release()

    def versions(self, name: str) -> list[int]:
        """The versions that take traffic."""
        with self._lock:
            return sorted(self._servables.get(name, {}))

    def label_version(self, name: str, label: str) -> int:
        """The version a label names, or INVALID_ARGUMENT."""
        with self._lock:
            labels = self.policy(name).labels
        if label not in labels:
            raise invalid(f"Unrecognized servable version label: {clip(label)}.")
        return labels[label]

    def version_states(self, name: str) -> list[VersionState]:
        """Every version known for `name` (loading, available, failed, unloading), newest first."""
        with self._lock:
            states = self._states.get(name, {})
            return [dataclasses.replace(s) for _, s in sorted(states.items(), reverse=True)]


def model_status_proto(manager: ModelManager, name: str, version: int | None,
                       label: str | None = None):
    """GetModelStatusResponse: every known version of a model (newest first), or one version.

    Versions that are loading, failed to load (``END`` with the error) or are finishing their
    requests before unloading are listed too, as TF Serving lists them. NOT_FOUND otherwise.
    """
    from tensorflow_serving.apis import get_model_status_pb2

    if label is not None:
        version = manager.label_version(name, label)
    states = manager.version_states(name)
    if not states:
        raise ServingError("NOT_FOUND", f"Could not find any versions of model {clip(name)}")
    if version is not None:
        states = [s for s in states if s.version == version]
        if not states:
            raise ServingError("NOT_FOUND",
                               f"Could not find version {version} of model {clip(name)}")
    response = get_model_status_pb2.GetModelStatusResponse()
    for s in states:
        status = response.model_version_status.add()
        status.version = s.version
        status.state = STATES[s.state]
        status.status.error_code = s.error_code
        status.status.error_message = s.error_message
    return response
