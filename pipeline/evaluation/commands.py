"""`aiayn evaluate`, `plot-positional-encoding`, `plot-curves`: the evaluation stage's commands.

Handlers import the library lazily so that ``aiayn --help`` answers without loading TensorFlow.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _cmd_evaluate(args: argparse.Namespace, cfg):
    from aiayn.pipeline.evaluation.evaluate import evaluate_run

    return evaluate_run(cfg, split=args.split, weights=args.weights)


def _args_evaluate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", default="dev", choices=["dev", "test"],
                   help="Which prepared split to translate and score (default: dev).")
    p.add_argument("--weights", default=None,
                   help="A .weights.h5 file; default: the run's selected final weights.")


def _cmd_plot_positional_encoding(args: argparse.Namespace, cfg) -> None:
    from aiayn.pipeline.evaluation.plots import plot_positional_encoding

    data = plot_positional_encoding(args.out, length=args.length,
                                    dim=args.dim or cfg.model.hidden_dim)
    print(data["path"])


def _args_plot_positional_encoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT.png", help="Where to write the figure.")
    p.add_argument("--length", type=int, default=128, help="Positions shown (default 128).")
    p.add_argument("--dim", type=int, default=0,
                   help="d_model (default: model.hidden_dim of the preset).")


def _cmd_plot_curves(args: argparse.Namespace, cfg) -> None:
    from aiayn.pipeline.evaluation.plots import plot_training_curves

    print(plot_training_curves(args.run_dir or cfg.train.run_dir, args.output))


def _args_plot_curves(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, help="Run directory (default train.run_dir).")
    p.add_argument("--output", default=None, help="Default: <run_dir>/curves.png.")


COMMANDS: dict[str, tuple[str, Callable, Callable | None]] = {
    "evaluate": ("Translate a split and score it with sacreBLEU (BLEU, chrF).", _cmd_evaluate,
                 _args_evaluate),
    "plot-positional-encoding": ("Plot the sinusoidal positional encoding (§3.5) and the "
                                 "dot-product similarity between positions.",
                                 _cmd_plot_positional_encoding, _args_plot_positional_encoding),
    "plot-curves": ("Plot the run's training curves (loss, dev BLEU, learning rate) to "
                    "<run_dir>/curves.png.", _cmd_plot_curves, _args_plot_curves),
}
