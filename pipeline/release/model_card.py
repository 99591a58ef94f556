"""The model card: what a trained model is, what it was trained on, how well it does, its limits.

    text = write_model_card(cfg)                      # from the run's own files
    text = write_model_card(cfg, "card.md", parameters=n, eval_reports={"test": report})
    print(read_export_card("exports/translate/3"))   # assets.extra/model_card.md of an export

Every export carries its card in ``assets.extra/model_card.md`` (written by
``aiayn.pipeline.release.export_run.export_model`` before verification and publication); ``aiayn
model-card`` prints it. Sources, all optional (a missing one is stated as such in the card):

    <data_dir>/data_report.json     corpus, split counts and sha256, package versions, drops
    <run_dir>/train_state.json      steps, training time, strategy, precision, chosen weights
    <run_dir>/summary.json          host of a finished `aiayn run`
    <run_dir>/eval/<split>.json     BLEU, chrF and their sacreBLEU signatures
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiayn.pipeline.data.languages import base_language
from aiayn.pipeline.data.vocab import OUTPUT_IDS_FILENAME
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write

MODEL_CARD = "model_card.md"
# The card's example input for a source language (the walkthrough's sentence where there is one).
EXAMPLES = {"en": "I love you.", "zh": "我爱你", "ja": "愛してる", "es": "Te amo."}
EXTRA_DIR = "assets.extra"

# Known limits of the default corpus (data.corpus = bible): shown in every card trained on it.
BIBLE_LIMITS = (
    "**Archaic target language.** The Spanish side is the Reina-Valera 1909: early-20th-century "
    "spelling and grammar (*vosotros* forms, enclitic pronouns such as *díjole*, archaic "
    "vocabulary). Expect that register in every output, also for modern inputs.",
    "**One domain.** Trained on Bible verses only (World English Bible -> RV 1909): religious, "
    "narrative and poetic language. Everyday, technical, legal or conversational text is out of "
    "domain and will be translated poorly or into biblical phrasing.",
    "**Verse-level, no context.** Each training pair is one verse; the model sees no document "
    "context, and inputs longer than `export.max_input_tokens` subwords are truncated (or "
    "rejected, per `export.on_long_input`).",
    "**Independent translations.** Both Bibles were translated from the Hebrew and Greek, not "
    "from each other: a Spanish verse is not a literal translation of its English verse, which "
    "lowers every score (references included) and teaches some free rendering.",
    "**Scores are in-domain.** Dev and test are whole held-out books of the same Bibles; they "
    "overstate quality on any other text.",
)
GENERIC_LIMITS = (
    "**Domain.** The model knows only the domain and register of its training corpus; scores on "
    "its own held-out splits overstate quality on other text.",
    "**Sentence-level, no context.** Inputs longer than `export.max_input_tokens` subwords are "
    "truncated (or rejected, per `export.on_long_input`).",
)
COMMON_LIMITS = (
    "**Not for high-stakes use.** A small research Transformer: it can drop, repeat or invent "
    "content (hallucinate) without warning, most often on inputs unlike its training data.",
)


def unknown_input_limit(cfg: Any) -> str:
    """The card's note on input in scripts or languages the vocabulary does not know."""
    return (f"**Unknown input.** The model reads {cfg.data.source_lang} only: characters its "
            "vocabulary never saw (another script, e.g. Chinese for a Latin-script model) become "
            "`<unk>` and come back as a fluent invention, not a translation. The `n_best` "
            "signature returns `unknown_fraction`, the share of each input's characters the "
            "vocabulary does not know; `aiayn translate` warns when it is over one half.")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_eval_reports(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``{split: report}`` of ``<run_dir>/eval/*.json`` (samples dropped); empty if none."""
    reports = {}
    for path in sorted((Path(run_dir) / "eval").glob("*.json")):
        report = _read_json(path)
        if isinstance(report, Mapping):
            reports[path.stem] = {k: v for k, v in report.items() if k != "samples"}
    return reports


# CPU features that decide training speed here (float32 FMA width, bf16 units).
_SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name and the features that set its matmul speed, e.g. ``AMD EPYC
    (avx2)``; training steps per minute differ several-fold between such machines, so a
    result is only comparable next to this. ``""`` where ``/proc/cpuinfo`` is unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name", "")
    return f"{name} ({', '.join(f for f in _SPEED_FLAGS if f in flags) or 'no AVX2'})" if name \
        else ""


def host_description() -> str:
    """This machine in a few words (OS, CPU and count, accelerators TensorFlow sees if
    loaded)."""
    cpu = cpu_description()
    text = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs" + (
        f" {cpu}" if cpu else "")
    tf = sys.modules.get("tensorflow")  # never import TensorFlow just for the card
    if tf is not None:
        try:
            gpus = tf.config.list_physical_devices("GPU")
            tpus = tf.config.list_physical_devices("TPU")
            accel = [f"{len(gpus)} GPU(s)"] * bool(gpus) + [f"{len(tpus)} TPU(s)"] * bool(tpus)
            text += ", " + (", ".join(accel) if accel else "no GPU/TPU")
        except Exception:  # noqa: BLE001 - a description must never fail an export
            pass
    return text


def _fmt_seconds(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "unknown"
    h, rem = divmod(int(round(s)), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _budget_text(train_cfg: Any, summary: Mapping[str, Any]) -> str:
    """The clause after the training time, e.g. ' of a 40 min 00 s time budget (what the job's
    43.5-minute deadline left)'; empty without a time budget."""
    budget = summary.get("time_budget_seconds") or 0
    if not budget:
        return ""
    deadline = getattr(train_cfg, "deadline_minutes", 0)
    why = (f" (what the job's {deadline:g}-minute deadline left)" if deadline
           else " (train.max_minutes)")
    return f" of a {_fmt_seconds(budget)} time budget{why}"


def _fmt_score(value: Any) -> str:
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return "-"


def _table(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def _data_section(cfg: Any, report: Mapping[str, Any] | None) -> list[str]:
    d = cfg.data
    out = ["## Data", ""]
    source = (report or {}).get("source") or {}
    corpus = source.get("corpus", d.corpus)
    out.append(f"- Corpus: `{corpus}` ({d.source_lang} -> {d.target_lang})"
               + (f": {source['description']}." if source.get("description") else "."))
    if not report:
        out += [f"- No data report found at `{Path(d.data_dir) / 'data_report.json'}` "
                "(run `aiayn data`).", ""]
        return out
    books = source.get("books")
    if isinstance(books, Mapping):
        for split in ("dev", "test"):
            if isinstance(books.get(split), list):
                out.append(f"- {split.capitalize()} books (held out whole): "
                           + ", ".join(books[split]) + ".")
    packages = source.get("packages")
    if isinstance(packages, Mapping) and packages:
        out.append("- Package versions: " + ", ".join(f"`{k}` {v}" for k, v in
                                                       sorted(packages.items())) + ".")
    out.append(f"- Pairs kept: {report.get('kept', '?')}; dropped: "
               + (", ".join(f"{k} {v}" for k, v in sorted((report.get('dropped') or {}).items()))
                  or "none") + ".")
    if report.get("stamp"):
        out.append(f"- Data stamp (inputs and data settings): `{report['stamp']}`.")
    splits = report.get("splits") or {}
    rows = [(name, info.get("pairs", "?"), f"`{info.get('sha256', '?')}`")
            for name, info in splits.items() if isinstance(info, Mapping)]
    if rows:
        out += ["", *_table(rows, ("split", "pairs", "sha256 of the prepared TSV"))]
    from aiayn.pipeline.data.vocab import character_coverage

    out += ["", f"Subword vocabulary: joint SentencePiece ({d.vocab_model_type}, `nmt_nfkc` "
                f"normaliser, soft limit {d.vocab_size} pieces, character coverage "
                f"{character_coverage(cfg):g}) trained on the training split.", ""]
    return out


def _depth(m: Any) -> str:
    """``"2"`` where the encoder and the decoder have as many layers, else ``"3, 1"``."""
    decoder = m.decoder_layers
    return str(m.num_layers) if decoder == m.num_layers else f"{m.num_layers}, {decoder}"


def _activation(m: Any) -> str:
    """``"ReLU (as the paper)"``, or the other activation's name."""
    if m.ffn_activation == "relu":
        return "ReLU (as the paper)"
    gated = {"swiglu": "SwiGLU", "geglu": "GEGLU"}.get(m.ffn_activation)
    return (f"{gated} (gated, Shazeer 2020; the inner layer 2 x d_ff wide)" if gated
            else m.ffn_activation.upper())


def _dropout(cfg: Any) -> str:
    """``"0.2"``, or ``"0.2 (from 0.25 of the run; none before)"`` with late dropout, and
    ``"; tokens 0.1"`` with token (word) dropout."""
    rate, late, tokens = cfg.model.dropout, cfg.train.late_dropout, cfg.model.token_dropout
    text = f"{rate:g}" + (f"; tokens {tokens:g}" if tokens else "")
    return f"{text} (from {late:g} of the run; none before)" if late and (rate or tokens) else text


def _model_section(cfg: Any, parameters: int | None, vocabulary_size: int | None) -> list[str]:
    m = cfg.model
    rows = [("preset", f"`{cfg.preset or 'none'}`"),
            ("architecture", "Transformer encoder-decoder (Vaswani et al., 2017), "
                             + ("pre-norm" if m.norm_first else "post-norm (as the paper)")
                             + (", tied embeddings and output projection (§3.4)"
                                if m.tie_embeddings else "")),
            ("layers N (encoder, decoder)", _depth(m)), ("d_model", m.hidden_dim),
            ("d_ff", m.intermediate_dim), ("feed-forward activation", _activation(m)),
            ("heads h", m.num_heads),
            ("dropout P_drop", _dropout(cfg)), ("max positions", m.max_position)]
    if vocabulary_size:
        rows.append(("vocabulary (joint)", vocabulary_size))
    if cfg.data.output_vocabulary == "target":
        kept = _read_json(Path(cfg.data.data_dir) / OUTPUT_IDS_FILENAME) or {}
        count = f"{kept['output_pieces']:,} " if "output_pieces" in kept else ""
        rows.append(("output vocabulary", f"the {count}pieces of the training targets and the "
                                          "specials (`data.output_vocabulary=target`)"))
    rows.append(("parameters", f"{parameters:,} ({parameters / 1e6:.3g} M)"
                 if parameters else "unknown"))
    return ["## Model", "", *_table(rows, ("", "")), ""]


def _training_section(cfg: Any, state: Mapping[str, Any] | None,
                      run_summary: Mapping[str, Any] | None) -> list[str]:
    t = cfg.train
    out = ["## Training", ""]
    summary = (state or {}).get("summary") or {}
    if summary:
        out.append(f"- Steps: {summary.get('steps', '?')} of {t.steps} "
                   f"(stopped by: {summary.get('stop_reason', '?')}); training time "
                   f"{_fmt_seconds(summary.get('train_seconds'))}{_budget_text(t, summary)}; "
                   f"{summary.get('tokens_per_second', '?')} target tokens/s.")
        out.append(f"- Hardware: {summary.get('strategy', '?')} with "
                   f"{summary.get('replicas', '?')} replica(s), precision "
                   f"`{summary.get('mixed_precision', '?')}`, XLA "
                   f"{'on' if summary.get('jit_compile') else 'off'}"
                   + (f", oneDNN {summary['onednn']}" if "onednn" in summary else "")
                   + "; host: "
                   + ((run_summary or {}).get("host") or host_description()) + ".")
        averaging = summary.get("averaging") or {}
        if averaging.get("chosen"):
            margin = averaging.get("selection_margin") or 0.0
            rule = (f"; another than the last only when it beats the last by more than "
                    f"{margin:g} BLEU" if margin else "")
            among = ", ".join(f"`{name}`" for name in averaging.get("candidates") or {})
            out.append(f"- Final weights: `{averaging['chosen']}` (the best on dev among "
                       + (among or "the last checkpoint, the average of the last checkpoints "
                          "and the best-dev checkpoint") + f"{rule}).")
    else:
        out.append(f"- No finished training state in `{Path(t.run_dir) / 'train_state.json'}`; "
                   f"host: {host_description()}.")
    decay = {"linear": "linear", "sqrt": "1 - sqrt"}[t.decay_shape]
    schedule = {
        "rsqrt": "inverse square root after it",
        "budget": f"or {t.warmup_fraction:g} of the budget, then {decay} decay to zero over the "
                  f"last {t.decay_fraction:g} of the budget",
        "rsqrt_cooldown": f"inverse square root after it, times a {decay} decay to zero over "
                          f"the last {t.decay_fraction:g} of the budget",
    }[t.lr_schedule]
    out.append(f"- Recipe (§5): Adam(beta_1={t.beta_1}, beta_2={t.beta_2}, epsilon={t.epsilon}), "
               f"warmup {t.warmup_steps} steps {schedule} (learning-rate scale "
               f"{t.learning_rate_scale}), "
               f"label smoothing {t.label_smoothing}, {cfg.data.token_budget} tokens per batch "
               f"x {t.gradient_accumulation_steps} accumulation, seed {t.seed}"
               + _sampling_text(cfg.data) + _concat_text(cfg.data) + ".")
    return out + [""]


def _sampling_text(data: Any) -> str:
    """``, subword sampling ...`` when training sampled its segmentations, else ``""``."""
    if not data.subword_alpha:
        return ""
    among = ("all segmentations" if data.subword_nbest < 0
             else f"the {data.subword_nbest} best segmentations")
    return (f"; subword regularisation: each training pair segmented anew at each epoch, "
            f"sampled with alpha {data.subword_alpha:g} among {among} (evaluation and the "
            "export use the one best)")


def _concat_text(data: Any) -> str:
    """``; concatenation ...`` when training joined pairs two by two, else ``""``."""
    if not data.concat_fraction:
        return ""
    return ("; data augmentation by concatenation: two consecutive training pairs joined into "
            f"one with probability {data.concat_fraction:g} (evaluation and the export translate "
            "one sentence at a time)")


def _eval_section(cfg: Any, reports: Mapping[str, Any] | None) -> list[str]:
    from aiayn.pipeline.training.metrics import metric_settings

    out = ["## Evaluation (sacreBLEU)", ""]
    try:  # THE choice by target language (what `aiayn evaluate` uses for this config)
        out += [f"Metric settings for target `{cfg.data.target_lang}`: "
                f"{metric_settings(cfg.data.target_lang, cfg.train.bleu_tokenize).describe()}.",
                ""]
    except UserInputError as err:
        out += [f"Metric settings: {err}", ""]
    reports = {k: v for k, v in (reports or {}).items() if isinstance(v, Mapping)}
    if not reports:
        return out + ["Not evaluated yet: run `aiayn evaluate --split dev` and "
                      "`aiayn evaluate --split test`.", ""]
    order = sorted(reports, key=lambda s: (["dev", "test"] + [s]).index(s))
    rows = [(split, _fmt_score(reports[split].get("bleu")), _fmt_score(reports[split].get("chrf")),
             reports[split].get("sentences", "?"), f"`{_tokenizer_of(reports[split])}`")
            for split in order]
    out += [*_table(rows, ("split", "BLEU", "chrF", "sentences", "BLEU tokenizer")), "",
            "Signatures:", "", "```"]
    for split in order:
        for key in ("bleu_signature", "chrf_signature"):
            if reports[split].get(key):
                out.append(f"{split} {key.split('_')[0]}: {reports[split][key]}")
    return out + ["```", ""]


def _tokenizer_of(report: Mapping[str, Any]) -> str:
    """The BLEU tokenizer a report was scored with (from its signature: what was used)."""
    for part in str(report.get("bleu_signature", "")).split("|"):
        if part.startswith("tok:"):
            return part[len("tok:"):]
    return str(report.get("bleu_tokenize", "?"))


def _decode_section(cfg: Any) -> list[str]:
    d, e = cfg.decode, cfg.export
    return ["## Decoding (as served)", "",
            f"Beam search with beam size {d.beam_size} (1 = greedy), length penalty alpha "
            f"{d.length_penalty} (GNMT, ((5+len)/6)^alpha), at most input length + "
            f"{d.max_extra_length} tokens, {d.n_best}-best on the n-best signature; a sentence "
            f"stops by the `{d.stop_rule}` rule (`decode.stop_rule`). Inputs over "
            f"{e.max_input_tokens} subwords are "
            f"{'rejected' if e.on_long_input == 'reject' else 'truncated'} "
            f"(`export.on_long_input={e.on_long_input}`); server batches up to "
            f"{e.max_batch_size} sentences.", ""]


def write_model_card(cfg: Any, path: str | os.PathLike | None = None, *,
                     parameters: int | None = None, vocabulary_size: int | None = None,
                     eval_reports: Mapping[str, Any] | None = None,
                     data_report: Mapping[str, Any] | None = None,
                     train_state: Mapping[str, Any] | None = None,
                     export_info: Mapping[str, Any] | None = None) -> str:
    """The model card of a run as Markdown; also written to ``path`` when given.

    Arguments left as ``None`` are read from the run's files (module docstring); a source that
    does not exist is named in the card instead of failing.

    Args:
      cfg: the run configuration (``aiayn.pipeline.config.Config``).
      path: where to write the card (UTF-8), e.g. ``<export>/assets.extra/model_card.md``.
      parameters: the model's parameter count (default: from ``train_state.json``).
      vocabulary_size: the joint vocabulary's size.
      eval_reports: ``{split: report}`` as written by ``aiayn evaluate`` (``bleu``, ``chrf``,
        ``bleu_signature``, ``chrf_signature``, ``sentences``).
      data_report: the contents of ``<data_dir>/data_report.json``.
      train_state: the contents of ``<run_dir>/train_state.json``.
      export_info: ``model_name`` and ``version`` of the export the card travels with.

    Returns:
      The Markdown text.

    Example:
      >>> print(write_model_card(load_config(["small"])))
    """
    run_dir = Path(cfg.train.run_dir)
    if data_report is None:
        data_report = _read_json(Path(cfg.data.data_dir) / "data_report.json")
    if train_state is None:
        train_state = _read_json(run_dir / "train_state.json")
    if eval_reports is None:
        eval_reports = read_eval_reports(run_dir)
    run_summary = _read_json(run_dir / "summary.json")
    if parameters is None:
        parameters = ((train_state or {}).get("summary") or {}).get("parameters")
    corpus = (((data_report or {}).get("source") or {}).get("corpus")) or cfg.data.corpus
    name = (export_info or {}).get("model_name", cfg.export.model_name)
    title = f"# Model card: `{name}`"
    if (export_info or {}).get("version") is not None:
        title += f" version {export_info['version']}"
    lines = [title, "",
             f"{cfg.data.source_lang} -> {cfg.data.target_lang} translation with a Transformer "
             "(Vaswani et al., 2017, *Attention Is All You Need*), trained by this project "
             f"(preset `{cfg.preset or 'none'}`, run `{run_dir}`). Served as a TensorFlow "
             "SavedModel: signature `serving_default` takes `text` (tf.string [None]) and "
             "returns `translation` and `score`; the tokenizer and beam search run in-graph.", ""]
    lines += _model_section(cfg, parameters, vocabulary_size)
    lines += _data_section(cfg, data_report)
    lines += _training_section(cfg, train_state, run_summary)
    lines += _eval_section(cfg, eval_reports)
    lines += _decode_section(cfg)
    limits = ((BIBLE_LIMITS if corpus == "bible" else GENERIC_LIMITS)
              + (unknown_input_limit(cfg),) + COMMON_LIMITS)
    lines += ["## Known limits", "", *[f"- {item}" for item in limits], ""]
    presets = " ".join(f"--preset {p}" for p in (cfg.preset or "small").split("+"))
    example = ("In the beginning God created the heavens and the earth." if corpus == "bible"
               else EXAMPLES.get(base_language(cfg.data.source_lang),
                                 f"<a sentence in {cfg.data.source_lang}>"))
    lines += ["## Use", "", "```sh",
              f"aiayn serve {presets}    # REST :8501, gRPC :8500",
              f"aiayn translate {presets} \"{example}\"",
              f"aiayn translate {presets} --n-best \"{example}\"   # n-best, unknown-input "
              "warning", "```", ""]
    text = "\n".join(lines)
    if path is not None:
        atomic_write(path, text)
    return text


def export_card_path(export_dir: str | os.PathLike) -> Path:
    return Path(export_dir) / EXTRA_DIR / MODEL_CARD


def read_export_card(export_dir: str | os.PathLike) -> str:
    """The card of an export: a version dir, or a model dir (its highest version).

    Raises:
      UserInputError: no card there (an export made before model cards existed, or not an
        export).
    """
    path = Path(export_dir)
    if not (path / "saved_model.pb").exists():
        versions = sorted(int(p.name) for p in path.glob("*") if p.is_dir() and p.name.isdigit())
        if versions:
            path = path / str(versions[-1])
    card = export_card_path(path)
    if not card.is_file():
        raise UserInputError(f"No model card at {card}. Export again with `aiayn export` (every "
                             "new export carries one), or run `aiayn model-card` without "
                             "--export to build one from the run directory.")
    return card.read_text(encoding="utf-8")

