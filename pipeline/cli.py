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
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from aiayn.pipeline import config as config_lib
from aiayn.pipeline.data import commands as data_commands
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.evaluation import commands as evaluation_commands
from aiayn.pipeline.release import commands as release_commands
from aiayn.pipeline.tf_runtime import prepare_tensorflow
from aiayn.pipeline.tfx import commands as tfx_commands
from aiayn.pipeline.training import commands as training_commands


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


def _print_result(result: Any) -> None:
    if result is None:
        return
    if isinstance(result, (dict, list)):
        print(json.dumps(result, indent=2, ensure_ascii=False, default=str))
    else:
        print(result)


def _cmd_run(args, cfg):
    from aiayn.pipeline.run import run_all

    return run_all(cfg, stages=args.stages, started_at=args.started_at)


def _unix_time(text: str) -> float:
    """``--started-at``: seconds since the epoch (``date +%s``), finite and not in the future."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value > time.time() + 60.0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a start time: give seconds since the epoch, as `date +%s` prints "
            "them, no later than now.")
    return value


def _args_run(p):
    p.add_argument("--stages", default="data,vocab,train,evaluate,export",
                   help="Comma-separated stages to run in order "
                        "(default: data,vocab,train,evaluate,export).")
    p.add_argument("--started-at", type=_unix_time, default=None, metavar="UNIX_SECONDS",
                   help="When the job began (`date +%%s`), from which train.deadline_minutes "
                        "counts: `make train` passes the start of its set-up. Default: now.")


RUN_COMMANDS = {
    "run": ("Run the whole job: data, vocab, train, evaluate, export.", _cmd_run, _args_run),
}

# Each stage's commands, in the order the data flows (name -> (help, handler(args, cfg),
# add-arguments or None)). The modules import the library lazily inside their handlers.
STAGE_COMMANDS = (data_commands.COMMANDS, training_commands.COMMANDS,
                  evaluation_commands.COMMANDS, release_commands.COMMANDS, tfx_commands.COMMANDS,
                  RUN_COMMANDS)


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
    for commands in STAGE_COMMANDS:
        _add_commands(sub, commands)
    return parser


def _os_error_text(err: OSError) -> str:
    fix = {IsADirectoryError: " (a directory was given where a file is expected)",
           NotADirectoryError: " (a file was given where a directory is expected)",
           PermissionError: " (check the permissions, or choose another path)",
           FileNotFoundError: " (check the path)"}.get(type(err), "")
    if err.strerror is None:  # raised with a message of its own, e.g. FileNotFoundError("...")
        return f"{err}{fix}"
    where = f": {err.filename}" if err.filename else ""
    return f"{err.strerror}{where}{fix}"


def _one_line(message: object) -> str:
    """The error as ONE line: a multi-line message (a child process's stderr, a list of problems)
    keeps its first line and its `- item` lines, else its last line (the exception)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else str(message).strip()
    items = [line[2:] for line in lines[1:] if line.startswith("- ")]
    return f"{lines[0].rstrip(':')}: {'; '.join(items) if items else lines[-1]}"


def main(argv: Sequence[str] | None = None) -> int:
    prepare_tensorflow()  # before any handler imports TensorFlow
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except config_lib.ConfigError as err:
        print(f"aiayn {args.command}: configuration error: {_one_line(err)}", file=sys.stderr)
        return 2
    except UserInputError as err:
        print(f"aiayn {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # an unreadable, missing or unwritable path the user gave
        print(f"aiayn {args.command}: error: {_one_line(_os_error_text(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted.", file=sys.stderr)
        return 130
    _print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
