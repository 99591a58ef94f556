"""Inference speed: the SavedModel as TF Serving runs it against CTranslate2 float32 and int8.

Same weights, same sentences, beam 4 (the preset's decode settings), batches of 32 in file order
and sorted by length, 2 threads per engine, tokenisation and detokenisation included. Each
engine runs in its own fresh process, started once and kept warm:

* SavedModel: a process that imports only TensorFlow and tensorflow-text (what the stock
  ``tensorflow_model_server`` links), loads the exported version and calls
  ``serving_default`` (2 intra-op and 2 inter-op threads);
* CTranslate2: a process that imports ``aiayn.export.ctranslate2`` (numpy, SentencePiece,
  CTranslate2; no TensorFlow), ``intra_threads=2``; float32 and int8 exports of the weights.

Timed passes are interleaved (every round runs each engine once per order, the engine order
rotating), after one untimed warm-up pass each; a rate is sentences / the median pass time.
``savedmodel_over_ct2`` is the SavedModel's rate over CTranslate2 float32's in the same run
(below 1: CTranslate2 is faster). BLEU is sacreBLEU on each engine's output of the file-order
pass against the references.

Weights and sentences: the trained run of ``--preset`` (``<train.run_dir>/final.weights.h5``)
and the first ``--sentences`` of its test split (the test books), when they exist. Otherwise
a QUICK model, clearly labelled in the table: the preset's architecture trained for
``--quick-minutes`` on the prepared training split (or, with no prepared data, on a synthetic
word-for-word corpus), its sentences from the test split (or held-out synthetic ones).

    .venv/bin/python bench/inference.py [--preset small] [--sentences 200] [--rounds 3]
        [--set decode.stop_rule=bound] [--set train.run_dir=runs/other]

Prints a table, then (last line) one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from serving import WORDS, _sentences  # noqa: E402  (bench/serving.py: synthetic sentences)

THREADS = 2
# Between passes: thread pools (TensorFlow's, OpenMP's) spin a while after their work ends; on a
# machine with few cores that would slow whichever engine runs next.
PAUSE_S = 1.0

# The SavedModel engine: TensorFlow + tensorflow-text only, as TF Serving runs the export.
SAVEDMODEL_WORKER = textwrap.dedent("""
    import json, sys, time
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops, as TF Serving does)
    threads = int(sys.argv[2])
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    assert not any(name.startswith("aiayn") for name in sys.modules), "aiayn was imported"
    sentences = json.loads(sys.stdin.readline())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        batches = json.loads(line)
        out = [""] * len(sentences)
        start = time.perf_counter()
        for idx in batches:
            result = fn(text=tf.constant([sentences[i] for i in idx]))["translation"].numpy()
            for i, text in zip(idx, result):
                out[i] = text.decode("utf-8")
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "translations": out}), flush=True)
""")

# The CTranslate2 engine: SentencePiece + CTranslate2 through aiayn.export.ctranslate2.
CT2_WORKER = textwrap.dedent("""
    import json, sys, time
    from aiayn.export.ctranslate2 import CTranslate2Translator
    translator = CTranslate2Translator(sys.argv[1], intra_threads=int(sys.argv[2]),
                                       inter_threads=1)
    assert "tensorflow" not in sys.modules, "TensorFlow was imported"
    sentences = json.loads(sys.stdin.readline())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        batches = json.loads(line)
        out = [""] * len(sentences)
        start = time.perf_counter()
        for idx in batches:
            for i, result in zip(idx, translator.translate([sentences[i] for i in idx])):
                out[i] = result.text
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "translations": out}), flush=True)
""")


class Worker:
    """One engine in its own process; ``run(batches)`` -> (seconds, translations)."""

    def __init__(self, name: str, code: str, path: Path, sentences: list[str],
                 isolate: bool, log: Path):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        if isolate:  # nothing of the repository on the path (test_parity's fresh process)
            env["PYTHONPATH"] = ""
        self.name = name
        self.log = log
        with open(log, "w", encoding="utf-8") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(path), str(THREADS)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                cwd="/" if isolate else None)
        self._send(sentences)
        self._read()

    def _send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.proc.stdin.flush()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=60)
            raise RuntimeError(f"the {self.name} worker died: "
                               f"{self.log.read_text(encoding='utf-8')[-3000:]}")
        return json.loads(line)

    def run(self, batches: list[list[int]]) -> tuple[float, list[str]]:
        self._send(batches)
        reply = self._read()
        return reply["seconds"], reply["translations"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- weights and sentences ------------------------------------------------------------------
SYNTHETIC_CORPUS = "a SYNTHETIC word-for-word corpus (no prepared data)"


def _synthetic_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Word-for-word "translations" through a fixed permutation of the bench's word list."""
    rng = random.Random(1234)
    mapping = dict(zip(WORDS, rng.sample(WORDS, len(WORDS))))
    pairs = []
    for source in _sentences(n, seed=seed):
        words = source.rstrip(".").lower().split()
        pairs.append((source, " ".join(mapping[w] for w in words).capitalize() + "."))
    return pairs


