"""Input-pipeline benchmark: is training ever input-bound?

Runs the training tf.data pipeline (``aiayn.pipeline.data.dataset.make_train_dataset``) on the
default
corpus and prints examples/s, source and target tokens/s, padding efficiency and the number of
distinct batch shapes; then measures how many target tokens/s training consumes (a random-weight
Transformer of the preset, ``train_on_batch`` on the pipeline's most common batch shape) and
prints the ratio. The last line is one JSON object with at least ``padding_efficiency``,
``pipeline_tokens_per_s`` and ``pipeline_over_training``.

Tokens/s count real target tokens (labels: target + EOS), the unit in which training consumes
data. Both stages are timed alone; on a machine where they share CPU cores the pipeline's
share is smaller, which is why it should supply at least 10x.

    python bench/input_pipeline.py                        # preset small, data/train.tsv
    python bench/input_pipeline.py --training-tokens-per-s 3000   # skip the model timing

If ``<data_dir>/train.tsv`` does not exist yet (``aiayn data --preset small`` creates it), a
synthetic stand-in with verse-like lengths is generated in a temporary directory, and so is a
SentencePiece model if ``<data_dir>/spm.model`` is missing; the output says so.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from aiayn.models.tokenizer import SubwordTokenizer  # noqa: E402
from aiayn.pipeline import config as config_lib  # noqa: E402
from aiayn.pipeline.data.dataset import batch_statistics, make_train_dataset  # noqa: E402
from aiayn.pipeline.data.vocab import train_vocab, vocab_path  # noqa: E402


def synthetic_corpus(path: Path, num_pairs: int, seed: int) -> None:
    """Writes a TSV with Bible-verse-like lengths (words per side lognormal, median ~24, the
    Spanish side ~5% longer) over a Zipfian vocabulary of made-up words."""
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfglmnprstvz" for v in "aeiou"]

    def lexicon(size):
        words = set()
        while len(words) < size:
            words.add("".join(rng.choice(syllables, size=rng.integers(1, 4))))
        return np.array(sorted(words))

    en_lex, es_lex = lexicon(12000), lexicon(15000)
    zipf = 1.0 / np.arange(1, 15001) ** 1.05
    en_p, es_p = zipf[:12000] / zipf[:12000].sum(), zipf / zipf.sum()
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(num_pairs):
            n = int(max(2, min(120, round(math.exp(rng.normal(math.log(24), 0.45))))))
            m = int(max(2, round(n * math.exp(rng.normal(0.05, 0.12)))))
            en = " ".join(rng.choice(en_lex, size=n, p=en_p)).capitalize() + "."
            es = " ".join(rng.choice(es_lex, size=m, p=es_p)).capitalize() + "."
            f.write(f"{en}\t{es}\n")


def time_pipeline(dataset: tf.data.Dataset, warmup: int, batches: int):
    iterator = iter(dataset)
    kept = []
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        features, labels = next(iterator)
        kept.append(({k: v.numpy() for k, v in features.items()}, labels.numpy()))
    seconds = time.perf_counter() - start
    return kept, seconds


def time_training(cfg, tokenizer, batches, steps: int, warmup: int) -> tuple[float, str]:
    """Target tokens/s of train_on_batch with a random-weight model on one batch shape."""
    import keras

    from aiayn.models.transformer import Transformer

    try:
        from aiayn.models.losses import MaskedLabelSmoothedCrossEntropy
        loss = MaskedLabelSmoothedCrossEntropy(cfg.train.label_smoothing, tokenizer.pad_id)
    except ImportError:  # pragma: no cover - before the losses module lands
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    keras.utils.set_random_seed(0)
    model = Transformer(vocabulary_size=tokenizer.vocabulary_size, pad_id=tokenizer.pad_id,
                        **dataclasses.asdict(cfg.model))
    model.compile(optimizer=keras.optimizers.Adam(1e-4, beta_2=0.98, epsilon=1e-9), loss=loss,
                  jit_compile=False)
    # The most common shape, so the timing excludes retracing for new shapes.
    shape_of = lambda b: (b[0]["encoder_token_ids"].shape, b[1].shape)  # noqa: E731
    common = collections.Counter(shape_of(b) for b in batches).most_common(1)[0][0]
    same = [b for b in batches if shape_of(b) == common]
    for i in range(warmup):
        model.train_on_batch(*same[i % len(same)])
    tokens = 0
    start = time.perf_counter()
    for i in range(steps):
        features, labels = same[i % len(same)]
        model.train_on_batch(features, labels)
        tokens += int(features["decoder_padding_mask"].sum())
    seconds = time.perf_counter() - start
    return tokens / seconds, f"batch (B, S)={common[0]}, T={common[1][1]}"


def _corpus_and_tokenizer(cfg, train_file: str | None, synthetic_pairs: int):
    """The training file and its SentencePiece model: (path, tokenizer, notes); a synthetic
    stand-in and a model trained on it where they do not exist yet (the notes say so)."""
    notes = []
    train_file = Path(train_file or Path(cfg.data.data_dir) / "train.tsv")
    synthetic = not train_file.exists()
    if synthetic:
        notes.append(f"{train_file} does not exist yet (`aiayn data --preset small` creates it): "
                     f"using a SYNTHETIC stand-in of {synthetic_pairs} pairs with "
                     "verse-like lengths.")
        train_file = Path(tempfile.mkdtemp(prefix="aiayn-bench-")) / "train.tsv"
        synthetic_corpus(train_file, synthetic_pairs, cfg.data.seed)
    model_file = vocab_path(cfg)
    if synthetic or not model_file.exists():
        notes.append(f"SentencePiece model trained for this run on {train_file.name} "
                     f"({cfg.data.vocab_model_type}, vocab_size {cfg.data.vocab_size}).")
        tmp_cfg = cfg.replace(data=dataclasses.replace(cfg.data, data_dir=str(train_file.parent)))
        model_file = train_vocab(tmp_cfg)
    return train_file, SubwordTokenizer.from_file(model_file), notes


def _print_report(row: dict, notes: list[str]) -> None:
    for note in notes:
        print("note:", note)
    print(f"note: {os.cpu_count()} CPU cores visible; both stages timed alone.")
    print()
    print(f"{'metric':<28}{'value':>20}")
    print("-" * 48)
    for key, value in row.items():
        text = f"{value:,.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<28}{text:>20}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--train-file", default=None, help="Default: <data_dir>/train.tsv.")
    parser.add_argument("--batches", type=int, default=300, help="Timed pipeline batches.")
    parser.add_argument("--warmup", type=int, default=30, help="Untimed first batches.")
    parser.add_argument("--training-tokens-per-s", type=float, default=None,
                        help="Training consumption (target tokens/s); skips the model timing.")
    parser.add_argument("--train-steps", type=int, default=5, help="Timed training steps.")
    parser.add_argument("--synthetic-pairs", type=int, default=25000)
    args = parser.parse_args(argv)

    cfg = config_lib.load_config(args.preset or ["small"], args.overrides)
    train_file, tokenizer, notes = _corpus_and_tokenizer(cfg, args.train_file,
                                                         args.synthetic_pairs)
    synthetic = bool(notes) and "SYNTHETIC" in notes[0]

    dataset = make_train_dataset(train_file, tokenizer, cfg.data, seed=cfg.data.seed)
    batches, seconds = time_pipeline(dataset, args.warmup, args.batches)
    stats = batch_statistics(batches)
    pipeline_tps = stats["target_tokens"] / seconds
    if args.training_tokens_per_s:
        training_tps, how = args.training_tokens_per_s, "given with --training-tokens-per-s"
    else:
        training_tps, how = time_training(cfg, tokenizer, batches, args.train_steps, warmup=2)
        how = f"measured: random-weight `{cfg.preset}` Transformer, train_on_batch, {how}"
    row = {
        "corpus": "synthetic stand-in" if synthetic else str(train_file),
        "preset": cfg.preset,
        "token_budget": cfg.data.token_budget,
        "batches": stats["batches"],
        "examples_per_s": stats["examples"] / seconds,
        "source_tokens_per_s": stats["source_tokens"] / seconds,
        "target_tokens_per_s": pipeline_tps,
        "padding_efficiency": stats["padding_efficiency"],
        "distinct_batch_shapes": stats["shapes"],
        "max_batch_tokens": stats["max_batch_tokens"],
        "training_tokens_per_s": training_tps,
        "pipeline_over_training": pipeline_tps / training_tps,
    }
    _print_report(row, notes + [f"training consumption {how}."])
    summary = {"padding_efficiency": round(row["padding_efficiency"], 4),
               "pipeline_tokens_per_s": round(pipeline_tps, 1),
               "pipeline_over_training": round(row["pipeline_over_training"], 2),
               "examples_per_s": round(row["examples_per_s"], 1),
               "training_tokens_per_s": round(training_tps, 1),
               "distinct_batch_shapes": stats["shapes"],
               "synthetic": synthetic}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
