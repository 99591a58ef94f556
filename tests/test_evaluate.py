"""Evaluation: batched translation in input order, sacreBLEU scoring, the report files."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from aiayn.export.saved_model import ServingOptions, Translator  # noqa: E402
from aiayn.pipeline.training.validation import score, translate_sentences  # noqa: E402


class CopyModel:
    """A scripted 'model' whose search returns the source ids: translation = identity."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id
        self.batch_shapes = []

    def generate(self, encoder_token_ids, encoder_padding_mask, bos_id, eos_id, beam_size=4,
                 length_penalty=0.6, max_extra_length=50, n_best=1, dynamic_shapes=False,
                 stop_rule="current"):
        assert stop_rule == "current"  # the Translator passes the configured rule
        self.batch_shapes.append(tuple(encoder_token_ids.shape.as_list()))
        ids = tf.where(encoder_padding_mask, encoder_token_ids, self.pad_id)  # (B, S)
        lengths = tf.reduce_sum(tf.cast(encoder_padding_mask, tf.int32), axis=1)  # (B,)
        return {"token_ids": ids[:, None, :],  # (B, 1, S)
                "scores": -tf.cast(lengths, tf.float32)[:, None],
                "lengths": lengths[:, None]}


def test_translate_sentences_returns_strings_in_input_order(toy_tokenizer):
    sentences = ["Jesus wept.", "In the beginning God created the heavens and the earth.",
                 "I love you.", "", "The Lord is my shepherd; I shall not want."]
    model = CopyModel(toy_tokenizer.pad_id)
    translator = Translator(model, toy_tokenizer, ServingOptions(beam_size=2, n_best=1))
    out, scores = translate_sentences(translator, sentences, batch_size=2, return_scores=True)
    expected = [s.decode() for s in toy_tokenizer.detokenize(
        toy_tokenizer.tokenize(tf.constant(sentences))).numpy()]
    assert out == expected
    assert out[0] == "Jesus wept." and out[3] == ""
    lengths = toy_tokenizer.tokenize(tf.constant(sentences)).row_lengths().numpy()
    np.testing.assert_allclose(scores, -lengths)
    assert translate_sentences(translator, [], batch_size=2) == []


def test_score_reports_bleu_chrf_and_signatures():
    refs = ["el gato se sentó en la alfombra", "un perro corrió en el parque"]
    perfect = score(refs, refs)
    assert perfect["bleu"] == 100.0 and perfect["chrf"] == 100.0
    assert perfect["bleu_signature"].startswith("nrefs:1|") and "tok:13a" in \
        perfect["bleu_signature"]
    assert "chrF" not in perfect["bleu_signature"] and "nc:6" in perfect["chrf_signature"]
    worse = score(["el gato", "nada"], refs)
    assert worse["bleu"] < 100.0 and worse["chrf"] < 100.0


def test_evaluate_run_needs_weights(toy_config, tmp_path):
    from aiayn.pipeline.errors import UserInputError
    from aiayn.pipeline.evaluation.evaluate import evaluate_run

    cfg = toy_config.replace(train=toy_config.train.__class__(run_dir=str(tmp_path)))
    with pytest.raises(UserInputError, match="final.weights.h5 not found"):
        evaluate_run(cfg, split="test")
    with pytest.raises(UserInputError, match="split must be"):
        evaluate_run(cfg, split="validation")
