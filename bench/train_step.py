"""Training throughput and MFU: our Transformer against a tutorial-style Keras baseline.

The baseline is built the way the TensorFlow NMT tutorial builds it (keras.layers.
MultiHeadAttention, Add + LayerNormalization blocks, an untied output Dense, a masked
sparse cross-entropy), at the same sizes (key_dim = d_model / h, so both have the paper's
parameter count). Both train with Adam and the paper's schedule on the same random batch.
MFU = model training FLOPs/s (3 x forward matmul FLOPs, attention included) over the float32
matmul rate measured in the same run. Prints a table, then one JSON line.

    .venv/bin/python bench/train_step.py [--steps 4] [--base-steps 1] [--rounds 9]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# keras.layers.MultiHeadAttention warns on every call of the baseline that it drops Keras masks
# (the baseline passes explicit attention masks instead); it would bury the table.
warnings.filterwarnings("ignore", message=".*does not support masking.*")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402

from aiayn.models.losses import MaskedLabelSmoothedCrossEntropy  # noqa: E402
from aiayn.models.schedule import TransformerSchedule  # noqa: E402
from aiayn.models.transformer import Transformer  # noqa: E402
from aiayn.pipeline.config import load_config  # noqa: E402
from aiayn.pipeline.training.distribute import resolve_jit_compile, resolve_mixed_precision  # noqa: E402


# -- the tutorial-style baseline --------------------------------------------------------------
class TutorialPositionalEmbedding(keras.layers.Layer):
    def __init__(self, vocab, d_model, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.embedding = keras.layers.Embedding(vocab, d_model)
        depth = np.arange(d_model // 2)[None, :] / (d_model // 2)
        angles = np.arange(2048)[:, None] / 10000 ** depth
        self.pos = np.concatenate([np.sin(angles), np.cos(angles)], -1).astype("float32")

    def call(self, x):
        length = ops.shape(x)[1]
        x = self.embedding(x) * math.sqrt(self.d_model)
        return x + self.pos[None, :length]


class TutorialAttention(keras.layers.Layer):
    def __init__(self, d_model, num_heads, dropout, causal=False, **kwargs):
        super().__init__(**kwargs)
        self.causal = causal
        self.mha = keras.layers.MultiHeadAttention(num_heads, d_model // num_heads,
                                                   dropout=dropout)
        self.norm = keras.layers.LayerNormalization()
        self.add = keras.layers.Add()

    def call(self, x, context=None, mask=None, training=None):
        context = x if context is None else context
        y = self.mha(x, context, attention_mask=mask, use_causal_mask=self.causal,
                     training=training)
        return self.norm(self.add([x, y]))


class TutorialFeedForward(keras.layers.Layer):
    def __init__(self, d_model, dff, dropout, **kwargs):
        super().__init__(**kwargs)
        self.seq = keras.Sequential([keras.layers.Dense(dff, activation="relu"),
                                     keras.layers.Dense(d_model), keras.layers.Dropout(dropout)])
        self.norm = keras.layers.LayerNormalization()
        self.add = keras.layers.Add()

    def call(self, x, training=None):
        return self.norm(self.add([x, self.seq(x, training=training)]))


class TutorialTransformer(keras.Model):
    def __init__(self, vocab, num_layers, d_model, num_heads, dff, dropout, **kwargs):
        super().__init__(**kwargs)
        self.src_embed = TutorialPositionalEmbedding(vocab, d_model)
        self.tgt_embed = TutorialPositionalEmbedding(vocab, d_model)
        self.drop = keras.layers.Dropout(dropout)
        self.enc = [(TutorialAttention(d_model, num_heads, dropout),
                     TutorialFeedForward(d_model, dff, dropout)) for _ in range(num_layers)]
        self.dec = [(TutorialAttention(d_model, num_heads, dropout, causal=True),
                     TutorialAttention(d_model, num_heads, dropout),
                     TutorialFeedForward(d_model, dff, dropout)) for _ in range(num_layers)]
        self.final = keras.layers.Dense(vocab)

    def call(self, inputs, training=None):
        src_mask = inputs["encoder_padding_mask"]
        tgt_mask = inputs["decoder_padding_mask"]
        x = self.drop(self.src_embed(inputs["encoder_token_ids"]), training=training)
        enc_self = ops.logical_and(src_mask[:, None, :], src_mask[:, :, None])
        for attn, ffn in self.enc:
            x = ffn(attn(x, mask=enc_self, training=training), training=training)
        y = self.drop(self.tgt_embed(inputs["decoder_token_ids"]), training=training)
        cross = ops.logical_and(tgt_mask[:, :, None], src_mask[:, None, :])
        dec_self = ops.logical_and(tgt_mask[:, :, None], tgt_mask[:, None, :])
        for self_attn, cross_attn, ffn in self.dec:
            y = self_attn(y, mask=dec_self, training=training)
            y = cross_attn(y, x, mask=cross, training=training)
            y = ffn(y, training=training)
        return self.final(y)


def tutorial_masked_loss(labels, logits):
    per_token = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    mask = ops.cast(ops.not_equal(labels, 0), per_token.dtype)
    return ops.sum(per_token * mask) / ops.sum(mask)


# -- measurement ------------------------------------------------------------------------------
def matmul_flops_per_s(n=1024, repeats=20):
    a = tf.random.normal((n, n))

    @tf.function
    def chain(x):
        for _ in range(repeats):
            x = tf.matmul(x, a) * 1e-3
        return x

    chain(a).numpy()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        chain(a).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 * repeats / best


def train_flops(m, vocab, batch, src, tgt):
    d, f, n, n_dec = m.hidden_dim, m.intermediate_dim, m.num_layers, m.decoder_layers
    enc_dense = n * (4 * d * d + 2 * d * f)
    dec_dense = n_dec * (8 * d * d + 2 * d * f)
    forward = 2 * batch * (src * enc_dense + tgt * dec_dense + tgt * d * vocab)
    forward += 4 * batch * d * (n * src * src + n_dec * (tgt * tgt + tgt * src))  # QK^T, AV
    return 3 * forward


def features(vocab, batch, src, tgt):
    rng = np.random.default_rng(0)
    x = {"encoder_token_ids": rng.integers(4, vocab, (batch, src)).astype("int32"),
         "encoder_padding_mask": np.ones((batch, src), bool),
         "decoder_token_ids": rng.integers(4, vocab, (batch, tgt)).astype("int32"),
         "decoder_padding_mask": np.ones((batch, tgt), bool)}
    y = rng.integers(4, vocab, (batch, tgt)).astype("int32")
    return x, y


def compiled(model, loss, jit, hidden_dim):
    model.compile(optimizer=keras.optimizers.Adam(TransformerSchedule(hidden_dim, 4000),
                                                  beta_2=0.98, epsilon=1e-9),
                  loss=loss, jit_compile=jit)
    return model


def contest(models, x, y, steps, rounds):
    """Seconds per step for each model: median over ``rounds`` interleaved blocks.

    Every model is warmed up (trace / compile, then two more steps) before any timing; the
    timed blocks of ``steps`` steps then alternate between the models, so that a slow or noisy
    spell of the machine falls on all of them alike.
    """
    x = {key: tf.constant(value) for key, value in x.items()}
    y = tf.constant(y)
    for model in models.values():
        for _ in range(3):
            model.train_on_batch(x, y)
    blocks = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(steps):
                model.train_on_batch(x, y)
            blocks[name].append((time.perf_counter() - start) / steps)
    return {name: float(np.median(times)) for name, times in blocks.items()}


def build(name, m, vocab, jit, policy=None):
    keras.utils.set_random_seed(0)
    if name == "tutorial":
        model = TutorialTransformer(vocab, m.num_layers, m.hidden_dim, m.num_heads,
                                    m.intermediate_dim, m.dropout)
        return compiled(model, tutorial_masked_loss, jit, m.hidden_dim)
    kwargs = {} if policy is None else {"dtype": policy}
    model = Transformer(vocabulary_size=vocab, pad_id=0, **dataclasses.asdict(m), **kwargs)
    return compiled(model, MaskedLabelSmoothedCrossEntropy(0.1, pad_id=0), jit, m.hidden_dim)


# Batch, source and target length of the random batches, per preset.
SHAPES = {"small": (32, 32, 32), "base": (8, 32, 32)}


def _measure(args, peak: float, policy: str, default_jit: bool):
    """Both presets, without and with XLA: ours against the tutorial (and, for `small` at the
    default jit_compile, ours with the project's dtype policy). Returns (rows of the table,
    target tokens/s by (preset, model, jit))."""
    rows, rate = [], {}
    for preset, steps in (("small", args.steps), ("base", args.base_steps)):
        cfg = load_config([preset])
        m, vocab = cfg.model, cfg.data.vocab_size
        batch, src, tgt = SHAPES[preset]
        x, y = features(vocab, batch, src, tgt)
        flops = train_flops(m, vocab, batch, src, tgt)
        for jit in (False, True):
            models = {"ours": build("ours", m, vocab, jit),
                      "tutorial": build("tutorial", m, vocab, jit)}
            if preset == "small" and jit == default_jit:
                models["ours-defaults"] = build("ours", m, vocab, jit, policy)
            seconds = contest(models, x, y, steps, args.rounds)
            for name, sec in seconds.items():
                rate[(preset, name, jit)] = batch * tgt / sec
                label = f"ours ({policy})" if name == "ours-defaults" else name
                rows.append((preset, label, jit, sec, batch * tgt / sec, flops / sec / peak))
                print(f"  measured {preset} {label} jit={jit}: {sec:.3f} s/step", flush=True)
            del models
    return rows, rate


def _result(rows, rate, peak: float, policy: str, default_jit: bool) -> dict:
    mfu = {(r[0], r[1], r[2]): r[5] for r in rows}
    return {
        # Project defaults (resolved above); tutorial defaults: float32, no XLA on CPU.
        "speedup_defaults_small": round(rate[("small", "ours-defaults", default_jit)]
                                        / rate[("small", "tutorial", False)], 2),
        "defaults": f"{policy}, jit_compile={default_jit}",
        "speedup_equal_small": round(rate[("small", "ours", False)]
                                     / rate[("small", "tutorial", False)], 2),
        "speedup_equal_small_jit": round(rate[("small", "ours", True)]
                                         / rate[("small", "tutorial", True)], 2),
        "speedup_equal_base": round(rate[("base", "ours", False)]
                                    / rate[("base", "tutorial", False)], 2),
        "mfu_base_jit": round(mfu[("base", "ours", True)], 3),
        "mfu_base_tutorial_jit": round(mfu[("base", "tutorial", True)], 3),
        "mfu_small": round(mfu[("small", "ours", False)], 3),
        "matmul_gflops": round(peak / 1e9, 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per timed block, small")
    parser.add_argument("--base-steps", type=int, default=1, help="steps per block, base")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timed blocks")
    args = parser.parse_args()
    peak = matmul_flops_per_s()
    # The project's resolved defaults on this machine (train.mixed_precision=auto and
    # train.jit_compile=auto: mixed_bfloat16 without XLA on CPUs with bf16 units).
    policy, default_jit = resolve_mixed_precision("auto"), resolve_jit_compile("auto")
    rows, rate = _measure(args, peak, policy, default_jit)
    print(f"\nfloat32 matmul rate in this run: {peak / 1e9:.1f} GFLOP/s; {os.cpu_count()} CPU "
          f"cores; median of {args.rounds} interleaved blocks (small {args.steps} steps, base "
          f"{args.base_steps}); batch x source x target: {SHAPES}")
    print(f"{'preset':<6} {'model':<22} {'jit':<5} {'s/step':>7} {'tgt tok/s':>10} {'MFU':>6}")
    for preset, name, jit, seconds, tps, mfu in rows:
        print(f"{preset:<6} {name:<22} {str(jit):<5} {seconds:7.3f} {tps:10.1f} {mfu:6.1%}")
    print(f"(MFU of the {policy} row is still counted against the float32 matmul rate.)")
    print(json.dumps(_result(rows, rate, peak, policy, default_jit)))


if __name__ == "__main__":
    main()
