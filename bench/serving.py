"""Serving benchmark: the `small` preset behind the development server, and in-process.

    python bench/serving.py [--requests 40] [--preset small]

Measures, on whatever CPU/GPU this runs on:
  * latency p50/p99 of single-sentence REST requests (one at a time);
  * throughput (sentences/s) at concurrency 1, 8 and 32 (single-sentence REST requests; the
    server's batcher merges concurrent ones);
  * the SavedModel's own throughput in-process at batch 64, beam 4 and greedy.

Uses the trained `small` run (<run_dir>/final.weights.h5 and data/spm.model) when present;
otherwise random weights and a SentencePiece model trained on synthetic text (the report says
so: random weights rarely emit EOS, so every sentence decodes to the full input + max_extra_length
tokens, a pessimistic case). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WORDS = ("the light word god earth heaven day night water king son man woman house land "
         "people city river mountain bread peace love said came went saw made gave took").split()


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."
            for _ in range(n)]


def _tokenizer(cfg):
    from aiayn.models.tokenizer import SubwordTokenizer
    from aiayn.pipeline.data.vocab import vocab_path

    path = vocab_path(cfg)
    if Path(path).exists():
        return SubwordTokenizer.from_file(path), f"trained vocabulary {path}"
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(3000, seed=1)), model_writer=buf,
        vocab_size=min(cfg.data.vocab_size, 400), hard_vocab_limit=False, pad_id=0, unk_id=1,
        bos_id=2, eos_id=3, minloglevel=2)
    return SubwordTokenizer(buf.getvalue()), "synthetic SentencePiece vocabulary (no data/spm.model)"


def _percentile(values, q):
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q / 100 * (len(values) - 1)))))
    return values[k]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--requests", type=int, default=20, help="single-sentence latency runs")
    parser.add_argument("--max-extra-length", type=int, default=None,
                        help="override decode.max_extra_length (default: the preset's)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from aiayn.export import saved_model as sm
    from aiayn.export.client import RestClient
    from aiayn.export.server import DevServer
    from aiayn.pipeline.config import load_config
    from aiayn.pipeline.training.artifacts import RunFiles, build_model

    overrides = []
    if args.max_extra_length is not None:
        overrides.append(f"decode.max_extra_length={args.max_extra_length}")
    cfg = load_config([args.preset], overrides)
    tokenizer, vocab_note = _tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    weights = RunFiles.of(cfg).final
    if weights.exists() and "synthetic" not in vocab_note:
        model.load_weights(str(weights))
        weights_note = f"trained weights {weights}"
    else:
        weights_note = "RANDOM weights (no trained small run found)"
    print(f"# preset={args.preset}  {weights_note}; {vocab_note}")
    print(f"# model: {cfg.model.num_layers} layers, hidden {cfg.model.hidden_dim}; beam "
          f"{cfg.decode.beam_size}, max_extra_length {cfg.decode.max_extra_length}; "
          f"{os.cpu_count()} CPUs; GPUs: {len(tf.config.list_physical_devices('GPU'))}")

    results = {}
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-") as tmp:
        t0 = time.perf_counter()
        beam_opts = sm.ServingOptions.from_configs(cfg.decode, cfg.export)
        sm.export_saved_model(model, tokenizer, tmp, "translate", options=beam_opts,
                              sample_texts=["Hello."])
        greedy_opts = dataclasses.replace(beam_opts, beam_size=1, n_best=1)
        greedy_dir = sm.export_saved_model(model, tokenizer, tmp, "greedy",
                                           options=greedy_opts, sample_texts=["Hello."])
        print(f"# two exports written in {time.perf_counter() - t0:.1f}s")

        # In-process SavedModel throughput at batch 64.
        batch = _sentences(64, seed=2)
        for label, path in (("beam4", Path(tmp) / "translate" / "1"), ("greedy", greedy_dir)):
            fn = tf.saved_model.load(str(path)).signatures["serving_default"]
            fn(text=tf.constant(batch[:2]))  # warm
            runs, start = 0, time.perf_counter()
            while runs < 2 or (runs < 5 and time.perf_counter() - start < 20):
                fn(text=tf.constant(batch))
                runs += 1
            rate = 64 * runs / (time.perf_counter() - start)
            results[f"inprocess_{label}_sent_per_s"] = round(rate, 2)

        server = DevServer(tmp, model_names=["translate"], rest_port=0, grpc_port=None,
                           batch_timeout_ms=5, warmup=False).start()
        client = RestClient(f"http://127.0.0.1:{server.rest_port}")
        try:
            sentences = _sentences(max(args.requests, 64), seed=3)
            client.translate(sentences[:1])
            latencies = []
            for text in sentences[:args.requests]:
                start = time.perf_counter()
                client.translate([text])
                latencies.append((time.perf_counter() - start) * 1000)
            results["p50_ms"] = round(_percentile(latencies, 50), 1)
            results["p99_ms"] = round(_percentile(latencies, 99), 1)
            for conc in (1, 8, 32):
                n = max(16, 2 * conc)
                with concurrent.futures.ThreadPoolExecutor(conc) as pool:
                    start = time.perf_counter()
                    list(pool.map(lambda t: client.translate([t]), sentences[:n]))
                    elapsed = time.perf_counter() - start
                results[f"throughput_c{conc}"] = round(n / elapsed, 2)
            batcher = server.manager.get("translate").batchers["serving_default"]
            results["largest_server_batch"] = batcher.largest_batch
        finally:
            server.stop()

    print()
    print(f"{'measure':<38}{'value':>12}")
    print("-" * 50)
    rows = [("latency p50, 1 sentence (ms)", "p50_ms"), ("latency p99, 1 sentence (ms)", "p99_ms"),
            ("throughput, concurrency 1 (sent/s)", "throughput_c1"),
            ("throughput, concurrency 8 (sent/s)", "throughput_c8"),
            ("throughput, concurrency 32 (sent/s)", "throughput_c32"),
            ("in-process beam 4, batch 64 (sent/s)", "inprocess_beam4_sent_per_s"),
            ("in-process greedy, batch 64 (sent/s)", "inprocess_greedy_sent_per_s"),
            ("largest merged server batch", "largest_server_batch")]
    for label, key in rows:
        print(f"{label:<38}{results[key]:>12}")
    results.update(preset=args.preset, random_weights="RANDOM" in weights_note,
                   beam_size=cfg.decode.beam_size,
                   max_extra_length=cfg.decode.max_extra_length)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
