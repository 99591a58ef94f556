"""Attention maps, the positional-encoding plot and training curves (aiayn.pipeline.evaluation)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from aiayn.pipeline.errors import UserInputError

SOURCES = ["I love you.", "In the beginning God created the heavens and the earth."]
TARGETS = ["Te amo.", "En el principio creó Dios los cielos y la tierra."]


@pytest.fixture(scope="module")
def tiny_model(toy_config, toy_tokenizer):
    # No keras.utils.set_random_seed: seeding after the tokenizer exists destroys its
    # SentencePiece resource (conftest). Random weights are enough: every check is structural.
    from aiayn.pipeline.training.artifacts import build_model

    return build_model(toy_config, toy_tokenizer)


def _png_size(path):
    from PIL import Image

    with Image.open(path) as image:
        image.verify()  # a complete, uncorrupted file
    with Image.open(path) as image:
        return image.format, image.size


def _outputs(tokenizer, texts):
    import tensorflow as tf

    ids = tokenizer.tokenize(tf.constant(texts)).to_list()
    return [row + [tokenizer.eos_id] for row in ids]


def test_attention_maps_shapes_and_masking(tiny_model, toy_tokenizer, toy_config):
    from aiayn.pipeline.evaluation.explain import attention_maps

    outputs = _outputs(toy_tokenizer, TARGETS)
    maps = attention_maps(tiny_model, toy_tokenizer, SOURCES, outputs)
    src_mask = maps["encoder_padding_mask"]  # (B, S)
    tgt_mask = maps["decoder_padding_mask"]  # (B, T)
    B, S = src_mask.shape
    T = tgt_mask.shape[1]
    lengths = [len(o) for o in outputs]
    assert B == 2 and T == max(lengths) and src_mask.sum(1).min() < S  # real padding on both
    assert tgt_mask.sum(1).tolist() == lengths
    heads, layers = toy_config.model.num_heads, toy_config.model.num_layers
    for kind, shape in (("encoder_self", (B, heads, S, S)), ("decoder_self", (B, heads, T, T)),
                        ("cross", (B, heads, T, S))):
        assert len(maps[kind]) == layers
        for w in maps[kind]:
            assert w.shape == shape and w.dtype == np.float32
    # Decoder input = BOS + outputs[:-1]: row i is the query that produced outputs[i].
    assert (maps["decoder_token_ids"][:, 0] == toy_tokenizer.bos_id).all()
    np.testing.assert_array_equal(maps["decoder_token_ids"][0, 1:lengths[0]],
                                  outputs[0][:-1])
    for b in range(B):
        real_src, real_tgt = src_mask[b], tgt_mask[b]
        for w in maps["cross"]:
            rows = w[b][:, real_tgt]  # (heads, real T, S)
            np.testing.assert_allclose(rows[..., real_src].sum(-1), 1.0, atol=1e-5)
            assert (rows[..., ~real_src] == 0.0).all()
        for w in maps["encoder_self"]:
            rows = w[b][:, real_src]
            np.testing.assert_allclose(rows[..., real_src].sum(-1), 1.0, atol=1e-5)
            assert (rows[..., ~real_src] == 0.0).all()
        causal = np.tril(np.ones((T, T), bool)) & real_tgt[None, :]
        for w in maps["decoder_self"]:
            rows = w[b][:, real_tgt]  # (heads, real T, T)
            np.testing.assert_allclose(rows.sum(-1), 1.0, atol=1e-5)
            assert (rows[:, ~causal[real_tgt]] == 0.0).all()  # no future, no padding


def test_teacher_forcing_reproduces_the_greedy_decode(tiny_model, toy_tokenizer, tmp_path):
    """The maps come from the decoder's own computation: re-fed under teacher forcing, the
    produced tokens are again the argmax at every row (greedy search)."""
    import tensorflow as tf

    from aiayn.pipeline.evaluation.explain import explain_translation

    data = explain_translation(tiny_model, toy_tokenizer, SOURCES[0], tmp_path / "g.png",
                               beam_size=1, max_extra_length=6)
    out_ids = data["output_ids"]
    assert data["output_pieces"] == [p.decode() for p in
                                     toy_tokenizer.id_to_piece(tf.constant(out_ids)).numpy()]
    src, mask, *_ = toy_tokenizer.featurize_source(tf.constant([SOURCES[0]]), 256)
    dec = np.array([[toy_tokenizer.bos_id] + out_ids[:-1]], np.int32)
    logits = np.array(tiny_model({"encoder_token_ids": src, "encoder_padding_mask": mask,
                                  "decoder_token_ids": dec,
                                  "decoder_padding_mask": np.ones_like(dec, bool)},
                                 training=False))[0]
    logits[:, [toy_tokenizer.bos_id, toy_tokenizer.pad_id]] = -np.inf  # banned in the search
    assert logits.argmax(-1).tolist() == out_ids


def test_explain_translation_writes_images(tiny_model, toy_tokenizer, toy_config, tmp_path):
    from aiayn.pipeline.evaluation.explain import explain_translation

    out = tmp_path / "att.png"
    data = explain_translation(tiny_model, toy_tokenizer, SOURCES[1], out, beam_size=2,
                               max_extra_length=4, self_attention=True, dpi=50)
    heads = toy_config.model.num_heads
    S, T = len(data["source_pieces"]), len(data["output_pieces"])
    assert data["layer"] == toy_config.model.num_layers - 1
    assert data["cross"].shape == (heads, T, S)
    assert data["encoder_self"].shape == (heads, S, S)
    assert data["decoder_self"].shape == (heads, T, T)
    assert len(data["decoder_input_pieces"]) == T and data["decoder_input_pieces"][0] == "<s>"
    np.testing.assert_allclose(data["cross"].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(data["cross_mean"], data["cross"].mean(0), atol=1e-7)
    assert "".join(data["source_pieces"]).replace("\u2581", " ").strip() == SOURCES[1]
    assert set(data["paths"]) == {"cross", "encoder_self", "decoder_self"}
    assert data["paths"]["encoder_self"].name == "att.encoder_self.png"
    fmt, size = _png_size(out)
    assert fmt == "PNG" and size == data["image_size"]
    # 2 heads + mean in one row; each panel at least 2.8 x 2.6 inches at 50 dpi.
    assert size[0] >= 3 * 2.8 * 50 and size[1] >= 2.6 * 50
    for kind in ("encoder_self", "decoder_self"):
        assert _png_size(data["paths"][kind])[0] == "PNG"


def test_explain_translation_rejects_bad_input(tiny_model, toy_tokenizer, tmp_path):
    from aiayn.pipeline.evaluation.explain import explain_translation

    with pytest.raises(UserInputError,
                       match=r"Layer 5 does not exist: the model's decoder has 2 layers"):
        explain_translation(tiny_model, toy_tokenizer, "Jesus wept.", tmp_path / "x.png", layer=5)
    with pytest.raises(UserInputError, match="no subwords"):
        explain_translation(tiny_model, toy_tokenizer, "   ", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_a_deep_encoder_and_shallow_decoder_have_each_their_own_layer(toy_config,
                                                                      toy_tokenizer, tmp_path):
    import dataclasses

    from aiayn.pipeline.evaluation.explain import explain_translation
    from aiayn.pipeline.training.artifacts import build_model

    cfg = dataclasses.replace(toy_config, model=dataclasses.replace(
        toy_config.model, num_layers=3, num_decoder_layers=1))
    model = build_model(cfg, toy_tokenizer)
    out = tmp_path / "deep.png"
    data = explain_translation(model, toy_tokenizer, SOURCES[0], out, beam_size=1,
                               max_extra_length=3, self_attention=True, dpi=40)
    assert (data["layer"], data["encoder_layer"]) == (0, 2)  # -1: the last of each stack
    S, T = len(data["source_pieces"]), len(data["output_pieces"])
    assert data["encoder_self"].shape[1:] == (S, S) and data["cross"].shape[1:] == (T, S)
    assert _png_size(data["paths"]["encoder_self"])[0] == "PNG"
    data = explain_translation(model, toy_tokenizer, SOURCES[0], out, layer=0, beam_size=1,
                               max_extra_length=3)
    assert (data["layer"], data["encoder_layer"]) == (0, 0)
    with pytest.raises(UserInputError,
                       match=r"Layer 1 does not exist: the model's decoder has 1 layer "):
        explain_translation(model, toy_tokenizer, SOURCES[0], out, layer=1)


def test_positional_encoding_plot_data_is_the_sine_table(tmp_path):
    import keras

    from aiayn.models.embedding import sinusoidal_table
    from aiayn.pipeline.evaluation.plots import plot_positional_encoding

    data = plot_positional_encoding(tmp_path / "pe.png", length=40, dim=16, dpi=40)
    np.testing.assert_array_equal(data["table"],
                                  keras.ops.convert_to_numpy(sinusoidal_table(40, 16)))
    # Hand-computed §3.5 values: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(..).
    assert data["table"][3, 0] == pytest.approx(math.sin(3), abs=1e-6)
    assert data["table"][3, 1] == pytest.approx(math.cos(3), abs=1e-6)
    assert data["table"][7, 4] == pytest.approx(math.sin(7 / 10000 ** (4 / 16)), abs=1e-6)
    np.testing.assert_allclose(data["similarity"], data["table"] @ data["table"].T, rtol=1e-6)
    np.testing.assert_allclose(np.diag(data["similarity"]), 8.0, rtol=1e-5)  # d/2 sin²+cos²
    assert _png_size(data["path"]) == ("PNG", (13 * 40, 5 * 40)) == ("PNG", data["image_size"])
    with pytest.raises(UserInputError, match="even dim"):
        plot_positional_encoding(tmp_path / "bad.png", dim=15)


def _history_rows():
    rows = []
    for step in range(10, 210, 10):
        row = {"step": step, "loss": 9.0 / math.sqrt(step), "accuracy": 0.1,
               "learning_rate": 0.001 * min(step ** -0.5, step * 50 ** -1.5),
               "tokens_per_s": 1000.0, "elapsed_s": step * 0.5}
        if step % 50 == 0:
            row.update(dev_bleu=step / 20.0, dev_chrf=step / 8.0)
        rows.append(row)
    return rows


def test_training_curves_from_history_json(tmp_path):
    from aiayn.pipeline.evaluation.plots import history_series, plot_training_curves, read_history

    (tmp_path / "history.json").write_text(json.dumps({"rows": _history_rows()}))
    series = history_series(read_history(tmp_path))
    assert set(series) == {"train_loss", "learning_rate", "dev_bleu", "dev_chrf"}  # no dev loss
    assert series["dev_bleu"][0].tolist() == [50, 100, 150, 200]
    assert series["dev_bleu"][1].tolist() == [2.5, 5.0, 7.5, 10.0]
    path = plot_training_curves(tmp_path, dpi=40)
    assert path == tmp_path / "curves.png"
    assert _png_size(path) == ("PNG", (15 * 40, round(4.2 * 40)))


def test_training_curves_from_csv_with_missing_series(tmp_path):
    from aiayn.pipeline.evaluation.plots import history_series, plot_training_curves, read_history

    rows = [{k: v for k, v in r.items() if not k.startswith("dev_")} for r in _history_rows()]
    rows[3]["loss"] = "nan"  # a diverged step or an empty cell is skipped, not plotted
    with open(tmp_path / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    series = history_series(read_history(tmp_path))
    assert set(series) == {"train_loss", "learning_rate"}
    assert len(series["train_loss"][0]) == len(rows) - 1
    out = plot_training_curves(tmp_path, tmp_path / "sub" / "c.png", dpi=30)
    assert _png_size(out)[0] == "PNG"


def test_training_curves_without_history_is_a_clear_error(tmp_path):
    from aiayn.pipeline.evaluation.plots import plot_training_curves

    with pytest.raises(UserInputError, match="No training history"):
        plot_training_curves(tmp_path)


def test_cli_plot_commands(tmp_path, capsys):
    from aiayn.pipeline.cli import main

    out = tmp_path / "pe.png"
    assert main(["plot-positional-encoding", str(out), "--preset", "tiny", "--length", "20"]) == 0
    assert _png_size(out)[0] == "PNG" and str(out) in capsys.readouterr().out
    (tmp_path / "history.json").write_text(json.dumps({"rows": _history_rows()}))
    assert main(["plot-curves", "--preset", "tiny", "--run-dir", str(tmp_path)]) == 0
    assert (tmp_path / "curves.png").is_file()
    assert main(["plot-curves", "--preset", "tiny", "--run-dir", str(tmp_path / "none")]) == 2


def test_cli_translate_explain(tiny_model, toy_data_dir, tmp_path, capsys):
    from aiayn.pipeline.cli import main

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tiny_model.save_weights(str(run_dir / "final.weights.h5"))
    common = ["--preset", "tiny", "--set", f"data.data_dir={toy_data_dir}",
              "--set", "data.vocab_size=200", "--set", f"train.run_dir={run_dir}",
              "--set", "decode.max_extra_length=3"]
    out = tmp_path / "att.png"
    assert main(["translate", *common, "--explain", str(out), "--layer", "0",
                 "Jesus wept.", "I love you."]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 2  # one translation per sentence
    assert _png_size(out)[0] == "PNG" and _png_size(tmp_path / "att-2.png")[0] == "PNG"
    assert "layer 0" in captured.err
    assert main(["translate", *common, "--explain", str(out), "--server", "http://x:1",
                 "Jesus wept."]) == 2
    assert "--explain needs the model's weights" in capsys.readouterr().err


# --- labels in any script: never boxes -----------------------------------------------------------

CJK_LABELS = (["\u2581我", "爱", "你"], ["\u2581I", "\u2581love", "\u2581you", "</s>"])


def _draw(fig):
    """Renders ``fig`` with Agg; returns the messages of the warnings matplotlib gave."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught]


