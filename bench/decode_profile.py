"""Where a beam-4 batch spends its time: TensorFlow's profiler over the export's decoder.

Runs ``Transformer.generate`` exactly as the SavedModel does (``tf.function`` with unknown batch
and source length, ``dynamic_shapes=True``) on batches of 32 test-book sentences in file order,
with the trained run's weights (``--weights``, default the preset's ``final.weights.h5``),
2 intra-op and 2 inter-op threads. One untimed pass traces; one pass runs under
``tf.profiler`` (which slows it by about a third). Op time (summed over both threads) is
reported by op type and by the part of the work it belongs to (``PARTS``), as a share of the
total op time.

    .venv/bin/python bench/decode_profile.py [--preset small] [--weights PATH] [--batches 4]

Prints a table, then (last line) one JSON object: ``ms_per_batch``, ``steps``,
``ms_per_step``, and ``share_<part>`` for each part. Without a trained run (``make bench``
before ``make train``) there is nothing to profile: one line says so, and the JSON object is
``{"skipped": <why>}``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from aiayn.pipeline.config import load_config, source_limit  # noqa: E402
from aiayn.pipeline.errors import UserInputError  # noqa: E402
from aiayn.pipeline.training.artifacts import load_trained_model, read_split  # noqa: E402

# The part of the work an op belongs to, by its name (outside the loop: the encoder) or type;
# first match wins. Inside the loop the only plain 2-D MatMul is the pre-softmax projection
# (the dense layers' matmuls are fused with their bias: _FusedMatMul).
PARTS = (
    ("encoder", lambda name, op: "while/" not in name),
    ("output_projection", lambda name, op: op == "MatMul"),
    ("dense_layers", lambda name, op: op == "_FusedMatMul"),
    ("attention", lambda name, op: op in ("BatchMatMulV2", "Softmax")),
    ("cache_copies", lambda name, op: op in ("ConcatV2", "GatherV2")),
    ("beam_search", lambda name, op: op in ("TopKV2", "LogSoftmax")),
    ("other", lambda name, op: True),
)


def part_of(name: str, op: str) -> str:
    return next(part for part, test in PARTS if test(name, op))


def profile(fn, batches, logdir):
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    steps = 0
    for ids, mask in batches:
        out = fn(ids, mask)
        steps += int(np.max(out["lengths"])) + 1
    seconds = time.perf_counter() - start
    tf.profiler.experimental.stop()
    return seconds, steps


def trace_events(logdir):
    """``(op name, op type, ms)`` of every TensorFlow op the profiler recorded in ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name in ("python", "Steps", "XLA Ops", "XLA Modules"):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "?")
                if ":" not in name or "::" in name:  # not a TensorFlow op (executor work)
                    continue
                op_name, op_type = name.rsplit(":", 1)
                if op_type in ("While", "StatefulPartitionedCall", "PartitionedCall"):
                    continue  # their bodies' ops are counted themselves
                yield op_name, op_type, event.duration_ps / 1e9


def op_times(logdir):
    by_type, by_part = collections.Counter(), collections.Counter()
    for op_name, op_type, ms in trace_events(logdir):
        by_type[op_type] += ms
        by_part[part_of(op_name, op_type)] += ms
    return by_type, by_part


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--weights", default=None)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    cfg = load_config([args.preset])
    try:
        model, tokenizer, path = load_trained_model(cfg, args.weights)
    except UserInputError as err:  # e.g. `make bench` before `make train`: nothing to profile
        print(f"decode_profile: skipped: {err}")
        print(json.dumps({"skipped": str(err)}))
        return 0
    sources = [s for s, _ in read_split(cfg, "test")][:args.batches * args.batch]
    limit = source_limit(cfg)
    batches = []
    for i in range(0, len(sources), args.batch):  # the one featuriser, as the export runs it
        features = tokenizer.featurize_source(tf.constant(sources[i:i + args.batch]), limit)
        batches.append((features.token_ids, features.padding_mask))
    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool)]
    dec = cfg.decode

    @tf.function(input_signature=spec)
    def generate(ids, mask):
        return model.generate(ids, mask, tokenizer.bos_id, tokenizer.eos_id,
                              beam_size=dec.beam_size, length_penalty=dec.length_penalty,
                              max_extra_length=dec.max_extra_length, dynamic_shapes=True,
                              stop_rule=dec.stop_rule)

    for ids, mask in batches:
        generate(ids, mask)
    with tempfile.TemporaryDirectory() as logdir:
        seconds, steps = profile(generate, batches, logdir)
        by_type, by_part = op_times(logdir)
    total = sum(by_type.values())
    print(f"weights: {path}; {len(batches)} batches of {args.batch}, file order, beam "
          f"{dec.beam_size}")
    print(f"wall {1000 * seconds / len(batches):.1f} ms per batch, {steps} steps, "
          f"{1000 * seconds / steps:.2f} ms per step; op time {total:.0f} ms")
    print(f"{'part':<20}{'ms':>10}{'share':>8}")
    for part, ms in by_part.most_common():
        print(f"{part:<20}{ms:>10.1f}{100 * ms / total:>7.1f}%")
    print(f"\n{'op type':<28}{'ms':>10}{'share':>8}")
    for op, ms in by_type.most_common(25):
        print(f"{op:<28}{ms:>10.1f}{100 * ms / total:>7.1f}%")
    result = {"ms_per_batch": round(1000 * seconds / len(batches), 1), "steps": steps,
              "ms_per_step": round(1000 * seconds / steps, 3)}
    result.update({f"share_{part}": round(ms / total, 3) for part, ms in by_part.items()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
