"""The served model is the evaluated model: `aiayn evaluate`'s hypotheses equal, string for string,
the `translation` output of the exported SavedModel loaded in a fresh TensorFlow-only process.

Both paths go through the one source featuriser (`SubwordTokenizer.featurize_source`) with the one
limit (`source_limit`), so ordinary, empty, over-long, CJK and unknown-only inputs must agree, for
beam search and for greedy search.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.export.serving_helpers import HARD_SENTENCES, LONG

pytestmark = pytest.mark.slow

SAMPLE = HARD_SENTENCES

FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops, as TF Serving does)
    texts = json.loads(sys.stdin.read())
    loaded = tf.saved_model.load(sys.argv[1])
    out = loaded.signatures["serving_default"](text=tf.constant(texts, tf.string))
    assert not any(name.startswith("aiayn") for name in sys.modules), "aiayn was imported"
    print(json.dumps([t.decode("utf-8") for t in out["translation"].numpy().tolist()]))
""")


def _served(version_dir, texts):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(version_dir)],
                            input=json.dumps(texts), capture_output=True, text=True, env=env,
                            cwd="/", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("beam_size", [4, 1])
def test_evaluate_equals_the_served_savedmodel(beam_size, export_cfg, trained_model,
                                               toy_tokenizer, tmp_path):
    import tensorflow as tf

    from aiayn.pipeline.config import source_limit
    from aiayn.pipeline.evaluation.evaluate import evaluate_run
    from aiayn.pipeline.release.export_run import export_run
    from aiayn.pipeline.training.artifacts import RunFiles, load_trained_model
    from aiayn.pipeline.training.validation import make_translator, translate_sentences

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(os.path.join(export_cfg.data.data_dir, "spm.model"), data_dir / "spm.model")
    # evaluate reads the test split; the reference side does not matter here.
    (data_dir / "test.tsv").write_text("".join(f"{s}\tx\n" for s in SAMPLE), encoding="utf-8")
    cfg = dataclasses.replace(
        export_cfg,
        data=dataclasses.replace(export_cfg.data, data_dir=str(data_dir)),
        decode=dataclasses.replace(export_cfg.decode, beam_size=beam_size, n_best=1,
                                   batch_size=64),
        export=dataclasses.replace(export_cfg.export, base_dir=str(tmp_path / "exports")))
    # The sample means what it says: one input over the limit, one of unknown pieces only.
    pieces = toy_tokenizer.tokenize(tf.constant(SAMPLE)).to_list()
    limit = source_limit(cfg)
    assert len(pieces[SAMPLE.index(LONG)]) > limit
    runic = pieces[SAMPLE.index("ᚠᚢᚦ ᚨᚱᚲ")]
    known = [p.decode() for p, i in zip(toy_tokenizer.id_to_piece(tf.constant(runic)).numpy(),
                                        runic) if i != toy_tokenizer.unk_id]
    assert toy_tokenizer.unk_id in runic and set(known) <= {"▁"}  # word boundaries only

    evaluate_run(cfg, split="test")
    evaluated = (RunFiles.of(cfg).eval_dir / "test.hyp.txt").read_text(
        encoding="utf-8").splitlines()
    assert len(evaluated) == len(SAMPLE)
    # The empty input cannot stand in a TSV; it goes through evaluate's own translation path.
    model, tokenizer, _ = load_trained_model(cfg)
    (empty,) = translate_sentences(make_translator(cfg, model, tokenizer), [""], 64)

    version_dir = export_run(cfg, verify=False)
    served = _served(version_dir, SAMPLE + [""])
    assert served == evaluated + [empty]
    assert empty == ""
