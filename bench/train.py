"""Training throughput: the project's defaults vs. the TensorFlow tutorial's Transformer.

Measures real (non-padding) target tokens per second of ``model.fit`` on the same corpus, the
same model size and the same machine, in one run:

* project: ``aiayn.models.transformer.Transformer`` from the preset, the project's tf.data
  pipeline (2-D length buckets padded to the bucket boundary, token budget per batch), the
  resolved defaults for this hardware (dtype policy, jit_compile), the paper's optimizer.
* baseline: the Transformer of the TensorFlow tutorial "Neural machine translation with a
  Transformer and Keras" (``keras.layers.MultiHeadAttention`` blocks, ``mask_zero`` embeddings),
  its input pipeline (shuffled random batches of 64 sentences, padded per batch), float32, no
  jit_compile. Same layers, width, heads and vocabulary as the project's model (the tutorial's
  ``key_dim=d_model`` would make its attention ``num_heads`` times larger; the per-head size
  ``d_model / num_heads`` is used so both models have the same parameters).

Corpus: ``<data_dir>/train.tsv`` with ``<data_dir>/spm.model`` when ``make data vocab`` has run;
otherwise a synthetic corpus (said so in the output) with a SentencePiece model trained on it.

The two are interleaved: ``--rounds`` rounds (3) of ``--seconds / --rounds`` timed seconds
each, after ``--warmup-steps`` untimed steps, the order reversed every other round; the rates
are over all timed seconds.

    python bench/train.py [--preset small] [--seconds 60] [--rounds 3] [--warmup-steps 5]

Prints a table; the LAST line is one JSON object with ``speedup``, ``steps_per_min_defaults``
(optimizer steps per minute of the project's defaults for the preset: what a time budget turns
into steps on this machine) and the raw figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import warnings  # noqa: E402

# The tutorial's layers do not propagate Keras masks (as in the tutorial); not our concern here.
warnings.filterwarnings("ignore", message=".*does not support masking.*")
warnings.filterwarnings("ignore", message=".*`shuffle=True` was passed.*")

from aiayn.pipeline.tf_runtime import onednn_setting, prepare_tensorflow  # noqa: E402

prepare_tensorflow()  # the project's defaults (oneDNN on where the user has not chosen)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.release.model_card import cpu_description  # noqa: E402
from aiayn.pipeline.training import callbacks as cb  # noqa: E402
from aiayn.pipeline.training import distribute  # noqa: E402

# ------------------------------------------------------------------------------------------
# The tutorial's model (tensorflow.org/text/tutorials/transformer), written for Keras 3.


def positional_encoding(length, depth):
    depth = depth / 2
    positions = np.arange(length)[:, np.newaxis]
    depths = np.arange(depth)[np.newaxis, :] / depth
    angle_rads = positions / (10000 ** depths)
    return np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1).astype("float32")


class PositionalEmbedding(keras.layers.Layer):
    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.embedding = keras.layers.Embedding(vocab_size, d_model, mask_zero=True)
        self.pos_encoding = keras.ops.convert_to_tensor(positional_encoding(2048, d_model))

    def compute_mask(self, *args, **kwargs):
        return self.embedding.compute_mask(*args, **kwargs)

    def call(self, x):
        length = keras.ops.shape(x)[1]
        x = self.embedding(x) * keras.ops.sqrt(keras.ops.cast(self.d_model, "float32"))
        return x + keras.ops.slice(self.pos_encoding, (0, 0), (length, self.d_model))[None]


class BaseAttention(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__()
        self.mha = keras.layers.MultiHeadAttention(**kwargs)
        self.layernorm = keras.layers.LayerNormalization()
        self.add = keras.layers.Add()


class CrossAttention(BaseAttention):
    def call(self, x, context):
        out = self.mha(query=x, key=context, value=context)
        return self.layernorm(self.add([x, out]))


class GlobalSelfAttention(BaseAttention):
    def call(self, x):
        return self.layernorm(self.add([x, self.mha(query=x, value=x, key=x)]))


class CausalSelfAttention(BaseAttention):
    def call(self, x):
        out = self.mha(query=x, value=x, key=x, use_causal_mask=True)
        return self.layernorm(self.add([x, out]))


class FeedForward(keras.layers.Layer):
    def __init__(self, d_model, dff, dropout_rate=0.1):
        super().__init__()
        self.seq = keras.Sequential([keras.layers.Dense(dff, activation="relu"),
                                     keras.layers.Dense(d_model),
                                     keras.layers.Dropout(dropout_rate)])
        self.add = keras.layers.Add()
        self.layer_norm = keras.layers.LayerNormalization()

    def call(self, x):
        return self.layer_norm(self.add([x, self.seq(x)]))


class EncoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1):
        super().__init__()
        self.self_attention = GlobalSelfAttention(num_heads=num_heads,
                                                  key_dim=d_model // num_heads,
                                                  dropout=dropout_rate)
        self.ffn = FeedForward(d_model, dff)

    def call(self, x):
        return self.ffn(self.self_attention(x))


class Encoder(keras.layers.Layer):
    def __init__(self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1):
        super().__init__()
        self.pos_embedding = PositionalEmbedding(vocab_size, d_model)
        self.enc_layers = [EncoderLayer(d_model=d_model, num_heads=num_heads, dff=dff,
                                        dropout_rate=dropout_rate) for _ in range(num_layers)]
        self.dropout = keras.layers.Dropout(dropout_rate)

    def call(self, x):
        x = self.dropout(self.pos_embedding(x))
        for layer in self.enc_layers:
            x = layer(x)
        return x


class DecoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1):
        super().__init__()
        self.causal_self_attention = CausalSelfAttention(
            num_heads=num_heads, key_dim=d_model // num_heads, dropout=dropout_rate)
        self.cross_attention = CrossAttention(num_heads=num_heads, key_dim=d_model // num_heads,
                                              dropout=dropout_rate)
        self.ffn = FeedForward(d_model, dff)

    def call(self, x, context):
        return self.ffn(self.cross_attention(self.causal_self_attention(x), context))


class Decoder(keras.layers.Layer):
    def __init__(self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1):
        super().__init__()
        self.pos_embedding = PositionalEmbedding(vocab_size, d_model)
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.dec_layers = [DecoderLayer(d_model=d_model, num_heads=num_heads, dff=dff,
                                        dropout_rate=dropout_rate) for _ in range(num_layers)]

    def call(self, x, context):
        x = self.dropout(self.pos_embedding(x))
        for layer in self.dec_layers:
            x = layer(x, context)
        return x


class TutorialTransformer(keras.Model):
    def __init__(self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1):
        super().__init__()
        self.encoder = Encoder(num_layers=num_layers, d_model=d_model, num_heads=num_heads,
                               dff=dff, vocab_size=vocab_size, dropout_rate=dropout_rate)
        self.decoder = Decoder(num_layers=num_layers, d_model=d_model, num_heads=num_heads,
                               dff=dff, vocab_size=vocab_size, dropout_rate=dropout_rate)
        self.final_layer = keras.layers.Dense(vocab_size)

    def call(self, inputs):
        context, x = inputs
        context = self.encoder(context)
        return self.final_layer(self.decoder(x, context))


def masked_loss(label, pred):
    mask = label != 0
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
        label, pred)
    mask = keras.ops.cast(mask, loss.dtype)
    return keras.ops.sum(loss * mask) / keras.ops.sum(mask)


def tutorial_dataset(pairs, tokenizer, max_tokens, batch_size=64, buffer_size=20000, seed=0):
    """The tutorial's pipeline: shuffle sentences, batch 64, tokenise, pad per batch."""
    src = tf.constant([s for s, _ in pairs])
    tgt = tf.constant([t for _, t in pairs])
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def prepare_batch(en, es):
        en = tokenizer.tokenize(en)[:, :max_tokens].to_tensor()
        es = tokenizer.tokenize(es)[:, :max_tokens - 1]
        n = es.nrows()
        es_in = tf.concat([tf.fill([n, 1], bos), es], axis=1).to_tensor()
        es_out = tf.concat([es, tf.fill([n, 1], eos)], axis=1).to_tensor()
        return (en, es_in), es_out

    return (tf.data.Dataset.from_tensor_slices((src, tgt)).shuffle(buffer_size, seed=seed)
            .repeat().batch(batch_size).map(prepare_batch, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


# ------------------------------------------------------------------------------------------
# Measurement


class Throughput(keras.callbacks.Callback):
    """Real target tokens/s between the end of step `warmup` and the time budget."""

    def __init__(self, warmup_steps, seconds):
        super().__init__()
        self.warmup_steps, self.seconds = warmup_steps, seconds
        self.steps, self.start, self.tokens0, self.tokens = 0, None, 0.0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        tokens = float(logs["target_tokens"])
        if self.steps == self.warmup_steps:
            self.start, self.tokens0 = time.monotonic(), tokens
        elif self.start is not None:
            self.tokens = tokens - self.tokens0
            self.elapsed = time.monotonic() - self.start
            if self.elapsed >= self.seconds:
                self.model.stop_training = True

    def result(self):
        steps = self.steps - self.warmup_steps
        return {"tokens_per_s": self.tokens / self.elapsed, "steps": steps,
                "steps_per_s": steps / self.elapsed, "seconds": self.elapsed,
                "tokens": self.tokens}


def _fit(model, dataset, warmup_steps, seconds):
    meter = Throughput(warmup_steps, seconds)
    model.fit(dataset, epochs=1, steps_per_epoch=100000, callbacks=[meter], verbose=0,
              shuffle=False)
    return meter.result()


def interleaved(candidates: dict, rounds: int, warmup_steps: int, seconds: float) -> dict:
    """Each candidate `(model, dataset)` trained for `seconds / rounds` (after `warmup_steps`
    untimed steps) once per round, the order reversed every other round, so that a host that
    slows down or speeds up during the run weighs on every candidate alike. Returns, per
    candidate, the rates over all its timed seconds."""
    totals = {name: {"tokens": 0.0, "steps": 0, "seconds": 0.0} for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            model, dataset = candidates[name]
            one = _fit(model, dataset, warmup_steps, seconds / rounds)
            for key in totals[name]:
                totals[name][key] += one[key]
        print(f"# round {r + 1}/{rounds} done", flush=True)
    return {name: {"tokens_per_s": t["tokens"] / t["seconds"], "steps": t["steps"],
                   "steps_per_s": t["steps"] / t["seconds"], "seconds": t["seconds"]}
            for name, t in totals.items()}


def prepared_or_synthetic_corpus(cfg, work: Path):
    """(cfg pointing at the data, description); synthetic when no prepared corpus exists."""
    data_dir = Path(cfg.data.data_dir)
    if (data_dir / "train.tsv").exists() and (data_dir / "spm.model").exists():
        return cfg, f"{data_dir / 'train.tsv'} (the default corpus)"
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnoprstuvy") for _ in range(rng.randint(2, 9)))
             for _ in range(4000)]
    with open(work / "train.tsv", "w", encoding="utf-8") as f:
        for _ in range(20000):
            n = max(3, min(120, int(rng.lognormvariate(3.2, 0.5))))  # verse-like lengths
            src = " ".join(rng.choice(words) for _ in range(n))
            tgt = " ".join(rng.choice(words) for _ in range(int(n * 1.1)))
            f.write(f"{src}\t{tgt}\n")
    cfg = cfg.replace(data=dataclasses.replace(cfg.data, data_dir=str(work)))
    from aiayn.pipeline.data.vocab import train_vocab

    train_vocab(cfg)
    return cfg, "SYNTHETIC (no prepared corpus: run `make data vocab` for the real one)"


def _project(cfg, tokenizer, train_path: Path):
    """The project's model and tf.data pipeline with the defaults for this hardware:
    (model, dataset, dtype policy, jit_compile)."""
    from aiayn.pipeline.data.dataset import make_train_dataset
    from aiayn.pipeline.training.artifacts import build_model
    from aiayn.pipeline.training.recipe import compile_model

    policy = distribute.resolve_mixed_precision(cfg.train.mixed_precision)
    jit = distribute.resolve_jit_compile(cfg.train.jit_compile)
    keras.mixed_precision.set_global_policy(policy)
    model = build_model(cfg, tokenizer)
    compile_model(model, cfg, tokenizer.pad_id, jit, policy)
    keras.mixed_precision.set_global_policy("float32")
    return model, make_train_dataset(train_path, tokenizer, cfg.data, cfg.data.seed), policy, jit


def _tutorial(cfg, tokenizer, train_path: Path):
    """The tutorial's model and pipeline at the preset's size: float32, no XLA, batches of 64
    sentences padded per batch: (model, dataset)."""
    from aiayn.pipeline.data.corpus import read_tsv_pairs

    m = cfg.model
    model = TutorialTransformer(num_layers=m.num_layers, d_model=m.hidden_dim,
                                num_heads=m.num_heads, dff=m.intermediate_dim,
                                vocab_size=tokenizer.vocabulary_size, dropout_rate=m.dropout)
    model.compile(optimizer=keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                  loss=masked_loss, metrics=[cb.TargetTokens(pad_id=0)], jit_compile=False)
    return model, tutorial_dataset(read_tsv_pairs(train_path), tokenizer, cfg.data.max_length)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measured seconds per configuration (after warm-up), all rounds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds the measured seconds are split into")
    parser.add_argument("--warmup-steps", type=int, default=5,
                        help="untimed steps at the start of each round")
    args = parser.parse_args(argv)

    from aiayn.models.tokenizer import SubwordTokenizer

    work = Path(tempfile.mkdtemp(prefix="bench_train_"))
    cfg, corpus = prepared_or_synthetic_corpus(load_config([args.preset]), work)
    keras.utils.set_random_seed(0)  # before the tokenizer: seeding destroys its TF resource
    tokenizer = SubwordTokenizer.from_file(Path(cfg.data.data_dir) / "spm.model")
    train_path = Path(cfg.data.data_dir) / "train.tsv"
    model, dataset, policy, jit = _project(cfg, tokenizer, train_path)
    rates = interleaved({"project": (model, dataset),
                         "baseline": _tutorial(cfg, tokenizer, train_path)},
                        args.rounds, args.warmup_steps, args.seconds)
    project, baseline = rates["project"], rates["baseline"]

    speedup = project["tokens_per_s"] / baseline["tokens_per_s"]
    m = cfg.model
    print(f"corpus: {corpus}")
    print(f"model: {m.num_layers} layers, d_model {m.hidden_dim}, d_ff {m.intermediate_dim}, "
          f"{m.num_heads} heads, vocabulary {tokenizer.vocabulary_size}; {os.cpu_count()} CPUs "
          f"{cpu_description()}; oneDNN {onednn_setting()} (both configurations); "
          f"{args.rounds} interleaved rounds")
    print(f"{'configuration':<58} {'target tok/s':>12} {'steps/s':>8} {'steps':>6}")
    rows = [(f"project ({policy}, jit_compile={jit}, token budget {cfg.data.token_budget}, "
             "2-D buckets)", project),
            ("TF tutorial (float32, no jit, 64 sentences padded per batch)", baseline)]
    for name, r in rows:
        print(f"{name:<58} {r['tokens_per_s']:>12,.0f} {r['steps_per_s']:>8.2f} "
              f"{r['steps']:>6}")
    print(f"speedup: {speedup:.2f}x; project defaults: {project['steps_per_s'] * 60:.1f} "
          "steps/min")
    print(json.dumps({"speedup": round(speedup, 3),
                      "steps_per_min_defaults": round(project["steps_per_s"] * 60, 2),
                      "project_tokens_per_s": round(project["tokens_per_s"], 1),
                      "baseline_tokens_per_s": round(baseline["tokens_per_s"], 1),
                      "project_steps_per_s": round(project["steps_per_s"], 3),
                      "baseline_steps_per_s": round(baseline["steps_per_s"], 3),
                      "project_policy": policy, "project_jit_compile": jit,
                      "onednn": onednn_setting(),
                      "synthetic_corpus": corpus.startswith("SYNTHETIC"),
                      "preset": args.preset, "seconds": args.seconds, "rounds": args.rounds,
                      "cpu": cpu_description()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
