"""The TFX pipeline definition: ExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator ->
Trainer -> BleuEvaluator -> InfraCheck -> Pusher. Pure: it builds the pipeline object and runs
nothing (runners: tfx/runners.py).

- ExampleGen: ``ImportExampleGen`` over TFRecord ``tf.Example``s with ``source`` / ``target``
  bytes features (``aiayn tfx-data`` writes them), or ``CsvExampleGen`` over a two-column CSV;
  the input's ``train/`` and ``eval/`` directories become the ``train`` and ``eval`` splits
  (the project's train and dev splits: no re-splitting by hash).
- StatisticsGen / SchemaGen / ExampleValidator (TensorFlow Data Validation, on Beam): statistics
  per split, a schema inferred from them, anomalies of the eval split against it.
- Trainer: the project's own training (``aiayn.pipeline.tfx.trainer.run_fn``); tokenisation
  stays inside our graph, so there is no Transform component (tensorflow-transform is Keras 2).
- latest_blessed_model_resolver: a ``Resolver`` with ``LatestBlessedModelStrategy``, as in TFX's
  template pipelines: the last Model whose ModelBlessing says blessed, from ML Metadata.
- BleuEvaluator (pipeline/tfx/components.py): sacreBLEU BLEU and chrF of the Trainer's model on
  the eval split, and of that baseline on the same sentences; a ``ModelBlessing``, blessed when
  the BLEU clears ``tfx.bleu_floor`` and is at most ``tfx.bleu_margin`` below the baseline's
  (pipeline/tfx/blessing.py).
- InfraCheck (pipeline/tfx/components.py): the export verifier loads the model in a fresh
  TensorFlow + tensorflow-text process, replays its warmup requests and answers the sample
  sentences; an ``InfraBlessing``.
- Pusher: given both blessings, copies the serving SavedModel to ``<push_dir>/<unix time>/``, an
  integer version directory that ``tensorflow_model_server --model_base_path=<push_dir>`` picks
  up, only when both say blessed; otherwise it records ``pushed = 0`` and the run ends normally.

Example::

    pipeline = create_pipeline("aiayn-translate", "runs/tfx/root", "data/tfx_examples",
                               push_dir="exports/translate", config=cfg.to_dict(),
                               train_steps=cfg.train.steps)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.pipeline.config import DataConfig, DecodeConfig, TfxConfig
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.tfx.blessing import check_thresholds
from aiayn.pipeline.tfx.examples import INPUT_SPLITS
from aiayn.pipeline.tfx.trainer import RUN_FN

PIPELINE_NAME = "aiayn-translate"
INPUT_FORMATS = ("tfrecord", "csv")
RESOLVER_ID = "latest_blessed_model_resolver"


def create_pipeline(
    pipeline_name: str,
    pipeline_root: str,
    examples_dir: str,
    push_dir: str,
    config: Mapping[str, Any],
    train_steps: int,
    input_format: str = "tfrecord",
    preset: str = "",
    overrides: Sequence[str] = (),
    run_fn: str = RUN_FN,
    enable_cache: bool = False,
    metadata_connection_config: Any | None = None,
    beam_pipeline_args: Sequence[str] | None = None,
) -> Any:
    """Builds the translation pipeline.

    Args:
      pipeline_name: the pipeline's name in ML Metadata / Kubeflow.
      pipeline_root: where component outputs go (local path, ``gs://`` on Vertex AI).
      examples_dir: ExampleGen input with ``train/`` and ``eval/`` sub-directories.
      push_dir: Pusher's filesystem destination (TF Serving's ``--model_base_path``).
      config: the resolved run configuration (``Config.to_dict()``), given to ``run_fn``; its
        ``tfx`` section sets the push gate (``bleu_floor``, ``bleu_margin``,
        ``eval_sentences``), ``decode.batch_size`` the evaluation's batches, and
        ``data.target_lang`` / ``train.bleu_tokenize`` its BLEU tokenizer.
      train_steps: ``TrainArgs.num_steps`` (optimizer updates).
      input_format: ``tfrecord`` (ImportExampleGen) or ``csv`` (CsvExampleGen).
      preset: the preset name(s), recorded in the exported config.
      overrides: further ``section.key=value`` overrides applied by ``run_fn``.
      run_fn: dotted path of the Trainer's function (the package must be importable there).
      enable_cache: reuse component results whose inputs did not change.
      metadata_connection_config: ML Metadata connection (SQLite locally; None on Kubeflow).
      beam_pipeline_args: Apache Beam options for the data components (DirectRunner, Dataflow,
        Flink, Spark).

    Returns:
      A ``tfx.dsl.Pipeline``.

    Raises:
      ValueError: an unknown ``input_format``.
      UserInputError: a push-gate setting out of range.
    """
    from tfx import v1 as tfx

    from aiayn.pipeline.tfx import components

    if input_format not in INPUT_FORMATS:
        raise ValueError(f"`input_format` must be one of {INPUT_FORMATS}; got {input_format!r}.")
    if components.TFX_IMPORT_ERROR:
        raise ImportError(components.TFX_IMPORT_ERROR)
    gate = _gate(config)
    data = _data_components(tfx, examples_dir, input_format)
    example_gen, schema_gen = data[0], data[2]
    trainer = _trainer(tfx, example_gen, schema_gen, run_fn=run_fn, train_steps=train_steps,
                       config=config, preset=preset, overrides=overrides)
    baseline, evaluator, infra_check = _model_checks(tfx, example_gen, trainer, gate)
    pusher = _pusher(tfx, trainer, evaluator, infra_check, push_dir=push_dir)
    nodes = [*data, trainer, baseline, evaluator, infra_check, pusher]

    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=nodes,
        enable_cache=enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args or []),
    )


def _data_components(tfx: Any, examples_dir: str, input_format: str) -> list[Any]:
    """ExampleGen, StatisticsGen, SchemaGen, ExampleValidator, in that order."""
    input_config = tfx.proto.Input(splits=[
        tfx.proto.Input.Split(name=name, pattern=pattern)
        for name, pattern in INPUT_SPLITS.items()])
    # Brings the corpus in as tf.Examples; the input's own splits are kept.
    if input_format == "tfrecord":
        example_gen = tfx.components.ImportExampleGen(input_base=examples_dir,
                                                      input_config=input_config)
    else:
        example_gen = tfx.components.CsvExampleGen(input_base=examples_dir,
                                                   input_config=input_config)
    # Statistics of each split (lengths and values of source/target) for validation.
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    # A schema inferred from the statistics: two required bytes features.
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"],
                                          infer_feature_shape=True)
    # Anomalies (missing features, wrong types) of the data against the schema.
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
    return [example_gen, statistics_gen, schema_gen, example_validator]


def _trainer(tfx: Any, example_gen: Any, schema_gen: Any, *, run_fn: str, train_steps: int,
             config: Mapping[str, Any], preset: str, overrides: Sequence[str]) -> Any:
    """The Trainer: the project's training (vocabulary, model.fit, export) as its ``run_fn``."""
    return tfx.components.Trainer(
        run_fn=run_fn,
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=int(train_steps)),
        eval_args=tfx.proto.EvalArgs(splits=["eval"]),
        custom_config={"config": _plain(config), "preset": preset,
                       "overrides": list(overrides)})