def test_cjk_labels_are_drawn_with_a_font_that_has_their_glyphs():
    from matplotlib import font_manager

    from aiayn.pipeline.evaluation import plots

    if plots.cjk_font() is None:
        pytest.skip("no CJK font installed (make system-deps installs fonts-wqy-zenhei)")
    weights = np.full((2, 4, 3), 1 / 3, np.float32)
    title = "Cross-attention: 我爱你 \u2192 I love you"
    # Control: with the default font alone, matplotlib draws boxes and says so.
    with plots._fonts(plots.label_fonts(["I love you"])[0]):
        boxes = _draw(plots.heads_figure(weights, *CJK_LABELS, title, "source", "output"))
    assert any("missing from font" in m for m in boxes)
    families, shown = plots.label_fonts([title, *CJK_LABELS[0], *CJK_LABELS[1]])
    assert len(families) == 2 and shown("爱") == "爱"
    with plots._fonts(families):
        fig = plots.heads_figure(weights, *CJK_LABELS, title, "source", "output")
        assert not [m for m in _draw(fig) if "missing from font" in m]
        labels = [t for ax in fig.axes[:3] for t in ax.get_xticklabels()]
        assert [t.get_text() for t in labels[:3]] == CJK_LABELS[0]
        for label in labels:
            # matplotlib draws each character with the first family that has its glyph.
            paths = [font_manager.findfont(font_manager.FontProperties(family=f),
                                           fallback_to_default=False)
                     for f in label.get_fontfamily()]
            for char in label.get_text():
                assert any(ord(char) in plots.font_charmap(p) for p in paths), (char, paths)
        assert fig._suptitle.get_text() == title


