"""``models.config`` for the development server: version policies and version labels.

TF Serving reads a ``ModelServerConfig`` text proto (``--model_config_file``); ``aiayn export``
writes one at ``<base_dir>/models.config``. The development server reads the same file, and
re-reads it when it changes, for what it needs of each ``config { ... }`` entry:

* ``model_version_policy``: ``latest { num_versions: N }`` (the default, N = 1), ``all {}`` or
  ``specific { versions: 1 versions: 3 }``;
* ``version_labels``: ``version_labels { key: "stable" value: 1 }``, so requests can name
  ``/labels/stable`` (REST) or ``model_spec.version_label`` (gRPC);
* ``base_path``: where the versions live when ``<base_dir>/<name>`` does not exist.

:func:`read_models_config` parses the file into ``{name: ModelPolicy}``;
:meth:`ModelPolicy.aspired` picks the versions to serve out of those on disk.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path


class ModelConfigError(ValueError):
    """``models.config`` cannot be read or says something the server cannot honour."""


@dataclasses.dataclass(frozen=True)
class ModelPolicy:
    """One model's version policy and labels.

    Attributes:
      kind: ``latest``, ``all`` or ``specific``.
      num_versions: for ``latest``: how many of the newest versions to serve.
      versions: for ``specific``: the versions to serve.
      labels: version label -> version.
      base_path: the configured base path ('' when none).
    """

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()
    labels: Mapping[str, int] = dataclasses.field(default_factory=dict)
    base_path: str = ""

    def aspired(self, on_disk: list[int]) -> list[int]:
        """The versions to serve, ascending, out of the integer versions on disk."""
        on_disk = sorted(on_disk)
        if self.kind == "all":
            return on_disk
        if self.kind == "specific":
            wanted = set(self.versions)
            return [v for v in on_disk if v in wanted]
        return on_disk[-max(1, self.num_versions):]

    def describe(self) -> str:
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        if self.kind == "specific":
            return f"specific {list(self.versions)}"
        return "all"


DEFAULT_POLICY = ModelPolicy()


def parse_models_config(text: str, source: str = "models.config") -> dict[str, ModelPolicy]:
    """``{name: ModelPolicy}`` of a ModelServerConfig text proto; ModelConfigError if malformed."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ModelConfigError(f"{source}: {err}") from None
    if config.WhichOneof("config") == "custom_model_config":
        raise ModelConfigError(f"{source}: custom_model_config is not supported by the "
                               "development server; use model_config_list.")
    policies: dict[str, ModelPolicy] = {}
    for entry in config.model_config_list.config:
        if not entry.name:
            raise ModelConfigError(f"{source}: a config entry has no name.")
        if entry.name in policies:
            raise ModelConfigError(f"{source}: model {entry.name!r} is configured twice.")
        policy = entry.model_version_policy
        choice = policy.WhichOneof("policy_choice") or "latest"
        if choice == "latest":
            kind = dict(kind="latest", num_versions=max(1, policy.latest.num_versions))
        elif choice == "all":
            kind = dict(kind="all")
        else:
            versions = tuple(sorted(set(policy.specific.versions)))
            if not versions:
                raise ModelConfigError(f"{source}: model {entry.name!r} has a specific "
                                       "version policy that names no version.")
            kind = dict(kind="specific", versions=versions)
        labels = {str(k): int(v) for k, v in entry.version_labels.items()}
        policies[entry.name] = ModelPolicy(labels=labels, base_path=entry.base_path, **kind)
    return policies


def read_models_config(path: str | Path) -> dict[str, ModelPolicy]:
    """Parses ``path`` (see :func:`parse_models_config`); OSError if it cannot be read."""
    path = Path(path)
    return parse_models_config(path.read_text(encoding="utf-8"), str(path))
