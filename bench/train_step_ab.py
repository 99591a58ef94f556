"""Two settings of one preset's training step, interleaved: seconds per step, real target tokens.

A recipe choice that changes the batches (``data.concat_fraction``, the length buckets, the
token budget) or the model changes what a step costs, and a time budget turns that cost into
fewer or more steps. This bench builds both settings exactly as ``aiayn train`` does (the
preset, the recipe's optimizer and loss, the resolved dtype policy and jit_compile), takes the
same number of real batches from each setting's tf.data pipeline over ``<data_dir>/train.tsv``
(a synthetic corpus, said so, where ``make data vocab`` has not run), runs every batch once
untimed (tracing every bucket shape), then times ``--rounds`` blocks of ``--steps`` steps per
setting, alternating which goes first. Host noise (a shared machine) falls on both alike; the
median block is reported. Then the CPU time each setting's pipeline spends on a batch, alone
(in training it runs on the same cores as the step). Each step is fed from batches taken
beforehand: two live pipelines in one process timed each other unevenly (the first setting
6% slower than the second in an A/A run).

    .venv/bin/python bench/train_step_ab.py [--a K=V ...] [--b K=V ...] [--set K=V ...] \
        [--preset small] [--batches 48] [--steps 8] [--rounds 12]

``--set`` applies to both settings, ``--a`` to the baseline only, ``--b`` to the candidate only.
With neither ``--a`` nor ``--b`` (as ``make bench`` runs it), the baseline is the preset without
the concatenation of training pairs (``--a data.concat_fraction=0``) and the candidate is the
preset.

Prints a table, then (last line) one JSON object: ``s_per_step_a``, ``s_per_step_b``,
``tokens_per_step_a``, ``tokens_per_step_b``, ``pipeline_cpu_ms_a``, ``pipeline_cpu_ms_b``,
``step_time_ratio`` (b over a) and ``tokens_per_s_ratio`` (b over a: what the time budget turns
into, in trained target tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from aiayn.pipeline.tf_runtime import onednn_setting, prepare_tensorflow  # noqa: E402

prepare_tensorflow()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from train import prepared_or_synthetic_corpus  # noqa: E402

from aiayn.models.tokenizer import SubwordTokenizer  # noqa: E402
from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.data.dataset import make_train_dataset  # noqa: E402
from aiayn.pipeline.release.model_card import cpu_description  # noqa: E402
from aiayn.pipeline.training import distribute  # noqa: E402
from aiayn.pipeline.training.artifacts import build_model  # noqa: E402
from aiayn.pipeline.training.recipe import compile_model  # noqa: E402


class Setting:
    """One side of the comparison: its config, its compiled model, its batches."""

    def __init__(self, name, overrides, cfg, tokenizer, batches: int):
        self.name, self.overrides = name, overrides
        self.dataset = make_train_dataset(Path(cfg.data.data_dir) / "train.tsv", tokenizer,
                                          cfg.data, cfg.data.seed)
        self.batches = list(self.dataset.take(batches))
        self.tokens_per_step = sum(
            int(tf.reduce_sum(tf.cast(labels != tokenizer.pad_id, tf.int32)))
            for _, labels in self.batches) / len(self.batches)
        self.policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
        self.jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
        keras.mixed_precision.set_global_policy(self.policy)
        self.model = build_model(cfg, tokenizer)
        compile_model(self.model, cfg, tokenizer.pad_id, self.jit, self.policy)
        self.model.fit(tf.data.Dataset.from_tensors(self.batches[0]).repeat(2), verbose=0)
        self.next, self.blocks = 0, []

    def run(self, steps: int) -> float:
        """Seconds per step over the next `steps` batches (cycling through the list)."""
        keras.mixed_precision.set_global_policy(self.policy)
        start = time.perf_counter()
        for _ in range(steps):
            logs = self.model.train_function(iter([self.batches[self.next]]))
            self.next = (self.next + 1) % len(self.batches)
        float(logs["loss"])  # waits for the last step
        return (time.perf_counter() - start) / steps

    def pipeline_cpu_ms(self, skip: int, batches: int) -> float:
        """CPU milliseconds (all threads) the tf.data pipeline spends on one batch, after `skip`
        batches (the first epoch tokenises and caches the corpus; later epochs do not)."""
        stream = iter(self.dataset)
        for _ in range(skip):
            next(stream)
        start = time.process_time()
        for _ in range(batches):
            next(stream)
        return (time.process_time() - start) / batches * 1000


def _parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", dest="common", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for both settings")
    parser.add_argument("--a", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the baseline only")
    parser.add_argument("--b", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the candidate only")
    parser.add_argument("--batches", type=int, default=48, help="real batches per setting")
    parser.add_argument("--steps", type=int, default=8, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=12, help="timed blocks per setting")
    parser.add_argument("--pipeline-batches", type=int, default=400,
                        help="batches over which the pipeline's CPU time is measured")
    parser.add_argument("--pipeline-skip", type=int, default=1000,
                        help="untimed batches before (past the first epoch, which tokenises "
                             "and caches the corpus: ~480 batches of the default one)")
    args = parser.parse_args(argv)
    if not args.a and not args.b:
        args.a = ["data.concat_fraction=0"]
    return args


def _time_interleaved(sides: list[Setting], rounds: int, steps: int) -> None:
    """Every batch once untimed (each bucket shape traced), then `rounds` blocks of `steps`
    steps per setting, the one that goes first alternating."""
    for side in sides:
        side.run(len(side.batches))
    for round_ in range(rounds):
        for side in (sides if round_ % 2 == 0 else sides[::-1]):
            side.blocks.append(side.run(steps))


def _report(sides: list[Setting], pipeline_ms: list[float], args, corpus: str) -> dict:
    """Prints the table; the JSON object's figures."""
    print(f"{' '.join([args.preset, *args.common])}: {os.cpu_count()} CPUs {cpu_description()}; "
          f"oneDNN {onednn_setting()}; corpus: {corpus}")
    print(f"{args.rounds} interleaved blocks of {args.steps} steps per setting, over "
          f"{args.batches} real batches each, taken beforehand; median block. The pipeline's "
          f"CPU time a batch (all threads) over {args.pipeline_batches} batches after "
          f"{args.pipeline_skip}, alone: in training it shares the step's cores")
    print(f"{'setting':<44}{'s/step':>8}{'tgt tok/step':>14}{'tgt tok/s':>11}"
          f"{'pipeline CPU ms/batch':>23}{'policy':>16}")
    result = {}
    for side, cpu_ms in zip(sides, pipeline_ms):
        seconds = statistics.median(side.blocks)
        label = f"{side.name}: {' '.join(side.overrides) or 'the preset'}"
        print(f"{label:<44}{seconds:>8.3f}{side.tokens_per_step:>14.0f}"
              f"{side.tokens_per_step / seconds:>11.0f}{cpu_ms:>23.2f}{side.policy:>16}")
        result[f"s_per_step_{side.name}"] = round(seconds, 4)
        result[f"tokens_per_step_{side.name}"] = round(side.tokens_per_step, 1)
        result[f"pipeline_cpu_ms_{side.name}"] = round(cpu_ms, 2)
    step_ratio = result["s_per_step_b"] / result["s_per_step_a"]
    tokens_ratio = (result["tokens_per_step_b"] / result["s_per_step_b"]) / (
        result["tokens_per_step_a"] / result["s_per_step_a"])
    print(f"b over a: {step_ratio:.3f}x the time a step, {tokens_ratio:.3f}x the target tokens "
          "a second")
    result.update({"step_time_ratio": round(step_ratio, 3),
                   "tokens_per_s_ratio": round(tokens_ratio, 3),
                   "a": " ".join(args.a), "b": " ".join(args.b),
                   "synthetic_corpus": corpus.startswith("SYNTHETIC")})
    return result


def main(argv=None) -> int:
    args = _parse_args(argv)
    cfg, corpus = prepared_or_synthetic_corpus(load_config([args.preset], args.common),
                                               Path(tempfile.mkdtemp(prefix="bench_ab_")))
    data_dir = [f"data.data_dir={cfg.data.data_dir}"]
    # Seeded once, before the one tokenizer both settings share: seeding destroys the
    # tokenizer's TF resource, which a pipeline needs again for each new epoch.
    keras.utils.set_random_seed(0)
    tokenizer = SubwordTokenizer.from_file(Path(cfg.data.data_dir) / "spm.model")
    sides = [Setting(name, own, load_config([args.preset], args.common + data_dir + own),
                     tokenizer, args.batches) for name, own in (("a", args.a), ("b", args.b))]
    _time_interleaved(sides, args.rounds, args.steps)
    pipeline_ms = [side.pipeline_cpu_ms(args.pipeline_skip, args.pipeline_batches)
                   for side in sides]
    print(json.dumps(_report(sides, pipeline_ms, args, corpus)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
