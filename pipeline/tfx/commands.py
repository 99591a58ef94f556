"""`aiayn tfx-data`, `tfx-run`, `tfx-compile`: thin commands over the TFX pipeline.

    aiayn tfx-data    --preset tiny                      # corpus -> <data_dir>/tfx_examples
    aiayn tfx-run     --preset tiny                      # LocalDagRunner; push only if blessed
    aiayn tfx-compile --preset small --output aiayn-translate.json \
        --pipeline-root gs://B/tfx --examples gs://B/examples --push-dir gs://B/serving/translate \
        --image IMAGE_URI \
        --beam-arg=--runner=DataflowRunner --beam-arg=--project=P --beam-arg=--region=R

`tfx-run` and `tfx-compile` need TFX 1.21 (`make tfx` finds or builds an environment for it,
see pipeline/scripts/tfx_env.sh); `tfx-data` needs only TensorFlow.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any


def _cmd_tfx_data(args: argparse.Namespace, cfg) -> dict[str, Any]:
    from aiayn.pipeline.tfx.examples import write_example_gen_input

    return write_example_gen_input(cfg, args.out, fmt=args.format)


def _args_tfx_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None,
                   help="Output directory (default <data.data_dir>/tfx_examples); gets train/ "
                        "and eval/ sub-directories.")
    p.add_argument("--format", default="tfrecord", choices=["tfrecord", "csv"],
                   help="tfrecord: GZIP tf.Example records for ImportExampleGen (default); "
                        "csv: a source,target CSV for CsvExampleGen.")


def _beam_args(values: list[str]) -> list[str]:
    out: list[str] = []
    for value in values or []:
        out += value.split()
    return out


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="tfrecord", choices=["tfrecord", "csv"],
                   help="ExampleGen input format: tfrecord (ImportExampleGen) or csv "
                        "(CsvExampleGen).")
    p.add_argument("--beam-arg", dest="beam_args", action="append", default=[],
                   metavar="ARG",
                   help="An Apache Beam pipeline option, passed through (repeatable; write "
                        "--beam-arg=--runner=DataflowRunner).")


def _cmd_tfx_run(args: argparse.Namespace, cfg) -> dict[str, Any]:
    from aiayn.pipeline.tfx.runners import run_local

    return run_local(cfg, examples_dir=args.examples, input_format=args.format,
                     tfx_dir=args.tfx_dir, push_dir=args.push_dir,
                     beam_pipeline_args=_beam_args(args.beam_args))


def _args_tfx_run(p: argparse.ArgumentParser) -> None:
    from aiayn.pipeline.tfx.runners import DEFAULT_TFX_DIR

    p.add_argument("--examples", default=None,
                   help="ExampleGen input directory (default <data.data_dir>/tfx_examples).")
    p.add_argument("--tfx-dir", default=os.environ.get("AIAYN_TFX_DIR", DEFAULT_TFX_DIR),
                   help=f"Pipeline root and SQLite metadata go here (default {DEFAULT_TFX_DIR}).")
    p.add_argument("--push-dir", default=None,
                   help="Pusher destination (default <export.base_dir>/<export.model_name>, "
                        "the directory TF Serving watches).")
    _add_common(p)


def _cmd_tfx_compile(args: argparse.Namespace, cfg) -> dict[str, Any]:
    from aiayn.pipeline.tfx.runners import compile_kubeflow_v2

    return compile_kubeflow_v2(cfg, args.output, pipeline_root=args.pipeline_root,
                               examples_dir=args.examples, push_dir=args.push_dir,
                               image=args.image, input_format=args.format,
                               beam_pipeline_args=_beam_args(args.beam_args))


def _args_tfx_compile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="aiayn-translate.json",
                   help="The pipeline definition to write (default aiayn-translate.json).")
    p.add_argument("--pipeline-root", required=True,
                   help="Where the cluster writes component outputs, e.g. gs://BUCKET/tfx.")
    p.add_argument("--examples", required=True,
                   help="ExampleGen input the cluster can read, e.g. gs://BUCKET/examples "
                        "(upload the output of `aiayn tfx-data`).")
    p.add_argument("--push-dir", required=True,
                   help="Pusher destination, e.g. gs://BUCKET/serving/translate.")
    p.add_argument("--image", required=True,
                   help="Container image with TFX 1.21 and this package installed.")
    _add_common(p)


COMMANDS: dict[str, tuple[str, Callable, Callable]] = {
    "tfx-data": ("Write the corpus as TFX ExampleGen input (tf.Example source/target, or CSV).",
                 _cmd_tfx_data, _args_tfx_data),
    "tfx-run": ("Run the TFX pipeline locally (LocalDagRunner, Beam DirectRunner, SQLite "
                "metadata): push only a model the BLEU evaluation and the infra check bless, "
                "and verify it; else say why nothing was pushed.", _cmd_tfx_run, _args_tfx_run),
    "tfx-compile": ("Compile the TFX pipeline to Kubeflow Pipelines V2 / Vertex AI JSON.",
                    _cmd_tfx_compile, _args_tfx_compile),
}
