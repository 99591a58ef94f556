"""The exported SavedModel: layout, fresh-process verification, warmup, atomic versions."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

SENTENCES = ["I love you.", "", "   ", "God saw the light.", "我爱你", "Jesus wept.",
             "Привет мир"]  # the last: a script the toy vocabulary never saw


def test_layout_and_assets(exported):
    cfg, path = exported
    base = path.parents[1]
    assert path.name.isdigit() and path.parent.name == cfg.export.model_name
    extra = path / "assets.extra"
    for name in ("tf_serving_warmup_requests", "config.yaml", "spm.model", "verify_samples.json"):
        assert (extra / name).is_file(), name
    assert "model_config_list" in (base / "models.config").read_text()
    assert f'base_path: "{path.parent.resolve()}"' in (base / "models.config").read_text()
    assert "max_batch_size { value: 16 }" in (base / "batching_parameters.txt").read_text()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]


def test_fresh_process_load_op_allow_list_and_parity(exported, translator):
    from aiayn.export.verify import FORBIDDEN_OPS, verify_export

    _, path = exported
    want = translator.translate(SENTENCES)
    want_nb = translator.translate(SENTENCES, n_best=True)
    expected = {
        "serving_default": {"translation": [t.decode() for t in want["translation"]],
                            "score": want["score"].tolist()},
        "n_best": {"translations": [[t.decode() for t in row] for row in want_nb["translations"]],
                   "scores": want_nb["scores"].tolist(),
                   "truncated": want_nb["truncated"].tolist(),
                   "unknown_fraction": want_nb["unknown_fraction"].tolist()}}
    report = verify_export(path, expected=expected, texts=SENTENCES)
    assert report.ok, report.problems
    # Op allow-list: every op is core TensorFlow or tensorflow-text; no Python callbacks.
    assert set(report.ops.values()) <= {"core", "tensorflow_text", "function-call"}
    assert not FORBIDDEN_OPS & set(report.ops)
    # Tokenisation is in the graph: featurize_source's op returns each piece's byte offsets too
    # (for unknown_fraction); it is tensorflow-text's, which the stock server links.
    assert report.ops.get("SentencepieceTokenizeWithOffsetsOp") == "tensorflow_text"
    assert {"While", "StatelessWhile"} & set(report.ops)  # so is beam search
    sig = report.signatures["serving_default"]
    assert sig["inputs"] == {"text": {"dtype": "DT_STRING", "shape": [-1]}}
    assert sig["outputs"]["translation"] == {"dtype": "DT_STRING", "shape": [-1]}
    assert sig["outputs"]["score"] == {"dtype": "DT_FLOAT", "shape": [-1]}
    assert report.signatures["n_best"]["outputs"]["translations"]["shape"] == [-1, 2]
    assert report.signatures["n_best"]["outputs"]["unknown_fraction"] == {"dtype": "DT_FLOAT",
                                                                          "shape": [-1]}
    assert report.signatures["n_best"]["outputs"]["truncated"] == {"dtype": "DT_BOOL",
                                                                   "shape": [-1]}
    # The share of unknown characters, from the served graph: none for the toy corpus' own
    # scripts (CJK included), all of it for Cyrillic.
    assert report.outputs["n_best"]["unknown_fraction"] == [0.0] * 6 + [1.0]
    assert "signature_def['serving_default']:" in report.signature_text
    assert "Method name is: tensorflow/serving/predict" in report.signature_text
    # Parity was checked by verify_export (expected=...); spot-check the special cases.
    out = report.outputs["serving_default"]
    assert out["translation"][1:3] == ["", ""] and out["score"][1:3] == [0.0, 0.0]
    assert any(out["translation"][i] for i in (0, 3, 5))  # the model does emit text


def test_verifier_rejects_python_ops(tmp_path):
    import tensorflow as tf

    from aiayn.export.verify import verify_export

    class PyModel(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            return {"translation": tf.py_function(lambda t: t, [text], tf.string),
                    "score": tf.zeros(tf.shape(text), tf.float32)}

    module = PyModel()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve,
                                                           "n_best": module.serve})
    report = verify_export(tmp_path, texts=["x"])
    assert not report.ok
    assert any("EagerPyFunc" in p for p in report.problems)


def test_warmup_file_parses_as_prediction_logs(exported):
    from aiayn.export.warmup import read_warmup_requests

    cfg, path = exported
    logs = read_warmup_requests(path / "assets.extra" / "tf_serving_warmup_requests")
    assert 0 < len(logs) <= 1000
    import tensorflow as tf

    lengths = set()
    tokenizer_lengths = []
    for log in logs:
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        assert request.model_spec.signature_name in ("serving_default", "n_best")
        texts = tf.make_ndarray(request.inputs["text"])
        assert texts.ndim == 1 and texts.dtype == object
        lengths.add(len(texts[0]))
        tokenizer_lengths.append(texts[0])
    assert len(lengths) >= len(set(min(b, 24) for b in cfg.data.bucket_boundaries)) - 1


def test_interrupted_export_leaves_no_version(exported, trained_model, toy_tokenizer,
                                              monkeypatch):
    import keras

    from aiayn.export import saved_model as sm

    cfg, path = exported
    model_dir = path.parent
    before = sorted(p.name for p in model_dir.iterdir())

    def interrupted_write(self, filepath, **kwargs):
        import os

        os.makedirs(os.path.join(filepath, "variables"))
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt("simulated Ctrl-C in the middle of writing the SavedModel")

    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        sm.export_saved_model(trained_model, toy_tokenizer, cfg.export.base_dir,
                              cfg.export.model_name, options=sm.ServingOptions(beam_size=1,
                                                                               n_best=1))
    assert sorted(p.name for p in model_dir.iterdir()) == before


def test_existing_version_is_refused(exported, trained_model, toy_tokenizer):
    from aiayn.export import saved_model as sm

    cfg, path = exported
    with pytest.raises(sm.ExportError, match="already exists"):
        sm.export_saved_model(trained_model, toy_tokenizer, cfg.export.base_dir,
                              cfg.export.model_name, version=int(path.name))


def test_serving_options_carry_the_stop_rule(toy_config):
    import dataclasses

    from aiayn.export import saved_model as sm

    options = sm.ServingOptions.from_configs(toy_config.decode, toy_config.export)
    assert options.stop_rule == toy_config.decode.stop_rule == "current"
    bound = dataclasses.replace(toy_config.decode, stop_rule="bound")
    assert sm.ServingOptions.from_configs(bound, toy_config.export).stop_rule == "bound"
    with pytest.raises(sm.ExportError, match=r"`stop_rule` must be one of current, bound; "
                                             r"got 'never'"):
        sm.ServingOptions(stop_rule="never")


def test_a_seed_set_after_tracing_does_not_break_in_process_translation(trained_model,
                                                                        toy_tokenizer,
                                                                        export_cfg):
    # keras.utils.set_random_seed clears TensorFlow's kernel cache, which deletes the
    # SentencePiece resource the traced functions captured ("Resource ... does not exist").
    import keras
    import numpy as np

    from aiayn.export.saved_model import ServingOptions, Translator

    translator = Translator(trained_model, toy_tokenizer,
                            ServingOptions.from_configs(export_cfg.decode, export_cfg.export))
    before = translator.translate(SENTENCES)
    n_best = translator.translate(SENTENCES, n_best=True)
    keras.utils.set_random_seed(3)
    after = translator.translate(SENTENCES)
    assert after.keys() == before.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
    # Another user of the same tokenizer re-creates the resource first: the translator still
    # sees that its functions hold the deleted one.
    keras.utils.set_random_seed(4)
    generation = toy_tokenizer.resource_generation()
    toy_tokenizer.tokenize(["I love you."])
    again = translator.translate(SENTENCES, n_best=True)
    for key in n_best:
        np.testing.assert_array_equal(again[key], n_best[key])
    assert toy_tokenizer.resource_generation() == generation  # nothing lost since
