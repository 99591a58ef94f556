"""The TFX Trainer's module: ``run_fn(fn_args)`` runs the project's own training on ExampleGen's
splits.

TFX's Trainer (GenericExecutor) calls :func:`run_fn` with an ``FnArgs``; what it reads:

- ``train_files`` / ``eval_files``: patterns of ExampleGen's GZIP TFRecord files of
  ``tf.Example`` with ``source`` / ``target`` bytes features
  (``.../Split-train/data_tfrecord-00000-of-00001.gz``);
- ``custom_config``: ``{"config": <resolved config mapping>, "overrides": [...]}`` (written by
  :func:`aiayn.pipeline.tfx.definition.create_pipeline` from the caller's presets and ``--set``s);
- ``train_steps`` (``TrainArgs.num_steps``): overrides ``train.steps`` when set;
- ``model_run_dir``: the run directory (history, checkpoints, TensorBoard logs);
- ``serving_model_dir``: where the serving SavedModel goes (the Trainer's Model artifact,
  ``Format-Serving``), which Pusher copies to an integer version directory TF Serving watches.

Steps: the splits become ``train.tsv`` / ``dev.tsv`` (the prepared-data contract), the
vocabulary is trained on the training split (:func:`aiayn.pipeline.data.vocab.train_vocab`), the
model is trained with :func:`aiayn.pipeline.training.train.train`, and exported with
:func:`aiayn.pipeline.release.export_run.export_run`: the same serving SavedModel as ``make train``
(tokeniser and beam search in-graph, warmup requests, sample translations, config and model card
in ``assets.extra/``). The fresh-process verifier runs before the push in the component whose
job it is (``InfraCheck``, pipeline/tfx/infra.py), not here as well: a model that fails it is not
blessed, so it is never pushed (``aiayn tfx-run`` verifies the pushed copy once more).

Nothing here imports TFX (tested without it); Keras is Keras 3 (``import keras``), even though
TFX sets ``TF_USE_LEGACY_KERAS=1``.

Remote URIs (``gs://`` on Vertex AI) are read and written through ``tf.io.gfile``; training
itself runs in a local working directory.

Example (how the Trainer is configured, see tfx/definition.py)::

    tfx.components.Trainer(run_fn="aiayn.pipeline.tfx_module.run_fn", ...,  # RUN_FN
                           custom_config={"config": cfg.to_dict(), "overrides": []})
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.pipeline import config as config_lib
from aiayn.pipeline.config import Config
from aiayn.pipeline.errors import UserInputError

# The dotted path TFX stores in compiled pipelines and ML Metadata: the stable module
# aiayn.pipeline.tfx_module (kept at this address across refactors) re-exports `run_fn`.
RUN_FN = "aiayn.pipeline.tfx_module.run_fn"
MODEL_NAME_IN_TRAINER = "trainer-export"


def _is_remote(uri: str) -> bool:
    return "://" in str(uri)


def config_from_custom_config(custom_config: Mapping[str, Any] | None,
                              train_steps: int | None = None) -> Config:
    """The run configuration that ``create_pipeline`` put in the Trainer's ``custom_config``.

    ``custom_config``: ``{"config": {section: {key: value}}, "preset": "tiny",
    "overrides": ["train.steps=5"]}``; every key optional (default: the ``small`` preset).

    Raises:
      UserInputError: ``custom_config`` is not such a mapping.
      aiayn.pipeline.config.ConfigError: an unknown key or a bad value.
    """
    custom_config = dict(custom_config or {})
    # ai_platform_*: what TFX's Vertex AI Training extension adds (machine, region, image).
    unknown = {k for k in custom_config if not k.startswith("ai_platform_")} - {
        "config", "preset", "overrides"}
    if unknown:
        raise UserInputError(f"Trainer custom_config has unknown keys {sorted(unknown)}; "
                             "valid: config, preset, overrides.")
    values = custom_config.get("config")
    if values is None:
        base = config_lib.load_config(["small"])
        values = base.to_dict()
    if not isinstance(values, Mapping):
        raise UserInputError(f"Trainer custom_config['config'] must be a mapping of sections; "
                             f"got {type(values).__name__}.")
    values = {k: dict(v) for k, v in values.items() if k != "preset"}
    overrides = list(custom_config.get("overrides") or [])
    if train_steps:
        overrides.append(f"train.steps={int(train_steps)}")
    for text in overrides:
        section, key, value = config_lib.parse_override(text)
        values.setdefault(section, {})[key] = value
    return config_lib.build_config(values, origin="Trainer custom_config",
                                   preset=str(custom_config.get("preset") or "tfx"))


def _local_files(patterns: Sequence[str], scratch: Path) -> list[str]:
    """Local paths/patterns for ``patterns``; remote files are copied into ``scratch`` first."""
    out = []
    for i, pattern in enumerate(patterns):
        if not _is_remote(pattern):
            out.append(pattern)
            continue
        import tensorflow as tf

        target = scratch / f"remote-{i}"
        target.mkdir(parents=True, exist_ok=True)
        for j, uri in enumerate(sorted(tf.io.gfile.glob(pattern))):
            tf.io.gfile.copy(uri, str(target / f"{j:05d}-{os.path.basename(uri)}"),
                             overwrite=True)
        out.append(str(target))
    return out


def read_split(patterns: Sequence[str], max_length_ratio: float, scratch: Path,
               what: str) -> list[tuple[str, str]]:
    """The ``(source, target)`` pairs of ExampleGen TFRecord files matched by ``patterns``.

    Raises:
      UserInputError: no patterns, no files, a record without ``source``/``target``, or no pairs.
    """
    from aiayn.pipeline.data.readers import Drops, read_tfrecord

    if not patterns:
        raise UserInputError(f"The Trainer got no {what} files (FnArgs.{what}_files is empty); "
                             f"ExampleGen must produce a '{'train' if what == 'train' else 'eval'}'"
                             " split.")
    drops = Drops("skip")  # ExampleGen's input was validated when it was converted
    pairs: list[tuple[str, str]] = []
    for pattern in _local_files(patterns, scratch):
        pairs += read_tfrecord(pattern, drops, max_length_ratio)
    if not pairs:
        raise UserInputError(f"The {what} split ({', '.join(patterns)}) holds no usable pairs.")
    return pairs


def _copy_tree(src: Path, dst: str) -> None:
    """Copies a local directory to ``dst`` (local path or a ``tf.io.gfile`` URI)."""
    if not _is_remote(dst):
        shutil.copytree(src, dst, dirs_exist_ok=True)
        return
    import tensorflow as tf

    for path in sorted(src.rglob("*")):
        target = f"{dst.rstrip('/')}/{path.relative_to(src).as_posix()}"
        if path.is_dir():
            tf.io.gfile.makedirs(target)
        else:
            tf.io.gfile.copy(str(path), target, overwrite=True)


def run_fn(fn_args: Any) -> dict[str, Any]:
    """TFX Trainer entry point: data -> vocabulary -> train -> serving SavedModel.

    Args:
      fn_args: ``tfx.components.FnArgs`` (or any object with the fields listed in the module
        docstring: ``train_files``, ``eval_files``, ``serving_model_dir``, ``model_run_dir``,
        ``custom_config``, ``train_steps``; ``working_dir`` optional).

    Returns:
      The training summary of :func:`aiayn.pipeline.training.train.train`, plus
      ``serving_model_dir``.

    Raises:
      UserInputError: empty splits, a bad ``custom_config``, training that diverged, or an
        export that failed (nothing written to ``serving_model_dir``).
    """
    from aiayn.pipeline.data import corpus, vocab
    from aiayn.pipeline.release.export_run import export_run
    from aiayn.pipeline.training.train import train

    cfg = config_from_custom_config(getattr(fn_args, "custom_config", None),
                                    getattr(fn_args, "train_steps", None))
    serving_model_dir = str(fn_args.serving_model_dir)
    model_run_dir = str(getattr(fn_args, "model_run_dir", "") or "")
    scratch = Path(tempfile.mkdtemp(prefix="aiayn-tfx-"))
    try:
        # Training writes with plain file IO: locally in the run dir, else in scratch and copied.
        local_run = Path(model_run_dir) if model_run_dir and not _is_remote(model_run_dir) \
            else scratch / "run"
        data_dir = local_run / "data"
        cfg = cfg.replace(
            data=_replace(cfg.data, data_dir=str(data_dir)),
            train=_replace(cfg.train, run_dir=str(local_run)),
            export=_replace(cfg.export, base_dir=str(scratch / "export"), version=1))

        ratio = cfg.data.max_length_ratio
        train_pairs = read_split(list(fn_args.train_files or []), ratio, scratch, "train")
        dev_pairs = read_split(list(fn_args.eval_files or []), ratio, scratch, "eval")
        corpus.write_tsv(corpus.split_path(cfg, "train"), train_pairs)
        corpus.write_tsv(corpus.split_path(cfg, "dev"), dev_pairs)
        corpus.write_tsv(corpus.split_path(cfg, "test"), dev_pairs)  # the contract's third split
        print(f"run_fn: {len(train_pairs)} training pairs, {len(dev_pairs)} eval pairs; "
              f"preset {cfg.preset}, {cfg.train.steps} steps; run dir {local_run}", flush=True)

        vocab.train_vocab(cfg)  # on the training split only
        summary = train(cfg)
        with contextlib.redirect_stdout(io.StringIO()):  # its "serve it with" names scratch
            # verify=False: InfraCheck, the next component, runs the same verifier on the copy
            # in serving_model_dir, which is what the Pusher pushes.
            version_dir = export_run(cfg, weights=summary.get("final_weights"), verify=False)
        print(f"run_fn: exported; writing {serving_model_dir}", flush=True)
        _copy_tree(Path(version_dir), serving_model_dir)
        if model_run_dir and _is_remote(model_run_dir):
            _copy_tree(local_run, model_run_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = dict(summary)
    summary["serving_model_dir"] = serving_model_dir
    return summary


def _replace(section: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(section, **changes)
