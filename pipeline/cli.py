"""The `aiayn` command line: one subcommand per stage, each a thin call into the library.

    aiayn data      --preset small            # corpus -> train/dev/test TSV + data report
    aiayn vocab     --preset small            # SentencePiece on the training split
    aiayn train     --preset small --set train.steps=100
    aiayn evaluate  --preset small --split test
    aiayn export    --preset small
    aiayn run       --preset small            # data -> vocab -> train -> evaluate -> export

Every subcommand takes ``--preset`` (repeatable, merged right-most-wins; a name or a YAML path)
and ``--set section.key=value`` (repeatable). Library modules are imported lazily so that
``aiayn --help`` answers without loading TensorFlow.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Callable, Sequence

from aiayn.pipeline import config as config_lib
from aiayn.pipeline.errors import UserInputError


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", action="append", default=None, metavar="NAME|FILE.yaml",
        help="Preset name (tiny, small, base, big) or YAML file; repeatable, right-most wins. "
             "Default: small.")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="Override one config value, e.g. --set train.steps=100; repeatable.")


def _config(args: argparse.Namespace) -> config_lib.Config:
    return config_lib.load_config(args.preset or ["small"], args.overrides)


def _call(module: str, function: str) -> Callable[..., Any]:
    return getattr(importlib.import_module(f"aiayn.{module}"), function)


def _print_result(result: Any) -> None:
    if result is None:
        return
    if isinstance(result, (dict, list)):
        print(json.dumps(result, indent=2, ensure_ascii=False, default=str))
    else:
        print(result)


# Each entry: name -> (help, handler(args, cfg), extra-arguments adder or None, needs config).
def _cmd_data(args, cfg):
    return _call("pipeline.corpus", "prepare_data")(cfg)


def _cmd_vocab(args, cfg):
    return str(_call("pipeline.vocab", "train_vocab")(cfg))


def _cmd_train(args, cfg):
    return _call("pipeline.train", "train")(cfg)


def _cmd_average(args, cfg):
    return _call("pipeline.train", "average_checkpoints_for_run")(cfg)


def _cmd_evaluate(args, cfg):
    return _call("pipeline.evaluate", "evaluate_run")(cfg, split=args.split,
                                                        weights=args.weights)


def _args_evaluate(p):
    p.add_argument("--split", default="dev", choices=["dev", "test"],
                   help="Which prepared split to translate and score (default: dev).")
    p.add_argument("--weights", default=None,
                   help="A .weights.h5 file; default: the run's selected final weights.")


def _cmd_export(args, cfg):
    return str(_call("pipeline.publish", "export_run")(cfg))


def _cmd_run(args, cfg):
    return _call("pipeline.run", "run_all")(cfg, stages=args.stages)


def _args_run(p):
    p.add_argument("--stages", default="data,vocab,train,evaluate,export",
                   help="Comma-separated stages to run in order "
                        "(default: data,vocab,train,evaluate,export).")


COMMANDS: dict[str, tuple[str, Callable, Callable | None]] = {
    "data": ("Build the parallel corpus: train/dev/test TSV and a data report.", _cmd_data, None),
    "vocab": ("Train the joint SentencePiece vocabulary on the training split.", _cmd_vocab, None),
    "train": ("Train the Transformer with model.fit (resumes after a crash).", _cmd_train, None),
    "average": ("Average the last N checkpoints of the run.", _cmd_average, None),
    "evaluate": ("Translate a split and score it with sacreBLEU (BLEU, chrF).", _cmd_evaluate,
                 _args_evaluate),
    "export": ("Write the serving SavedModel (versioned, atomic) for TF Serving.", _cmd_export,
               None),
    "run": ("Run the whole job: data, vocab, train, evaluate, export.", _cmd_run, _args_run),
}

# Modules that contribute commands: each has a `COMMANDS` table of the same shape as the one
# above (name -> (help, handler(args, cfg), add-arguments or None)).
EXTRA_COMMAND_MODULES: tuple[str, ...] = (
    "pipeline.serving_commands",
    "pipeline.tfx_commands",
)


def _add_commands(sub, commands) -> None:
    for name, (help_text, handler, add_args) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_config_args(p)
        if add_args:
            add_args(p)
        p.set_defaults(func=lambda args, h=handler: h(args, _config(args)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiayn",
        description="The Transformer (Vaswani et al., 2017) as a translation pipeline on "
                    "Keras 3 / TensorFlow.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_commands(sub, COMMANDS)
    for module in EXTRA_COMMAND_MODULES:
        _add_commands(sub, _call(module, "COMMANDS"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except config_lib.ConfigError as err:
        print(f"aiayn {args.command}: configuration error: {err}", file=sys.stderr)
        return 2
    except UserInputError as err:
        print(f"aiayn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted.", file=sys.stderr)
        return 130
    _print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
