"""Seeing inside: attention maps of a translation, the positional encoding, training curves.

    data = explain_translation(model, tokenizer, "I love you.", "attention.png")  # cross-attention
    data = plot_positional_encoding("positional_encoding.png", length=128, dim=512)   # §3.5
    path = plot_training_curves("runs/small")                        # <run_dir>/curves.png

Attention maps come from the model's own layers (``Transformer.attention_weights``), never from a
re-implementation: the sentence is translated with ``model.generate`` and the produced tokens are
then fed back under teacher forcing, which gives the decoder exactly the inputs it had while it
searched (BOS, then its own previous outputs). Row ``i`` of a cross-attention map is the query
that produced output token ``i``; its columns are the source subwords.

matplotlib is imported inside the plotting functions (``Figure`` + Agg canvas, no pyplot global
state), so serving and training never need it; it lives in the ``plot`` (and ``dev``) extras.
Figures are saved at their exact ``figsize * dpi`` (no tight bounding box), so a caller knows the
image size in advance (returned as ``image_size``).
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from aiayn.pipeline.errors import UserInputError

CURVES_FILE = "curves.png"
KINDS = ("encoder_self", "decoder_self", "cross")


# --------------------------------------------------------------------------------------------
# Attention under teacher forcing


def attention_maps(model: Any, tokenizer: Any, sources: Sequence[str],
                   outputs: Sequence[Sequence[int]], max_length: int = 256) -> dict[str, Any]:
    """Per-layer attention weights for source sentences and the tokens the decoder produced.

    The decoder input is ``[BOS] + outputs[:-1]`` (what the decoder saw while generating), so row
    ``i`` of every decoder map belongs to the query that predicted ``outputs[i]``.

    Args:
      model: a built ``aiayn.models.transformer.Transformer``.
      tokenizer: its ``SubwordTokenizer`` (special ids are read from it).
      sources: ``B`` source sentences, featurised with ``tokenizer.featurize_source`` (the
        one source featuriser; an empty source is a lone EOS, as in serving).
      outputs: ``B`` lists of produced token ids (no BOS; EOS last where it was produced).
      max_length: the source limit (``aiayn.pipeline.config.source_limit(cfg)``).

    Returns:
      dict with numpy arrays: ``encoder_self`` / ``decoder_self`` / ``cross``: lists over layers
      of float32 ``(B, heads, S, S)`` / ``(B, heads, T, T)`` / ``(B, heads, T, S)``;
      ``encoder_token_ids`` int32 ``(B, S)``, ``encoder_padding_mask`` bool ``(B, S)``,
      ``decoder_token_ids`` int32 ``(B, T)``, ``decoder_padding_mask`` bool ``(B, T)``,
      ``output_token_ids`` int32 ``(B, T)`` (pad_id on padding).

    Raises:
      ValueError: ``sources`` and ``outputs`` differ in length, or an output is empty.
    """
    import tensorflow as tf

    if len(sources) != len(outputs):
        raise ValueError(f"`sources` and `outputs` must pair up. Received {len(sources)} "
                         f"sources and {len(outputs)} outputs.")
    if not sources:
        raise ValueError("`attention_maps` needs at least one sentence.")
    rows = [[int(t) for t in out] for out in outputs]
    if any(not r for r in rows):
        raise ValueError("Every output needs at least one token (EOS counts).")
    features = tokenizer.featurize_source(tf.constant(list(sources), tf.string), max_length)
    enc_ids, enc_mask = features.token_ids.numpy(), features.padding_mask.numpy()
    width = max(len(r) for r in rows)
    dec_ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)  # (B, T)
    out_ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)  # (B, T)
    dec_mask = np.zeros((len(rows), width), bool)
    for b, r in enumerate(rows):
        dec_ids[b, :len(r)] = [tokenizer.bos_id] + r[:-1]  # shift right: what the decoder saw
        out_ids[b, :len(r)] = r
        dec_mask[b, :len(r)] = True
    weights = model.attention_weights({
        "encoder_token_ids": enc_ids, "encoder_padding_mask": enc_mask,
        "decoder_token_ids": dec_ids, "decoder_padding_mask": dec_mask})
    result: dict[str, Any] = {k: [np.asarray(w, dtype=np.float32) for w in weights[k]]
                              for k in KINDS}
    result.update(encoder_token_ids=enc_ids, encoder_padding_mask=enc_mask,
                  decoder_token_ids=dec_ids, decoder_padding_mask=dec_mask,
                  output_token_ids=out_ids)
    return result


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    import tensorflow as tf

    if len(ids) == 0:
        return []
    raw = tokenizer.id_to_piece(tf.constant(list(ids), tf.int32)).numpy()
    return [p.decode("utf-8", errors="replace") for p in raw]


def _resolve_layer(layer: int, num_layers: int) -> int:
    if not -num_layers <= layer < num_layers:
        raise UserInputError(f"Layer {layer} does not exist: the model has {num_layers} layers "
                             f"(use 0..{num_layers - 1}, or -1 for the last).")
    return layer % num_layers


def explain_translation(model: Any, tokenizer: Any, sentence: str, out_png: str | Path,
                        layer: int = -1, beam_size: int = 4, length_penalty: float = 0.6,
                        max_extra_length: int = 50, max_length: int = 256,
                        self_attention: bool = False, dpi: int = 100) -> dict[str, Any]:
    """Translates one sentence and plots the cross-attention of one decoder layer per head.

    The figure holds one heatmap per head and the average over heads (source subwords on x,
    produced subwords on y; one colour scale from 0 to the largest weight). With
    ``self_attention`` two more files are written beside it: ``<stem>.encoder_self.png``
    (source x source) and ``<stem>.decoder_self.png`` (produced tokens x decoder inputs,
    causal).

    Args:
      model: a built Transformer with trained weights.
      tokenizer: its ``SubwordTokenizer``.
      sentence: the source text.
      out_png: where the cross-attention figure goes.
      layer: which layer (of the decoder for cross/decoder maps, of the encoder for encoder
        maps); negative counts from the end (default: the last).
      beam_size, length_penalty, max_extra_length: decode settings for ``model.generate``
        (``beam_size=1`` is greedy).
      max_length: the source limit (``aiayn.pipeline.config.source_limit(cfg)``).
      self_attention: also plot the encoder and decoder self-attention of ``layer``.
      dpi: image resolution; the size in pixels is ``image_size``.

    Returns:
      dict: ``source``, ``translation``, ``score``, ``layer`` (resolved index),
      ``source_ids`` / ``source_pieces`` (S), ``output_ids`` / ``output_pieces`` (T, the
      produced tokens, EOS (``</s>``) last when the search produced it),
      ``decoder_input_pieces`` (T), ``cross`` float32 ``(heads, T, S)``, ``cross_mean``
      ``(T, S)``, ``encoder_self`` ``(heads, S, S)``, ``decoder_self`` ``(heads, T, T)``,
      ``paths`` (kind -> Path of each written file), ``image_size``
      ((width, height) pixels of ``out_png``).

    Raises:
      UserInputError: the sentence has no subwords, or ``layer`` does not exist.

    Example:
      >>> data = explain_translation(model, tok, "I love you.", "attention.png", beam_size=4)
      >>> data["output_pieces"], data["cross_mean"].shape
      (['▁Te', '▁amo', '.', '</s>'], (4, 4))
    """
    import tensorflow as tf

    features = tokenizer.featurize_source(tf.constant([sentence], tf.string), max_length)
    if bool(features.empty.numpy()[0]):
        raise UserInputError(f"Nothing to explain: {sentence!r} has no subwords.")
    ids, mask = features.token_ids, features.padding_mask
    layer = _resolve_layer(layer, int(model.num_layers))

    produced, translation, score = _search(model, tokenizer, ids, mask, beam_size,
                                           length_penalty, max_extra_length)
    maps = attention_maps(model, tokenizer, [sentence], [produced], max_length=max_length)
    source_ids = maps["encoder_token_ids"][0]
    source_pieces = _pieces(tokenizer, source_ids)
    output_pieces = _pieces(tokenizer, produced)
    input_pieces = _pieces(tokenizer, maps["decoder_token_ids"][0])
    cross = maps["cross"][layer][0]  # (heads, T, S)
    data: dict[str, Any] = {
        "source": sentence, "translation": translation, "score": score, "layer": layer,
        "source_ids": [int(t) for t in source_ids], "output_ids": produced,
        "source_pieces": source_pieces, "output_pieces": output_pieces,
        "decoder_input_pieces": input_pieces,
        "cross": cross, "cross_mean": cross.mean(axis=0),
        "encoder_self": maps["encoder_self"][layer][0],
        "decoder_self": maps["decoder_self"][layer][0],
        "paths": {},
    }
    _plot_explanation(data, Path(out_png), int(model.num_layers), self_attention, dpi)
    return data


def _search(model: Any, tokenizer: Any, ids, mask, beam_size: int, length_penalty: float,
            max_extra_length: int) -> tuple[list[int], str, float]:
    """``model.generate`` on one featurised sentence: produced ids (EOS last when the search
    stopped on it), the translation and its score."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None, None], tf.bool)])
    def generate(token_ids, padding_mask):
        return model.generate(token_ids, padding_mask, bos_id=tokenizer.bos_id,
                              eos_id=tokenizer.eos_id, beam_size=beam_size,
                              length_penalty=length_penalty, max_extra_length=max_extra_length,
                              n_best=1)

    out = generate(tf.cast(ids, tf.int32), mask)
    generated = out["token_ids"].numpy()[0, 0]  # (L,) no BOS; EOS and after = pad
    length = int(out["lengths"].numpy()[0, 0])
    produced = [int(t) for t in generated[:length]]
    if length < generated.shape[0]:  # search stopped on EOS (else it ran out of length)
        produced.append(tokenizer.eos_id)
    translation = tokenizer.detokenize(tf.constant([produced], tf.int32)).numpy()[0]
    return produced, translation.decode("utf-8"), float(out["scores"].numpy()[0, 0])


