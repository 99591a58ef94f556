"""Where a training step spends its time: TensorFlow's profiler over ``model.fit``'s step.

Builds and compiles the preset's model exactly as ``aiayn train`` does (the recipe's optimizer,
loss and metrics, the resolved dtype policy and jit_compile, oneDNN as ``aiayn`` sets it), takes
real batches of the project's tf.data pipeline (token budget, 2-D buckets) from
``<data_dir>/train.tsv`` (a synthetic corpus, said so, where ``make data vocab`` has not run),
runs ``--warmup`` untimed steps (tracing every bucket shape in them), times ``--steps`` steps,
then profiles the same steps again. Op time (summed over both threads) is reported by the part
of the model it belongs to (``PARTS``), forward and backward.

    .venv/bin/python bench/train_step_profile.py [--preset small] [--steps 8] [--set K=V]

Prints a table, then (last line) one JSON object: ``s_per_step`` (timed, unprofiled),
``op_ms_per_step`` and ``share_<part>`` for each part.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
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
from decode_profile import trace_events  # noqa: E402
from train import prepared_or_synthetic_corpus  # noqa: E402

from aiayn.models.tokenizer import SubwordTokenizer  # noqa: E402
from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.data.dataset import make_train_dataset  # noqa: E402
from aiayn.pipeline.training import distribute  # noqa: E402
from aiayn.pipeline.training.artifacts import build_model  # noqa: E402
from aiayn.pipeline.training.recipe import compile_model  # noqa: E402

MATMULS = ("MatMul", "_FusedMatMul", "_MklMatMul", "_MklFusedMatMul", "_MklNativeMatMul",
           "_MklNativeFusedMatMul")
# The part of the step an op belongs to, by its name or type; first match wins. The loss's
# hand-written gradient and the metrics run outside the model's name scopes.
PARTS = (
    ("matmul", lambda name, op: op in MATMULS),
    ("attention_batch_matmul", lambda name, op: "BatchMatMul" in op),
    ("layer_norm", lambda name, op: "_norm" in name),
    ("dropout", lambda name, op: "dropout" in name or op.startswith("StatelessRandom")),
    ("loss", lambda name, op: "compile_loss" in name or op == "OneHot"),
    ("optimizer", lambda name, op: name.startswith("adam") or "Resource" in op),
    ("transpose", lambda name, op: "Transpose" in op),
    ("embedding", lambda name, op: "embedding" in name),
    ("other", lambda name, op: True),
)


def part_of(name: str, op: str) -> str:
    return next(part for part, test in PARTS if test(name, op))


def real_batches(cfg, n):
    keras.utils.set_random_seed(0)  # before the tokenizer: seeding destroys its TF resource
    tokenizer = SubwordTokenizer.from_file(Path(cfg.data.data_dir) / "spm.model")
    dataset = make_train_dataset(Path(cfg.data.data_dir) / "train.tsv", tokenizer, cfg.data,
                                 cfg.data.seed)
    return tokenizer, list(dataset.take(n))


def run_steps(model, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        logs = model.train_function(iter([batch]))
    float(logs["loss"])  # waits for the last step
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    cfg, corpus = prepared_or_synthetic_corpus(load_config([args.preset], args.overrides),
                                               Path(tempfile.mkdtemp(prefix="bench_step_")))
    policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
    jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
    keras.mixed_precision.set_global_policy(policy)
    tokenizer, batches = real_batches(cfg, args.warmup + args.steps)
    model = build_model(cfg, tokenizer)
    compile_model(model, cfg, tokenizer.pad_id, jit, policy)
    model.fit(tf.data.Dataset.from_tensors(batches[0]).repeat(2), verbose=0)  # builds the step
    run_steps(model, batches[:args.warmup])
    timed = batches[args.warmup:]
    seconds = run_steps(model, timed) / len(timed)
    by_part, by_type = collections.Counter(), collections.Counter()
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        run_steps(model, timed)
        tf.profiler.experimental.stop()
        for name, op, ms in trace_events(logdir):
            direction = "backward" if name.startswith("gradient_tape") else "forward"
            by_part[(part_of(name, op), direction)] += ms / len(timed)
            by_type[op] += ms / len(timed)
    total = sum(by_part.values())
    tokens = sum(int(tf.reduce_sum(tf.cast(labels != tokenizer.pad_id, tf.int32)))
                 for _, labels in timed) / len(timed)
    print(f"{args.preset}: policy {policy}, jit_compile {jit}, oneDNN {onednn_setting()}; "
          f"{len(timed)} steps of ~{tokens:.0f} real target tokens; corpus: {corpus}")
    print(f"{seconds:.3f} s per step (unprofiled); op time {total:.0f} ms per step")
    print(f"{'part':<26}{'direction':<10}{'ms/step':>9}{'share':>8}")
    for (part, direction), ms in by_part.most_common():
        print(f"{part:<26}{direction:<10}{ms:>9.1f}{100 * ms / total:>7.1f}%")
    print(f"\n{'op type':<28}{'ms/step':>9}{'share':>8}")
    for op, ms in by_type.most_common(15):
        print(f"{op:<28}{ms:>9.1f}{100 * ms / total:>7.1f}%")
    shares = collections.Counter()
    for (part, _), ms in by_part.items():
        shares[part] += ms / total
    result = {"s_per_step": round(seconds, 3), "op_ms_per_step": round(total, 1),
              "onednn": onednn_setting(), "policy": policy, "jit_compile": jit,
              "synthetic_corpus": corpus.startswith("SYNTHETIC")}
    result.update({f"share_{part}": round(share, 3) for part, share in shares.most_common()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
