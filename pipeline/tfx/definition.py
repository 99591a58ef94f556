"""The TFX pipeline definition: ExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator ->
Trainer -> Pusher. Pure: it builds the pipeline object and runs nothing (runners: tfx/runners.py).

- ExampleGen: ``ImportExampleGen`` over TFRecord ``tf.Example``s with ``source`` / ``target``
  bytes features (``aiayn tfx-data`` writes them), or ``CsvExampleGen`` over a two-column CSV;
  the input's ``train/`` and ``eval/`` directories become the ``train`` and ``eval`` splits
  (the project's train and dev splits: no re-splitting by hash).
- StatisticsGen / SchemaGen / ExampleValidator (TensorFlow Data Validation, on Beam): statistics
  per split, a schema inferred from them, anomalies of the eval split against it.
- Trainer: the project's own training (``aiayn.pipeline.tfx.trainer.run_fn``); tokenisation
  stays inside our graph, so there is no Transform component (tensorflow-transform is Keras 2).
- Pusher: copies the serving SavedModel to ``<push_dir>/<unix time>/``, an integer version
  directory that ``tensorflow_model_server --model_base_path=<push_dir>`` picks up.

Example::

    pipeline = create_pipeline("aiayn-translate", "runs/tfx/root", "data/tfx_examples",
                               push_dir="exports/translate", config=cfg.to_dict(),
                               train_steps=cfg.train.steps)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.pipeline.tfx.examples import INPUT_SPLITS
from aiayn.pipeline.tfx.trainer import RUN_FN

PIPELINE_NAME = "aiayn-translate"
INPUT_FORMATS = ("tfrecord", "csv")


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
      config: the resolved run configuration (``Config.to_dict()``), given to ``run_fn``.
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
    """
    from tfx import v1 as tfx

    if input_format not in INPUT_FORMATS:
        raise ValueError(f"`input_format` must be one of {INPUT_FORMATS}; got {input_format!r}.")
    data = _data_components(tfx, examples_dir, input_format)
    example_gen, schema_gen = data[0], data[2]

    # The project's training (vocabulary, model.fit, export) as the Trainer's run_fn.
    trainer = tfx.components.Trainer(
        run_fn=run_fn,
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=int(train_steps)),
        eval_args=tfx.proto.EvalArgs(splits=["eval"]),
        custom_config={"config": _plain(config), "preset": preset,
                       "overrides": list(overrides)})

    # Copies the verified SavedModel to an integer version directory TF Serving watches.
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=push_dir)))
    components = [*data, trainer, pusher]

    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=components,
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


def _plain(value: Any) -> Any:
    """JSON-friendly copy (custom_config travels as JSON)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
