"""What feeding training from the tf.data pipeline costs each step, on the machine's own cores.

``bench/input_pipeline.py`` times the pipeline alone; on a 2-core CPU it shares the cores with
the training step, so what matters is how much slower a step runs while the pipeline works
beside it. This script builds the preset's model exactly as ``aiayn train`` does and times
training steps fed three ways, interleaved round by round (so a noisy spell of a shared host
falls on all alike):

- ``in_memory``: batches taken from the pipeline beforehand and held in a list (no input work
  while the steps run: the floor);
- ``per_epoch``: the pipeline as it was before the tokenised examples were cached: the lines
  are shuffled, repeated and tokenised again in every epoch (what ``data.subword_alpha`` > 0
  still does);
- ``cached``: the project's pipeline (``make_train_dataset``): the file is tokenised once, in
  the first epoch, then the examples are shuffled and batched from memory.

Both pipelines are first run past their first epoch, so the timed steps see the steady state.

    .venv/bin/python bench/input_overhead.py [--preset small] [--steps 100] [--rounds 3]

Batches differ in shape from way to way, so the unit is time per 1,000 padded (source +
target) tokens. Every step is fed as ``fit`` feeds one; the pipelines' threads run beside it.
Prints a table, then (last line) one JSON object: ``ms_per_1k_tokens_<way>`` (median over
rounds), ``per_epoch_over_in_memory``, ``cached_over_in_memory`` and ``per_epoch_over_cached``
(how many times as long training took per token; above 1 is the input's cost).
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

from aiayn.pipeline.tf_runtime import prepare_tensorflow  # noqa: E402

prepare_tensorflow()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from train import prepared_or_synthetic_corpus  # noqa: E402

from aiayn.models.tokenizer import SubwordTokenizer  # noqa: E402
from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.data import dataset as ds  # noqa: E402
from aiayn.pipeline.training import distribute  # noqa: E402
from aiayn.pipeline.training.artifacts import build_model  # noqa: E402
from aiayn.pipeline.training.recipe import compile_model  # noqa: E402

WAYS = ("in_memory", "per_epoch", "cached")


def per_epoch_pipeline(path: Path, tokenizer, data_cfg, seed: int) -> tf.data.Dataset:
    """The training pipeline with the lines tokenised again in every epoch (the baseline)."""
    bounds = ds.effective_boundaries(data_cfg.bucket_boundaries, data_cfg.max_length)
    lines = tf.data.TextLineDataset([str(path)])
    lines = lines.shuffle(max(1, data_cfg.shuffle_buffer), seed=seed,
                          reshuffle_each_iteration=True).repeat()
    dataset = lines.apply(ds.featurize_pairs(tokenizer)).apply(
        ds.filter_by_length(data_cfg.max_length))
    dataset = dataset.apply(ds.batch_by_token_budget(bounds, data_cfg.token_budget,
                                                     tokenizer.pad_id, drop_remainder=True))
    dataset = dataset.shuffle(ds.BATCH_SHUFFLE_BUFFER, seed=seed + 1,
                              reshuffle_each_iteration=True)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(ds._options())


def past_first_epoch(dataset: tf.data.Dataset, skip: int):
    iterator = iter(dataset)
    for _ in range(skip):
        next(iterator)
    return iterator


def timed_steps(model, source, steps: int) -> tuple[float, float]:
    """``(seconds, padded tokens)`` of ``steps`` training steps; ``source`` is an iterator of
    batches (the pipeline working beside the steps) or a list (batches held in memory)."""
    tokens, start = 0.0, time.perf_counter()
    for i in range(steps):
        batch = source[i] if isinstance(source, list) else next(source)
        features = batch[0]
        tokens += float(tf.size(features["encoder_token_ids"])
                        + tf.size(features["decoder_token_ids"]))
        logs = model.train_function(iter([batch]))
    float(logs["loss"])  # waits for the last step
    return time.perf_counter() - start, tokens


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    cfg, corpus = prepared_or_synthetic_corpus(load_config([args.preset], args.overrides),
                                               Path(tempfile.mkdtemp(prefix="bench_input_")))
    data_dir = Path(cfg.data.data_dir)
    policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
    jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)  # before the tokenizer: seeding destroys its TF resource
    tokenizer = SubwordTokenizer.from_file(data_dir / "spm.model")
    counts = ds.length_filter_counts([data_dir / "train.tsv"], tokenizer, cfg.data)
    # At least one epoch: a batch holds at least token_budget // max_length pairs.
    skip = counts["kept"] // max(1, cfg.data.token_budget // cfg.data.max_length) + 1
    cached = past_first_epoch(ds.make_train_dataset(data_dir / "train.tsv", tokenizer,
                                                    cfg.data, cfg.data.seed), skip)
    per_epoch = past_first_epoch(per_epoch_pipeline(data_dir / "train.tsv", tokenizer,
                                                    cfg.data, cfg.data.seed), skip)
    in_memory = [next(cached) for _ in range(args.steps)]
    model = build_model(cfg, tokenizer)
    compile_model(model, cfg, tokenizer.pad_id, jit, policy)
    model.fit(tf.data.Dataset.from_tensors(in_memory[0]).repeat(2), verbose=0)  # builds it
    for way in (in_memory, per_epoch, cached):  # every path traced and warm before timing
        timed_steps(model, way, 4)
    sources = {"in_memory": in_memory, "per_epoch": per_epoch, "cached": cached}
    ms: dict[str, list[float]] = {way: [] for way in WAYS}  # ms per 1,000 padded tokens
    print(f"{args.preset}: policy {policy}, jit_compile {jit}; corpus: {corpus}; "
          f"{args.steps} steps a way, {args.rounds} interleaved rounds, after {skip} batches")
    print(f"{'round':<7}" + "".join(f"{way:>12}" for way in WAYS)
          + "   (ms of training per 1,000 padded source + target tokens)")
    for r in range(args.rounds):
        for way in WAYS:
            seconds, tokens = timed_steps(model, sources[way], args.steps)
            ms[way].append(1e6 * seconds / tokens)
        print(f"{r + 1:<7}" + "".join(f"{ms[way][-1]:>12.2f}" for way in WAYS))
    median = {way: statistics.median(values) for way, values in ms.items()}
    result = {f"ms_per_1k_tokens_{way}": round(median[way], 3) for way in WAYS}
    result.update(per_epoch_over_in_memory=round(median["per_epoch"] / median["in_memory"], 3),
                  cached_over_in_memory=round(median["cached"] / median["in_memory"], 3),
                  per_epoch_over_cached=round(median["per_epoch"] / median["cached"], 3),
                  synthetic_corpus=corpus.startswith("SYNTHETIC"))
    print("median " + "".join(f"{median[way]:>12.2f}" for way in WAYS))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
