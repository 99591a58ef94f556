"""Figures: attention heads, the positional encoding (§3.5), the training curves.

    data = plot_positional_encoding("positional_encoding.png", length=128, dim=512)   # §3.5
    path = plot_training_curves("runs/small")                        # <run_dir>/curves.png

matplotlib is imported inside the plotting functions (``Figure`` + Agg canvas, no pyplot global
state), so serving and training never need it; it lives in the ``plot`` (and ``dev``) extras.
Figures are saved at their exact ``figsize * dpi`` (no tight bounding box), so a caller knows the
image size in advance (returned as ``image_size``).

Labels in scripts the default font (DejaVu Sans) lacks, such as Chinese and Japanese subwords,
are drawn with a fallback font that has their glyphs (:func:`label_fonts`: Noto Sans CJK,
WenQuanYi Zen Hei from Debian's ``fonts-wqy-zenhei``, which ``make system-deps`` installs, and
the usual macOS and Windows CJK fonts). Where no such font exists, those characters are written
as ``U+6211`` codes with a warning: never as empty boxes.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.pipeline.errors import UserInputError

CURVES_FILE = "curves.png"


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
    fig.savefig(path, dpi=fig.dpi, format="png")
    width, height = fig.get_size_inches()
    return int(round(width * fig.dpi)), int(round(height * fig.dpi))


# --------------------------------------------------------------------------------------------
# Fonts for labels in any script

# Fonts with CJK glyphs, by family name, in order of preference: Noto/Source Han (Debian's
# fonts-noto-cjk), WenQuanYi (fonts-wqy-zenhei, fonts-wqy-microhei), Droid fallback, and the
# system fonts of macOS and Windows.
FALLBACK_FAMILIES = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "Source Han Sans",
    "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback", "PingFang SC",
    "Hiragino Sans GB", "Hiragino Sans", "Microsoft YaHei", "SimHei", "Yu Gothic", "MS Gothic",
    "Malgun Gothic", "Arial Unicode MS",
)
# Where Debian's packages put them: found even when matplotlib's font cache predates them.
FALLBACK_FILES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
)
FONT_PACKAGE_HINT = ("install a CJK font, e.g. Debian's fonts-wqy-zenhei (`make system-deps` "
                     "as root) or fonts-noto-cjk")


@functools.cache
def font_charmap(path: str) -> frozenset[int]:
    """The code points a font file has glyphs for (the first face of a .ttc collection)."""
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(path).get_charmap())


def _default_font() -> tuple[str, str]:
    """(family name, file) of the font matplotlib draws text with by default."""
    from matplotlib import font_manager

    path = font_manager.findfont(font_manager.FontProperties(), fallback_to_default=True)
    return font_manager.FontProperties(fname=path).get_name(), path


@functools.lru_cache(maxsize=1)
def cjk_font() -> tuple[str, str] | None:
    """(family name, file) of an installed font with Chinese, Japanese and Korean glyphs, or
    None. Fonts known to matplotlib first (:data:`FALLBACK_FAMILIES`), then
    :data:`FALLBACK_FILES`, which are added to matplotlib's font list when found."""
    from matplotlib import font_manager

    probe = {ord(c) for c in "我爱你のテ"}
    by_name = {}
    for entry in font_manager.fontManager.ttflist:
        by_name.setdefault(entry.name, entry.fname)
    candidates = [(name, by_name[name]) for name in FALLBACK_FAMILIES if name in by_name]
    for path in FALLBACK_FILES:
        if Path(path).is_file():
            candidates.append(("", path))
    for name, path in candidates:
        try:
            if not probe <= font_charmap(path):
                continue
            if not name:  # a file matplotlib's cache does not list yet
                font_manager.fontManager.addfont(path)
                name = font_manager.FontProperties(fname=path).get_name()
        except (OSError, RuntimeError, ValueError):  # an unreadable font file
            continue
        return name, path
    return None


def label_fonts(texts: Iterable[str]) -> tuple[list[str], Callable[[str], str]]:
    """The font families to draw ``texts`` with, and how to write each text with them.

    Returns ``([default family] + [a CJK font, when some character needs one], shown)``;
    matplotlib draws each glyph with the first family of the list that has it. ``shown(text)``
    is ``text`` with every character that no family has written as ``U+XXXX``, so no label is
    drawn as empty boxes; a warning says so, and which font package to install.
    """
    default_name, default_path = _default_font()
    families, charmaps = [default_name], [font_charmap(default_path)]

    def lacking(chars: Iterable[str]) -> set[str]:
        return {c for c in chars
                if not c.isspace() and c.isprintable() and not any(ord(c) in m for m in charmaps)}

    missing = lacking(set("".join(texts)))
    if missing:
        fallback = cjk_font()
        if fallback is not None:
            families.append(fallback[0])
            charmaps.append(font_charmap(fallback[1]))
            missing = lacking(missing)
    if missing:
        warnings.warn(f"No installed font has glyphs for {''.join(sorted(missing))!r}: they "
                      f"are written as U+ codes in the figure; {FONT_PACKAGE_HINT}.",
                      UserWarning, stacklevel=3)

    def shown(text: str) -> str:
        return "".join(f"U+{ord(c):04X}" if c in missing else c for c in text)

    return families, shown


@contextlib.contextmanager
def _fonts(families: list[str]):
    """matplotlib draws the texts of figures made (and saved) inside with ``families``."""
    import logging

    import matplotlib

    # WenQuanYi Zen Hei has one weight, medium (500): matplotlib logs, for every label, that it
    # uses it for "normal" (400) text. That substitution is intended here.
    log = logging.getLogger("matplotlib.font_manager")

    def keep(record: logging.LogRecord) -> bool:
        return "Failed to find font weight" not in str(record.msg)

    log.addFilter(keep)
    try:
        with matplotlib.rc_context({"font.family": families}):
            yield
    finally:
        log.removeFilter(keep)


def heads_figure(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
                 title: str, xlabel: str, ylabel: str, dpi: int = 100):
    """The figure of :func:`plot_heads` (drawn and saved inside :func:`_fonts`)."""
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
    return fig


def plot_heads(weights: np.ndarray, x_labels: Sequence[str], y_labels: Sequence[str],
               out_png: Path, title: str, xlabel: str, ylabel: str,
               dpi: int = 100) -> tuple[int, int]:
    """A grid of ``(rows, cols)`` heatmaps, one per head, plus the mean over heads.

    Labels and title may be in any script (:func:`label_fonts`).

    Args:
      weights: float `(heads, rows, cols)` attention weights.
      x_labels, y_labels: `cols` and `rows` labels (subword pieces).
      out_png: the figure's path.
      title, xlabel, ylabel: texts of the figure.
      dpi: image resolution.

    Returns:
      `(width, height)` of the image in pixels.
    """
    families, shown = label_fonts([title, *x_labels, *y_labels])
    with _fonts(families):
        fig = heads_figure(weights, [shown(t) for t in x_labels], [shown(t) for t in y_labels],
                           shown(title), xlabel, ylabel, dpi)
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
    ``aiayn.pipeline.training.callbacks.RunHistory``); a series the run did not record (e.g. dev
    loss, or
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
