"""Runners of the TFX pipeline: locally (LocalDagRunner, Beam DirectRunner, SQLite ML Metadata),
and a compile to Kubeflow Pipelines V2 / Vertex AI Pipelines JSON (no cluster needed).

    run_local(cfg)                       # -> pushed version dir (or why nothing was pushed)
    compile_kubeflow_v2(cfg, "aiayn-translate.json", pipeline_root="gs://bucket/tfx",
                        examples_dir="gs://bucket/examples", push_dir="gs://bucket/serving",
                        image="IMAGE_URI")

Beam pipeline arguments pass through unchanged to the data components (StatisticsGen,
SchemaGen, ExampleValidator, ExampleGen): ``--runner=DataflowRunner --project=... --region=...
--temp_location=gs://...``, ``--runner=FlinkRunner --flink_master=...``,
``--runner=SparkRunner ...``; locally the default DirectRunner.

The Pusher pushes only a model that both the BLEU evaluation and the infra check blessed
(tfx/definition.py); :func:`run_local` reads their verdicts back from ML Metadata, so a run
that pushed nothing still ends normally and says why (``pushed: false`` and ``reason``).

TFX is imported inside the functions, so the project works without it (see
pipeline/scripts/tfx_env.sh for where TFX 1.21 installs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.pipeline.config import Config
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.tfx import blessing
from aiayn.pipeline.tfx.definition import PIPELINE_NAME, create_pipeline
from aiayn.pipeline.tfx.examples import default_examples_dir

DEFAULT_TFX_DIR = "runs/tfx"


def require_tfx() -> None:
    """Raises a :class:`UserInputError` with the way out when TFX cannot be imported here."""
    try:
        import ml_metadata  # noqa: F401  (the part that needs glibc >= 2.38)
        import tfx  # noqa: F401
    except ImportError as err:
        raise UserInputError(
            f"TFX is not importable in this Python ({err}). Install the `tfx` extra "
            "(`pip install -e '.[tfx]'`, needs glibc >= 2.39), or run it as `make tfx`, which "
            "uses pipeline/scripts/tfx_env.sh (a Debian 13 root where the host is older).") \
            from None


def default_paths(cfg: Config, tfx_dir: str | os.PathLike = DEFAULT_TFX_DIR) -> dict[str, str]:
    """Local defaults: ExampleGen input, pipeline root, metadata DB and push destination."""
    tfx_dir = Path(tfx_dir)
    return {
        "examples_dir": str(default_examples_dir(cfg)),
        "pipeline_root": str(tfx_dir / "pipeline_root"),
        "metadata_path": str(tfx_dir / "metadata.db"),
        # The directory TF Serving watches for this model (`make serve` serves it too).
        "push_dir": str(Path(cfg.export.base_dir) / cfg.export.model_name),
    }


def _versions(push_dir: Path) -> set[int]:
    if not push_dir.is_dir():
        return set()
    return {int(p.name) for p in push_dir.iterdir() if p.name.isdigit() and p.is_dir()}


def build_pipeline(cfg: Config, *, examples_dir: str, pipeline_root: str, push_dir: str,
                   input_format: str = "tfrecord", overrides: Sequence[str] = (),
                   metadata_connection_config: Any = None,
                   beam_pipeline_args: Sequence[str] = (),
                   pipeline_name: str = PIPELINE_NAME) -> Any:
    """``create_pipeline`` with ``cfg`` as the Trainer's configuration."""
    return create_pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, examples_dir=examples_dir,
        push_dir=push_dir, config=cfg.to_dict(), train_steps=cfg.train.steps,
        input_format=input_format, preset=cfg.preset, overrides=overrides,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args))