def _quick_data(cfg, workdir: Path):
    """The QUICK model's data: (training TSV, tokenizer, test pairs, a description): the
    prepared splits when there are any, else a synthetic word-for-word corpus."""
    import sentencepiece as spm

    from aiayn.models.tokenizer import SubwordTokenizer
    from aiayn.pipeline.data.corpus import split_path
    from aiayn.pipeline.data.vocab import vocab_path
    from aiayn.pipeline.training.artifacts import read_split

    train_path, vocab = Path(split_path(cfg, "train")), Path(vocab_path(cfg))
    if train_path.exists() and vocab.exists() and Path(split_path(cfg, "test")).exists():
        return (train_path, SubwordTokenizer.from_file(vocab), read_split(cfg, "test"),
                f"the prepared training split {train_path}")
    pairs = _synthetic_pairs(20000, seed=5)
    train_path = workdir / "synthetic.tsv"
    train_path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    model_file = workdir / "synthetic.model"
    spm.SentencePieceTrainer.train(
        input=str(train_path), model_prefix=str(model_file.with_suffix("")),
        vocab_size=400, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        minloglevel=2)
    return (train_path, SubwordTokenizer.from_file(model_file), _synthetic_pairs(400, seed=6),
            SYNTHETIC_CORPUS)


def quick_model(cfg, minutes: float, workdir: Path):
    """The preset's architecture trained for ``minutes`` (see the module docstring)."""
    import keras

    from aiayn.pipeline.data.dataset import make_train_dataset
    from aiayn.pipeline.training.artifacts import build_model
    from aiayn.pipeline.training.recipe import compile_model

    train_path, tokenizer, test, corpus = _quick_data(cfg, workdir)
    keras.utils.set_random_seed(0)
    # Small batches and a warm-up sized to the few hundred steps there is time for. A synthetic
    # corpus has no output vocabulary file (`aiayn vocab` writes it): its decoder produces all
    # of its pieces.
    output_vocabulary = "joint" if corpus == SYNTHETIC_CORPUS else cfg.data.output_vocabulary
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=100),
                              data=dataclasses.replace(cfg.data, token_budget=1024,
                                                       output_vocabulary=output_vocabulary))
    model = build_model(cfg, tokenizer, dtype="float32")
    compile_model(model, cfg, tokenizer.pad_id, jit_compile=False, policy="float32")
    data = make_train_dataset(train_path, tokenizer, cfg.data)

    class TimeLimit(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if time.perf_counter() - self.start > minutes * 60:
                self.model.stop_training = True

    history = model.fit(data, steps_per_epoch=25, epochs=100000, verbose=0,
                        callbacks=[TimeLimit()])
    steps = 25 * len(history.history["loss"])
    label = (f"QUICK model (no trained run found): {cfg.preset} architecture trained "
             f"{minutes:g} min (about {steps} steps) on {corpus}")
    return model, tokenizer, test, label


def load_weights_and_sentences(cfg, minutes: float, workdir: Path):
    from aiayn.pipeline.data.corpus import split_path
    from aiayn.pipeline.training.artifacts import RunFiles, load_trained_model, read_split

    final = RunFiles.of(cfg).final
    if final.exists() and Path(split_path(cfg, "test")).exists():
        model, tokenizer, path = load_trained_model(cfg, dtype="float32")
        return model, tokenizer, read_split(cfg, "test"), f"trained run {path}, test books"
    return quick_model(cfg, minutes, workdir)


# -- the benchmark --------------------------------------------------------------------------
def batches_of(order: list[int], size: int) -> list[list[int]]:
    return [order[i:i + size] for i in range(0, len(order), size)]


def _parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds")
    parser.add_argument("--quick-minutes", type=float, default=4.0,
                        help="training time of the QUICK model when no trained run exists")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, as `aiayn --set` (e.g. decode.stop_rule=bound, "
                             "train.run_dir=runs/other)")
    return parser.parse_args(argv)


def _start_workers(model, tokenizer, options, sources: list[str], tmp: Path) -> dict:
    """The SavedModel and CTranslate2 float32 / int8 exports of `model`, each engine in its
    own warm process."""
    from aiayn.export import ctranslate2 as ct2
    from aiayn.export import saved_model as sm

    t0 = time.perf_counter()
    saved = sm.export_saved_model(model, tokenizer, tmp / "exports", "translate",
                                  options=options, sample_texts=sources[:2])
    ct2_dirs = {q: ct2.convert(model, tokenizer, options, tmp / f"ct2-{q}", q)
                for q in ("none", "int8")}
    print(f"# SavedModel and CTranslate2 exports written ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    return {
        "savedmodel": Worker("SavedModel", SAVEDMODEL_WORKER, saved, sources, True,
                             tmp / "savedmodel.log"),
        "ct2": Worker("CTranslate2", CT2_WORKER, ct2_dirs["none"], sources, False,
                      tmp / "ct2.log"),
        "ct2_int8": Worker("CTranslate2 int8", CT2_WORKER, ct2_dirs["int8"], sources, False,
                           tmp / "ct2_int8.log")}


def _orders(tokenizer, sources: list[str]) -> dict[str, list[int]]:
    """The sentences in file order and sorted by their length in pieces."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(bytes(tokenizer.model_proto))
    lengths = [len(ids) for ids in processor.encode(sources)]
    return {"file": list(range(len(sources))),
            "sorted": sorted(range(len(sources)), key=lambda i: lengths[i])}


def _interleaved_rounds(workers: dict, orders: dict, batch: int, rounds: int):
    """One untimed pass per engine, then `rounds` rounds of every (engine, order), the engine
    order rotating: ({(engine, order): [seconds]}, {(engine, order): first translations})."""
    times = {(e, o): [] for e in workers for o in orders}
    outputs = {}
    warm = batches_of(orders["file"], batch)
    for worker in workers.values():  # untimed: graph optimisation, caches, allocators
        worker.run(warm[:2])
    names = list(workers)
    for r in range(rounds):
        for order, idx in orders.items():
            for name in names[r % len(names):] + names[:r % len(names)]:
                time.sleep(PAUSE_S)  # the previous engine's threads stop spinning
                seconds, out = workers[name].run(batches_of(idx, batch))
                times[(name, order)].append(seconds)
                outputs.setdefault((name, order), out)
        print(f"# round {r + 1}/{rounds}: " + ", ".join(
            f"{n} {o} {times[(n, o)][-1]:.1f}s" for n in names for o in orders), flush=True)
    return times, outputs


def _result(rate: dict, bleu: dict, outputs: dict, args, options, label: str,
            sentences: int) -> dict:
    from aiayn.export import ctranslate2 as ct2

    same = sum(a == b for a, b in zip(outputs[("ct2", "file")], outputs[("savedmodel", "file")]))
    return {
        "savedmodel_sent_per_s": round(rate[("savedmodel", "file")], 2),
        "ct2_sent_per_s": round(rate[("ct2", "file")], 2),
        "ct2_int8_sent_per_s": round(rate[("ct2_int8", "file")], 2),
        "savedmodel_over_ct2": round(rate[("savedmodel", "file")] / rate[("ct2", "file")], 3),
        "bleu_savedmodel": bleu["savedmodel"], "bleu_ct2": bleu["ct2"],
        "bleu_ct2_int8": bleu["ct2_int8"],
        "savedmodel_sorted_sent_per_s": round(rate[("savedmodel", "sorted")], 2),
        "ct2_sorted_sent_per_s": round(rate[("ct2", "sorted")], 2),
        "ct2_int8_sorted_sent_per_s": round(rate[("ct2_int8", "sorted")], 2),
        "savedmodel_over_ct2_sorted": round(rate[("savedmodel", "sorted")]
                                            / rate[("ct2", "sorted")], 3),
        "ct2_same_output_as_savedmodel": round(same / sentences, 3),
        "weights": label, "quick_model": label.startswith("QUICK"),
        "sentences": sentences, "batch": args.batch, "rounds": args.rounds,
        "threads": THREADS, "beam_size": options.beam_size,
        "length_penalty": options.length_penalty, "max_extra_length": options.max_extra_length,
        "cpu_count": os.cpu_count(), "ctranslate2_version": ct2.import_ctranslate2().__version__,
        "ct2_use_mkl": os.environ.get("CT2_USE_MKL", ""),  # "": CTranslate2's own choice
    }


def _print_table(result: dict, rate: dict, bleu: dict) -> None:
    print()
    print(f"{result['weights']}")
    print(f"{result['sentences']} sentences, beam {result['beam_size']}, batches of "
          f"{result['batch']}, {THREADS} threads per engine, tokenisation included; median of "
          f"{result['rounds']} interleaved rounds; {os.cpu_count()} CPU cores")
    print(f"{'engine':<22}{'file order':>12}{'sorted':>10}{'BLEU':>8}")
    print("-" * 52)
    for name, title in (("savedmodel", "SavedModel (TF only)"), ("ct2", "CTranslate2 float32"),
                        ("ct2_int8", "CTranslate2 int8")):
        print(f"{title:<22}{rate[(name, 'file')]:>12.1f}{rate[(name, 'sorted')]:>10.1f}"
              f"{bleu[name]:>8.2f}")
    print(f"{'SavedModel / CT2 f32':<22}{result['savedmodel_over_ct2']:>12.3f}"
          f"{result['savedmodel_over_ct2_sorted']:>10.3f}")
    print("(sentences/s; CTranslate2's length penalty is logprob / len ** alpha, the "
          "SavedModel's GNMT's; README, CTranslate2)")


def main(argv=None) -> int:
    args = _parse_args(argv)

    from aiayn.export import saved_model as sm
    from aiayn.pipeline.config import load_config
    from aiayn.pipeline.training.validation import score

    cfg = load_config([args.preset], args.set)
    options = dataclasses.replace(sm.ServingOptions.from_configs(cfg.decode, cfg.export),
                                  n_best=1)
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-inference-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        model, tokenizer, pairs, label = load_weights_and_sentences(cfg, args.quick_minutes,
                                                                    tmp)
        pairs = pairs[:args.sentences]
        sources, references = [s for s, _ in pairs], [t for _, t in pairs]
        print(f"# {label}; {len(sources)} sentences ({time.perf_counter() - t0:.0f} s)",
              flush=True)
        workers = _start_workers(model, tokenizer, options, sources, tmp)
        try:
            times, outputs = _interleaved_rounds(workers, _orders(tokenizer, sources),
                                                 args.batch, args.rounds)
        finally:
            for worker in workers.values():
                worker.close()

    rate = {key: len(sources) / statistics.median(t) for key, t in times.items()}
    bleu = {name: score(outputs[(name, "file")], references)["bleu"] for name in workers}
    result = _result(rate, bleu, outputs, args, options, label, len(sources))
    _print_table(result, rate, bleu)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