def test_without_a_cjk_font_labels_fall_back_to_code_points_with_a_warning(monkeypatch):
    from aiayn.pipeline.evaluation import plots

    monkeypatch.setattr(plots, "cjk_font", lambda: None)
    with pytest.warns(UserWarning, match=r"No installed font has glyphs for '你我爱'.*"
                                         r"fonts-wqy-zenhei"):
        families, shown = plots.label_fonts(CJK_LABELS[0] + CJK_LABELS[1])
    assert shown("\u2581我") == "\u2581U+6211" and shown("\u2581love") == "\u2581love"
    with plots._fonts(families):
        fig = plots.heads_figure(np.ones((1, 4, 3), np.float32),
                                 [shown(t) for t in CJK_LABELS[0]], CJK_LABELS[1], "t", "x", "y")
        assert not [m for m in _draw(fig) if "missing from font" in m]


def test_explain_a_chinese_sentence(tiny_model, toy_tokenizer, tmp_path):
    import warnings

    from aiayn.pipeline.evaluation.explain import explain_translation

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = explain_translation(tiny_model, toy_tokenizer, "我爱你", tmp_path / "zh.png",
                                   beam_size=1, max_extra_length=3, dpi=40)
    assert "".join(data["source_pieces"]).replace("\u2581", "") == "我爱你"
    assert data["unknown_fraction"] == 0.0  # the toy vocabulary has these characters
    assert not [w for w in caught if "missing from font" in str(w.message)]
    assert _png_size(tmp_path / "zh.png")[0] == "PNG"
    unknown = explain_translation(tiny_model, toy_tokenizer, "Привет", tmp_path / "ru.png",
                                  beam_size=1, max_extra_length=3, dpi=40)
    assert unknown["unknown_fraction"] == 1.0