def run_local(cfg: Config, *, examples_dir: str | None = None, input_format: str = "tfrecord",
              tfx_dir: str | os.PathLike = DEFAULT_TFX_DIR, push_dir: str | None = None,
              beam_pipeline_args: Sequence[str] = (), verify: bool = True) -> dict[str, Any]:
    """Runs the pipeline with LocalDagRunner (Beam DirectRunner, SQLite ML Metadata).

    Args:
      cfg: the run configuration (the Trainer trains with it).
      examples_dir: ExampleGen input (default ``<data_dir>/tfx_examples``, ``aiayn tfx-data``).
      input_format: ``tfrecord`` or ``csv``.
      tfx_dir: holds ``pipeline_root/`` and ``metadata.db``.
      push_dir: Pusher destination (default ``<export.base_dir>/<export.model_name>``).
      beam_pipeline_args: passed to Beam unchanged.
      verify: check the pushed version with the export verifier (fresh process, stock ops).

    Returns:
      ``pushed`` (whether this run pushed a version), ``pushed_dir`` (the new version directory,
      or None), ``reason`` (the blessings' verdicts, one line), ``evaluation`` and ``infra``
      (what the BleuEvaluator and InfraCheck recorded in ML Metadata: ``blessed``, ``reason``,
      ``bleu``, ``chrf``, ``baseline_bleu``, ...), ``seconds``, the paths, and ``verify`` (the
      verifier's summary of the pushed version).

    Raises:
      UserInputError: TFX missing, no ExampleGen input, or a blessed model that the Pusher did
        not write.
      aiayn.export.verify.VerificationError: the pushed model failed verification.
    """
    require_tfx()
    from tfx import v1 as tfx

    paths = default_paths(cfg, tfx_dir)
    examples_dir = examples_dir or paths["examples_dir"]
    push = Path(push_dir or paths["push_dir"])
    _require_examples(examples_dir)
    connection, last_id = _open_metadata(tfx, paths["metadata_path"])
    before = _versions(push)
    pipeline = build_pipeline(
        cfg, examples_dir=str(Path(examples_dir).resolve()),
        pipeline_root=str(Path(paths["pipeline_root"]).resolve()), push_dir=str(push.resolve()),
        input_format=input_format, metadata_connection_config=connection,
        beam_pipeline_args=beam_pipeline_args)
    start = time.monotonic()
    tfx.orchestration.LocalDagRunner().run(pipeline)
    seconds = round(time.monotonic() - start, 1)
    outcome = run_outcome(connection, after_id=last_id)
    new = sorted(_versions(push) - before)
    result: dict[str, Any] = {"pushed": bool(new), "pushed_dir": None,
                              "reason": outcome["reason"], "evaluation": outcome["evaluation"],
                              "infra": outcome["infra"], "seconds": seconds,
                              "examples_dir": examples_dir, "push_dir": str(push), **{
                                  k: paths[k] for k in ("pipeline_root", "metadata_path")}}
    pushed = _pushed_version(push, new, outcome)
    if pushed is None:
        return result
    result["pushed_dir"] = str(pushed)
    result.update(_serve_pushed(cfg, push, pushed, verify))
    return result


def _require_examples(examples_dir: str) -> None:
    """Raises a :class:`UserInputError` unless the ExampleGen input has both splits."""
    for split in ("train", "eval"):
        if not (Path(examples_dir) / split).is_dir():
            raise UserInputError(f"{examples_dir}/{split}/ not found: write the ExampleGen input "
                                 "first with `aiayn tfx-data` (same --preset/--set).")


def _open_metadata(tfx: Any, metadata_path: str) -> tuple[Any, int]:
    """The SQLite ML Metadata connection (its directory made) and the store's last artifact id,
    which marks where this run's own artifacts start."""
    Path(metadata_path).parent.mkdir(parents=True, exist_ok=True)
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(
        str(Path(metadata_path).resolve()))
    return connection, _last_artifact_id(connection)


def _pushed_version(push: Path, new: list[int], outcome: dict[str, Any]) -> Path | None:
    """The version directory this run pushed; None (saying why) when it pushed nothing.

    Args:
      push: the Pusher's destination.
      new: the version numbers that appeared there during the run, ascending.
      outcome: :func:`run_outcome` of the run.

    Raises:
      UserInputError: a blessed model that the Pusher did not write, or a push without both
        blessings.
    """
    if not new:
        if outcome["blessed"]:
            raise UserInputError(f"The model was blessed ({outcome['reason']}) but the Pusher "
                                 f"wrote no new version under {push}.")
        # Not blessed: the run ended as designed; say why, push nothing, verify nothing.
        print(f"tfx-run: nothing pushed: {outcome['reason']}", file=sys.stderr, flush=True)
        return None
    if not outcome["blessed"]:  # the Pusher checks both blessings; this would be a TFX bug
        raise UserInputError(f"The Pusher wrote {push / str(new[-1])} although the model was not "
                             f"blessed ({outcome['reason']}); do not serve it.")
    return push / str(new[-1])


def _serve_pushed(cfg: Config, push: Path, pushed: Path, verify: bool) -> dict[str, Any]:
    """Readies the pushed version for TF Serving; ``{"verify": summary}`` when verified, else {}.

    Raises:
      aiayn.export.verify.VerificationError: the pushed model failed verification.
    """
    # models.config / batching_parameters.txt beside the versions, as `aiayn export` writes.
    from aiayn.export.saved_model import write_server_configs

    write_server_configs(push.parent, push.name, cfg.export.max_batch_size)
    if not verify:
        return {}
    from aiayn.export.verify import verify_export

    report = verify_export(pushed)
    report.raise_if_failed()
    return {"verify": report.summary()}


def _store(connection: Any) -> Any:
    from ml_metadata.metadata_store import metadata_store

    return metadata_store.MetadataStore(connection)


def _last_artifact_id(connection: Any) -> int:
    """The highest artifact id in ML Metadata so far (0 for a new store)."""
    import ml_metadata as mlmd

    newest = _store(connection).get_artifacts(list_options=mlmd.ListOptions(
        limit=1, order_by=mlmd.OrderByField.ID, is_asc=False))
    return newest[0].id if newest else 0