def _plot_explanation(data: dict[str, Any], out_png: Path, n_layers: int, self_attention: bool,
                      dpi: int) -> None:
    """Writes the cross-attention figure (and the self-attention ones); fills ``data``."""
    layer, sentence = data["layer"], data["source"]
    source_pieces, output_pieces = data["source_pieces"], data["output_pieces"]
    input_pieces, cross = data["decoder_input_pieces"], data["cross"]
    data["image_size"] = _plot_heads(
        cross, source_pieces, output_pieces, out_png, dpi=dpi,
        title=f"Cross-attention, decoder layer {layer + 1}/{n_layers}: "
              f"{_shorten(sentence)} \u2192 {_shorten(data['translation'])}",
        xlabel="source subwords", ylabel="produced subwords")
    data["paths"]["cross"] = out_png
    if self_attention:
        for kind, x_labels, y_labels, title, xlabel, ylabel in (
                ("encoder_self", source_pieces, source_pieces,
                 f"Encoder self-attention, layer {layer + 1}/{n_layers}", "source subwords",
                 "source subwords (queries)"),
                ("decoder_self", input_pieces, output_pieces,
                 f"Decoder self-attention (causal), layer {layer + 1}/{n_layers}",
                 "decoder inputs", "produced subwords (queries)")):
            path = out_png.with_name(f"{out_png.stem}.{kind}{out_png.suffix or '.png'}")
            _plot_heads(data[kind], x_labels, y_labels, path, title=title, xlabel=xlabel,
                        ylabel=ylabel, dpi=dpi)
            data["paths"][kind] = path




