"""Decoding speed: cached greedy / beam-4 against an uncached decoder (the tutorial's method).

A random-weight `small` Transformer translates a batch of 64 random source sentences. The
uncached decoder is the TensorFlow tutorial's Translator: at every step it re-runs the whole
model (encoder and decoder) over the prefix and keeps the last position's logits. Both are
forced to emit exactly the same number of
tokens (an EOS id that never matches). Prints a table, then one JSON line.

    .venv/bin/python bench/decode.py [--tokens 50] [--batch 64] [--source-length 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402

from aiayn.models import decoding  # noqa: E402
from aiayn.models.transformer import Transformer  # noqa: E402
from aiayn.pipeline.config import load_config  # noqa: E402

BOS, NEVER = 2, -1


def build(args):
    cfg = load_config(["small"])
    keras.utils.set_random_seed(0)
    model = Transformer(vocabulary_size=cfg.data.vocab_size, pad_id=0,
                        **dataclasses.asdict(cfg.model))
    model.build()
    rng = np.random.default_rng(0)
    ids = rng.integers(4, cfg.data.vocab_size, (args.batch, args.source_length)).astype("int32")
    return model, tf.constant(ids), tf.ones_like(ids, dtype=tf.bool)


def make_decoders(model, beam_size, jit):
    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool),
            tf.TensorSpec([], tf.int32)]

    def run(ids, mask, max_length, cached):
        batch = tf.shape(ids)[0]
        if cached:  # encode once; the beams of a sentence share its encoder memory
            memory = model.encoder_memory(model.encode(ids, mask), mask)
            cache = model.init_cache(batch, max_length, beam_size)

            def step_fn(seq, cache, index):
                return model.decode_step(ops.take(seq, index, axis=1), cache, index, memory,
                                         beam_size)
        else:
            source_ids, source_mask = ids, mask
            if beam_size > 1:
                source_ids = decoding.expand_to_beams(ids, beam_size)
                source_mask = decoding.expand_to_beams(mask, beam_size)
            cache = ()

            def step_fn(seq, cache, index):
                # The tutorial's Translator: the whole model (encoder included) over the prefix
                # at every step, logits for every position, keep the last.
                prefix = seq[:, :index + 1]  # (N, index + 1)
                logits = model({"encoder_token_ids": source_ids,
                                "encoder_padding_mask": source_mask,
                                "decoder_token_ids": prefix,
                                "decoder_padding_mask": ops.ones_like(prefix, dtype="bool")},
                               training=False)  # (N, index + 1, V)
                return logits[:, -1], cache
        if beam_size == 1:
            return decoding.greedy_search(step_fn, cache, batch, BOS, NEVER, 0, max_length)
        return decoding.beam_search(step_fn, cache, batch, BOS, NEVER, 0, beam_size,
                                    max_length, 0.6,
                                    reorder_fn=model.reorder_cache if cached else
                                    decoding.gather_rows)

    cached = tf.function(lambda a, b, n: run(a, b, n, True), input_signature=spec,
                         jit_compile=jit)
    uncached = tf.function(lambda a, b, n: run(a, b, n, False), input_signature=spec)
    return cached, uncached


def timed(fn, ids, mask, tokens, repeats=1):
    fn(ids, mask, tf.constant(2))  # trace (and compile) once on a short run
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(ids, mask, tf.constant(tokens))
        np.asarray(out["token_ids"])
        best = min(best, time.perf_counter() - start)
    lengths = np.asarray(out["lengths"])
    assert np.all(lengths == tokens), lengths  # forced length
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--source-length", type=int, default=20)
    args = parser.parse_args()
    model, ids, mask = build(args)
    rows, result = [], {}
    for name, beam in (("greedy", 1), ("beam4", 4)):
        cached_graph, uncached = make_decoders(model, beam, jit=False)
        cached_xla, _ = make_decoders(model, beam, jit=True)
        t_graph = timed(cached_graph, ids, mask, args.tokens, repeats=2)
        t_xla = timed(cached_xla, ids, mask, args.tokens, repeats=2)
        t_uncached = timed(uncached, ids, mask, args.tokens)
        t_best = min(t_graph, t_xla)
        for label, seconds in (("uncached (tutorial)", t_uncached), ("cached", t_graph),
                               ("cached + XLA", t_xla)):
            rows.append((name, label, seconds, args.batch / seconds,
                         args.batch * args.tokens / seconds))
        result[f"cached_over_uncached_{name}"] = round(t_uncached / t_best, 2)
        result[f"{name}_sent_per_s"] = round(args.batch / t_best, 2)
        result[f"{name}_cached_no_xla_over_uncached"] = round(t_uncached / t_graph, 2)
    print(f"small model, random weights, batch {args.batch}, source length "
          f"{args.source_length}, {args.tokens} output tokens forced; "
          f"{os.cpu_count()} CPU cores; best of 2 timed runs (uncached: 1)")
    print(f"{'search':<8} {'decoder':<20} {'seconds':>8} {'sent/s':>9} {'tokens/s':>10}")
    for name, label, seconds, sps, tps in rows:
        print(f"{name:<8} {label:<20} {seconds:8.2f} {sps:9.2f} {tps:10.1f}")
    result.update(batch=args.batch, tokens=args.tokens, cpu_count=os.cpu_count())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