def _properties(artifact: Any) -> dict[str, Any]:
    """An MLMD artifact's custom properties as plain values, plus ``uri`` and ``id``."""
    out: dict[str, Any] = {"id": artifact.id, "uri": artifact.uri}
    for key, value in sorted(artifact.custom_properties.items()):
        kind = value.WhichOneof("value")
        if kind in ("int_value", "double_value", "string_value", "bool_value"):
            out[key] = getattr(value, kind)
    if blessing.BLESSED_KEY in out:
        out[blessing.BLESSED_KEY] = out[blessing.BLESSED_KEY] == 1
    return out


def run_outcome(connection: Any, after_id: int = 0) -> dict[str, Any]:
    """What the evaluation, the infra check and the Pusher recorded after artifact ``after_id``.

    Args:
      connection: the ML Metadata connection config.
      after_id: only artifacts newer than this id count (the run's own, not earlier runs').

    Returns:
      ``{"blessed": bool, "pushed": bool, "reason": str, "evaluation": {...}, "infra": {...},
      "pushed_model": {...}}``; each ``{...}`` holds the artifact's custom properties (empty
      when the component produced nothing).
    """
    store = _store(connection)

    def newest(type_name: str) -> dict[str, Any]:
        found = [a for a in store.get_artifacts_by_type(type_name) if a.id > after_id]
        return _properties(max(found, key=lambda a: a.id)) if found else {}

    evaluation, infra = newest("ModelBlessing"), newest("InfraBlessing")
    pushed_model = newest("PushedModel")
    blessed = bool(evaluation.get(blessing.BLESSED_KEY)) and bool(
        infra.get(blessing.BLESSED_KEY))
    reasons = [part.get(blessing.REASON_KEY) or f"{name}: no verdict recorded"
               for name, part in (("BleuEvaluator", evaluation), ("InfraCheck", infra))
               if blessed or not part.get(blessing.BLESSED_KEY)]
    return {"blessed": blessed, "pushed": pushed_model.get("pushed") == 1,
            "reason": "; ".join(reasons), "evaluation": evaluation, "infra": infra,
            "pushed_model": pushed_model}


def compile_kubeflow_v2(cfg: Config, output_path: str | os.PathLike, *, pipeline_root: str,
                        examples_dir: str, push_dir: str, image: str,
                        input_format: str = "tfrecord", beam_pipeline_args: Sequence[str] = (),
                        pipeline_name: str = PIPELINE_NAME) -> dict[str, Any]:
    """Compiles the pipeline to a Kubeflow Pipelines V2 / Vertex AI Pipelines JSON definition.

    Args:
      cfg: the run configuration.
      output_path: the JSON file to write.
      pipeline_root / examples_dir / push_dir: URIs the cluster can reach (``gs://...``).
      image: a container image holding TFX 1.21 and this package (see the README's TFX section).
      input_format, beam_pipeline_args: as for :func:`run_local`.

    Returns:
      ``{"path", "trainer_run_fn", "components", "executors", "tasks"}`` (``tasks``: the
      compiled DAG's task names; the resolver becomes two ``latest_blessed_model_resolver-*``
      tasks).

    Raises:
      UserInputError: TFX or its Kubeflow V2 dependency (kfp-pipeline-spec) missing.
    """
    require_tfx()
    try:
        from tfx import v1 as tfx

        runner_cls = tfx.orchestration.experimental.KubeflowV2DagRunner
        config_cls = tfx.orchestration.experimental.KubeflowV2DagRunnerConfig
    except ImportError as err:  # kfp.pipeline_spec
        raise UserInputError(f"The Kubeflow V2 runner needs kfp-pipeline-spec ({err}): "
                             "pip install 'kfp-pipeline-spec<2.17'.") from None
    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    pipeline = build_pipeline(cfg, examples_dir=examples_dir, pipeline_root=pipeline_root,
                              push_dir=push_dir, input_format=input_format,
                              beam_pipeline_args=beam_pipeline_args, pipeline_name=pipeline_name)
    runner = runner_cls(config=config_cls(default_image=image),
                        output_dir=str(output_path.parent), output_filename=output_path.name)
    runner.run(pipeline)
    spec = json.loads(output_path.read_text(encoding="utf-8"))
    executors = spec.get("pipelineSpec", spec).get("deploymentSpec", {}).get("executors", {})
    tasks = spec.get("pipelineSpec", spec).get("root", {}).get("dag", {}).get("tasks", {})
    return {"path": str(output_path), "components": sorted(
                spec.get("pipelineSpec", spec).get("components", {})),
            "executors": sorted(executors), "tasks": sorted(tasks),
            "trainer_run_fn": _trainer_run_fn(spec)}


def _trainer_run_fn(spec: dict[str, Any]) -> str | None:
    """The ``run_fn`` the compiled Trainer step references (None if not found)."""
    text = json.dumps(spec)
    from aiayn.pipeline.tfx.trainer import RUN_FN

    return RUN_FN if RUN_FN in text else None