def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


# --------------------------------------------------------------------------------------------
# Figures


def _new_figure(width: float, height: float, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> tuple[int, int]:
    """Saves at exactly ``figsize * dpi`` pixels; returns ``(width, height)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # Pieces in scripts the default font lacks (e.g. CJK) render as boxes, not errors.
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph .* missing from.*")
        fig.savefig(path, dpi=fig.dpi, format="png")
    width, height = fig.get_size_inches()
    return int(round(width * fig.dpi)), int(round(height * fig.dpi))


def _plot_heads(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
                out_png: Path, title: str, xlabel: str, ylabel: str,
                dpi: int = 100) -> tuple[int, int]:
    """A grid of ``(rows, cols)`` heatmaps, one per head, plus the mean over heads."""
    heads, rows, cols = weights.shape  # (heads, Tq, Tk)
    panels = [(f"head {h + 1}", weights[h]) for h in range(heads)]
    if heads > 1:
        panels.append(("mean over heads", weights.mean(axis=0)))
    ncols = len(panels) if len(panels) <= 4 else math.ceil(math.sqrt(len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    # Panel size grows with the token count so labels stay readable; capped for long inputs.
    panel_w = min(12.0, max(2.8, 0.22 * cols + 1.3))
    panel_h = min(12.0, max(2.6, 0.22 * rows + 1.3))
    fig = _new_figure(ncols * panel_w + 0.8, nrows * panel_h + 0.5, dpi)
    fig.suptitle(title, fontsize=10)
    fontsize = max(4.0, min(8.0, 220.0 / max(rows, cols, 1)))
    # One colour scale for all panels (heads stay comparable), up to the largest weight shown:
    # a fixed [0, 1] scale would leave the diffuse heads of long sentences nearly black.
    vmax = float(max(weights.max(), 1e-6))
    image = None
    for i, (name, matrix) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        image = ax.imshow(matrix, vmin=0.0, vmax=vmax, cmap="viridis", aspect="auto",
                          interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(cols))
        ax.set_xticklabels(list(x_labels)[:cols], rotation=90, fontsize=fontsize)
        ax.set_yticks(range(rows))
        ax.set_yticklabels(list(y_labels)[:rows], fontsize=fontsize)
        if i % ncols == 0:
            ax.set_ylabel(ylabel, fontsize=8)
        if i >= len(panels) - ncols:
            ax.set_xlabel(xlabel, fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, shrink=0.6, label="attention weight")
    return _save(fig, out_png)


# --------------------------------------------------------------------------------------------
# Positional encoding (§3.5)


def plot_positional_encoding(out_png: str | Path, length: int = 128, dim: int = 512,
                             dpi: int = 100) -> dict[str, Any]:
    """Plots the sinusoidal table (position x dimension) and the position-position similarity.

    The similarity is the dot product ``PE[p] . PE[q] = sum_i cos(w_i (p - q))``: it depends on
    ``p - q`` only (the relative-position property the paper hoped for, §3.5), hence the bands
    along the diagonal.

    Args:
      out_png: the figure's path.
      length: positions shown.
      dim: d_model (even).
      dpi: image resolution.

    Returns:
      dict: ``table`` float32 ``(length, dim)`` (equal to ``sinusoidal_table(length, dim)``),
      ``similarity`` float32 ``(length, length)``, ``path``, ``image_size`` ((width, height)).

    Raises:
      UserInputError: ``length`` below 1, or ``dim`` odd or below 2.
    """
    import keras

    from aiayn.models.embedding import sinusoidal_table

    if length < 1 or dim < 2 or dim % 2:
        raise UserInputError(f"The positional encoding needs length >= 1 and an even dim >= 2. "
                             f"Received: length={length}, dim={dim}.")
    table = np.asarray(keras.ops.convert_to_numpy(sinusoidal_table(length, dim)), np.float32)
    similarity = table @ table.T  # (length, length)
    fig = _new_figure(13.0, 5.0, dpi)
    fig.suptitle(f"Sinusoidal positional encoding (§3.5), d_model={dim}", fontsize=11)
    ax = fig.add_subplot(1, 2, 1)
    im = ax.imshow(table, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto",
                   interpolation="nearest")
    ax.set_title("PE[position, dimension]: sin on even, cos on odd dimensions", fontsize=9)
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax = fig.add_subplot(1, 2, 2)
    im = ax.imshow(similarity, cmap="viridis", aspect="equal", interpolation="nearest")
    ax.set_title("PE[p] \u00b7 PE[q] (depends on p \u2212 q only)", fontsize=9)
    ax.set_xlabel("position q")
    ax.set_ylabel("position p")
    fig.colorbar(im, ax=ax, shrink=0.8)
    out_png = Path(out_png)
    size = _save(fig, out_png)
    return {"table": table, "similarity": similarity, "path": out_png, "image_size": size}


# --------------------------------------------------------------------------------------------
# Training curves


# Which history keys feed which series (first match wins), so older or other logs still plot.
SERIES_KEYS: dict[str, tuple[str, ...]] = {
    "train_loss": ("loss", "train_loss"),
    "dev_loss": ("dev_loss", "val_loss"),
    "dev_bleu": ("dev_bleu", "val_bleu", "bleu"),
    "dev_chrf": ("dev_chrf", "val_chrf", "chrf"),
    "learning_rate": ("learning_rate", "lr"),
}


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<run_dir>/history.json`` (or ``history.csv``), one dict per logged step.

    Raises:
      UserInputError: neither file exists or neither parses.
    """
    run_dir = Path(run_dir)
    json_path, csv_path = run_dir / "history.json", run_dir / "history.csv"
    if json_path.is_file():
        try:
            data = json.loads(json_path.read_text(encoding="utf-8"))
            rows = data["rows"] if isinstance(data, Mapping) else data
            if isinstance(rows, list):
                return [dict(r) for r in rows if isinstance(r, Mapping)]
        except (ValueError, KeyError, TypeError):
            pass  # a damaged JSON: the CSV carries the same rows
    if csv_path.is_file():
        with open(csv_path, newline="", encoding="utf-8") as f:
            return [dict(r) for r in csv.DictReader(f)]
    raise UserInputError(f"No training history in {run_dir} (history.json or history.csv): "
                         "train first (`aiayn train`), or point at the run directory.")


def history_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{series: (steps, values)}`` for every series of :data:`SERIES_KEYS` that has values."""
    series = {}
    for name, keys in SERIES_KEYS.items():
        steps, values = [], []
        for row in rows:
            step = _number(row.get("step"))
            value = next((v for v in (_number(row.get(k)) for k in keys) if v is not None), None)
            if step is not None and value is not None:
                steps.append(step)
                values.append(value)
        if steps:
            order = np.argsort(steps, kind="stable")
            series[name] = (np.asarray(steps)[order], np.asarray(values)[order])
    return series


def plot_training_curves(run_dir: str | Path, out_png: str | Path | None = None,
                         dpi: int = 100) -> Path:
    """Writes ``<run_dir>/curves.png``: loss (training, dev), dev BLEU/chrF, learning rate.

    Reads the run's own log (``history.json``, else ``history.csv``, as written by
    ``aiayn.pipeline.training.callbacks.RunHistory``); a series the run did not record (e.g. dev loss, or
    dev BLEU when ``train.eval_every`` is 0) gets a "not recorded" panel instead of an error.

    Args:
      run_dir: the training run directory.
      out_png: default ``<run_dir>/curves.png``.
      dpi: image resolution (the figure is 15 x 4.2 inches).

    Returns:
      The path of the figure.

    Raises:
      UserInputError: the run has no history file.
    """
    run_dir = Path(run_dir)
    series = history_series(read_history(run_dir))
    fig = _new_figure(15.0, 4.2, dpi)
    last = max((s[0][-1] for s in series.values()), default=0)
    fig.suptitle(f"Training curves: {run_dir.name} ({int(last)} steps)", fontsize=11)
    panels = (
        ("loss (label-smoothed cross-entropy)", (("train_loss", "training"), ("dev_loss", "dev"))),
        ("dev score", (("dev_bleu", "BLEU"), ("dev_chrf", "chrF"))),
        ("learning rate", (("learning_rate", "learning rate"),)),
    )
    for i, (title, members) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        drawn = [(key, label) for key, label in members if key in series]
        for key, label in drawn:
            steps, values = series[key]
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                    label=label)
        missing = [label for key, label in members if key not in series]
        if missing:
            ax.text(0.5, 0.5 if not drawn else 0.06, "not recorded: " + ", ".join(missing),
                    transform=ax.transAxes, ha="center", va="center", fontsize=8, color="gray")
        if len(drawn) > 1:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    out = Path(out_png) if out_png else run_dir / CURVES_FILE
    _save(fig, out)
    return out