def _model_checks(tfx: Any, example_gen: Any, trainer: Any, gate: Mapping[str, Any]) -> list[Any]:
    """The baseline Resolver, BleuEvaluator and InfraCheck of the Trainer's model, in that order
    (``gate``: the BleuEvaluator's parameters, from :func:`_gate`)."""
    from aiayn.pipeline.tfx import components

    # The last blessed model, from ML Metadata (empty on the first run): the baseline.
    baseline = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id(RESOLVER_ID)
    # sacreBLEU of the new model and of the baseline on the eval split -> ModelBlessing.
    evaluator = components.BleuEvaluator(
        examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
        baseline_model=baseline.outputs["model"], **gate)
    # The served graph in a fresh TensorFlow-only process, warmup replayed -> InfraBlessing.
    infra_check = components.InfraCheck(model=trainer.outputs["model"])
    return [baseline, evaluator, infra_check]


def _pusher(tfx: Any, trainer: Any, evaluator: Any, infra_check: Any, *, push_dir: str) -> Any:
    """The Pusher: copies the SavedModel to an integer version directory TF Serving watches, only
    when both blessings say blessed (otherwise the PushedModel records pushed = 0)."""
    return tfx.components.Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        infra_blessing=infra_check.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=push_dir)))


def _gate(config: Mapping[str, Any]) -> dict[str, Any]:
    """The BleuEvaluator's parameters from the config mapping (defaults where a key is absent).

    Raises:
      UserInputError: a threshold or the sentence count out of range.
    """
    values = {**dataclasses.asdict(TfxConfig()), **dict(config.get("tfx") or {})}
    batch_size = dict(config.get("decode") or {}).get("batch_size", DecodeConfig().batch_size)
    target_lang = dict(config.get("data") or {}).get("target_lang", DataConfig().target_lang)
    bleu_tokenize = dict(config.get("train") or {}).get("bleu_tokenize", "auto")
    floor, margin = values["bleu_floor"], values["bleu_margin"]
    check_thresholds(floor, margin)
    sentences = values["eval_sentences"]
    if isinstance(sentences, bool) or not isinstance(sentences, int) or sentences < 0:
        raise UserInputError(f"`tfx.eval_sentences` must be an integer >= 0 (0 = the whole eval "
                             f"split); got {sentences!r}.")
    return {"bleu_floor": float(floor), "bleu_margin": float(margin),
            "eval_sentences": sentences, "batch_size": int(batch_size),
            "target_lang": str(target_lang), "bleu_tokenize": str(bleu_tokenize)}


def _plain(value: Any) -> Any:
    """JSON-friendly copy (custom_config travels as JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
