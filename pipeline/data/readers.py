"""Reading user corpora: the format readers and the per-pair checks.

Formats (``data.format``, or guessed by :func:`detect_format`); :func:`read_corpus` dispatches:

- TSV: ``source<TAB>target`` per line (:func:`read_tsv`).
- Line-aligned text files: a prefix (``data/train`` -> ``data/train.en`` + ``data/train.es``,
  from ``data.source_lang`` / ``data.target_lang``) or two paths joined by a comma
  (:func:`read_text_pair`).
- TFRecord files of ``tf.Example`` with ``source`` / ``target`` bytes features, GZIP or not
  (detected), as TFX ExampleGen writes them: a file, a glob or a directory (:func:`read_tfrecord`).
- ``tfds:<name>[@split]``: a TFDS translation dataset already prepared on disk, never downloaded
  (:func:`read_tfds`).

A UTF-8 byte order mark (U+FEFF) at the start of a text file is dropped, not read into the first
sentence. A directory where a file is expected (a TSV, a line-aligned file) is an error that says
so; a directory is read as TFRecord only when it holds TFRecord files.

Bad input (lines without exactly one tab, invalid UTF-8, empty sides, absurd length ratios)
raises a :class:`CorpusError` that names the file, line (or record), field and the fix; with
``on_error='skip'`` a :class:`Drops` counter drops the pair and counts it by reason instead
(:func:`check_pair` is the shared empty-side and length-ratio check). Files of different line
counts, missing files and malformed records are always errors.
"""

from __future__ import annotations

import dataclasses
import glob as globlib
import os
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from aiayn.pipeline.data.languages import weighted_length
from aiayn.pipeline.errors import UserInputError

# A pair is absurd when its longer side is more than `max_length_ratio` times as long as the
# shorter one, lengths in characters weighted by script (languages.weighted_length: a Han
# character counts 3.5, so real Chinese-English pairs pass); pairs whose longer side is shorter
# than this are never flagged ("Amen."/"Amén.", "谢谢"/"Thanks!").
MIN_LENGTH_FOR_RATIO = 16

Pair = tuple[str, str]
# The UTF-8 encoding of U+FEFF, which some editors write at the start of a file.
UTF8_BOM = b"\xef\xbb\xbf"


class CorpusError(UserInputError):
    """A corpus file is missing or malformed; the message names file, line, field and fix."""


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------

def normalize_side(text: str) -> str:
    """Collapses whitespace (tabs and newlines included) to single spaces and strips."""
    return " ".join(text.split())


@dataclasses.dataclass
class Drops:
    """What to do with a bad pair: raise (``on_error='error'``), or drop and count it by reason
    (``on_error='skip'``)."""

    on_error: str = "error"
    counts: Counter = dataclasses.field(default_factory=Counter)
    examples: dict = dataclasses.field(default_factory=dict)

    def bad(self, reason: str, message: str) -> None:
        """Raises ``message`` in error mode; counts the drop (keeping one example) in skip mode."""
        if self.on_error != "skip":
            raise CorpusError(message)
        self.counts[reason] += 1
        self.examples.setdefault(reason, message)


_SKIP_HINT = "or set data.on_error=skip to drop and count such pairs"


def check_pair(source: str, target: str, where: str, drops: Drops,
               max_length_ratio: float) -> Pair | None:
    """Normalises a pair and applies the empty-side and length-ratio checks.

    Lengths are characters weighted by script (:func:`~aiayn.pipeline.data.languages.
    weighted_length`), so the check means the same for 我爱你 / "I love you" as for "Te amo" /
    "I love you"; ``max_length_ratio=0`` turns it off.

    Returns the normalised pair, or None when it was dropped (skip mode).

    Raises:
      CorpusError: in error mode, for an empty side or an absurd length ratio.
    """
    source, target = normalize_side(source), normalize_side(target)
    for side, text in (("source", source), ("target", target)):
        if not text:
            drops.bad("empty_side",
                      f"{where}: the {side} side is empty. Remove the line or fill it in, "
                      f"{_SKIP_HINT}.")
            return None
    if max_length_ratio <= 0:
        return source, target
    lengths = weighted_length(source), weighted_length(target)
    longer, shorter = max(lengths), min(lengths)
    if longer >= MIN_LENGTH_FOR_RATIO and longer > max_length_ratio * shorter:
        drops.bad("length_ratio",
                  f"{where}: absurd length ratio: source has {len(source)} characters "
                  f"({lengths[0]:g} weighted by script), target {len(target)} ({lengths[1]:g}); "
                  f"ratio {longer / shorter:.1f} > data.max_length_ratio={max_length_ratio:g}, so "
                  f"the sides are probably misaligned. Fix the pair, raise "
                  f"data.max_length_ratio, {_SKIP_HINT}.")
        return None
    return source, target


def _decode(raw: bytes, where: str, field: str, drops: Drops, line_offset: int = -1
            ) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        at = f"byte {err.start} of the {field}" + (
            f" (byte offset {line_offset + err.start} in the file)" if line_offset >= 0 else "")
        drops.bad("invalid_utf8",
                  f"{where}: invalid UTF-8 in the {field} at {at}: {raw[err.start:err.start + 4]!r}"
                  f". Re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), "
                  f"{_SKIP_HINT}.")
        return None


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(1-based line number, byte offset, raw line without the newline) of a file; a leading
    UTF-8 byte order mark is not part of the first line (offsets still count it)."""
    data = path.read_bytes()
    offset = 0
    if data.startswith(UTF8_BOM):
        data, offset = data[len(UTF8_BOM):], len(UTF8_BOM)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start another
    for number, raw in enumerate(lines, start=1):
        yield number, offset, raw[:-1] if raw.endswith(b"\r") else raw
        offset += len(raw) + 1


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _looks_like_tfrecord(path: Path) -> bool:
    """A TFRecord file by its name, its GZIP magic or a valid first record header (the length and
    its masked CRC-32C, as TFRecordWriter writes them)."""
    name = path.name.lower()
    if "tfrecord" in name or name.endswith((".gz", ".tfr")):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    if head[:2] == b"\x1f\x8b":
        return True
    if len(head) < 12:
        return False
    crc = _crc32c(head[:8])
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return struct.unpack("<I", head[8:12])[0] == masked


def tfrecord_files(directory: str | os.PathLike) -> list[Path]:
    """The TFRecord files under a directory (what :func:`read_tfrecord` would read), sorted."""
    return [p for p in expand_files(str(directory)) if _looks_like_tfrecord(p)]


def _directory_error(path: Path, what: str) -> CorpusError:
    """A directory given where a file is expected: say so, and how to give TFRecord shards."""
    shards = tfrecord_files(path)
    if shards:
        parents = {p.parent for p in shards}
        suffixes = {"".join(p.suffixes[-2:]) for p in shards}
        folder = parents.pop() if len(parents) == 1 else path
        pattern = f"{folder}/*{suffixes.pop() if len(suffixes) == 1 else ''}"
        hint = (f" It holds {len(shards)} TFRecord file(s): to read them, set data.format=tfrecord"
                f" (or auto), or give a glob of the shards, e.g. data.corpus='{pattern}'.")
    else:
        hint = (" Give the file's path. (A directory is read only as TFRecord shards, and this "
                "one holds none.)")
    return CorpusError(f"{what} {str(path)!r} is a directory, but a file was expected (a TSV "
                       "file, or one line-aligned text file per language)." + hint)


def _require_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise _directory_error(path, what)
    if not path.is_file():
        raise CorpusError(f"{what} {str(path)!r} does not exist (working directory: "
                          f"{os.getcwd()}). Check data.corpus / data.dev_corpus / "
                          "data.test_corpus.")


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------

def read_tsv(path: str | os.PathLike, drops: Drops | None = None,
             max_length_ratio: float = 0.0) -> list[Pair]:
    """Reads ``source<TAB>target`` lines.

    Raises:
      CorpusError: missing file; in error mode also a line without exactly one tab, invalid
        UTF-8, an empty side or an absurd length ratio (file, line and fix in the message).
    """
    path = Path(path)
    _require_file(path, "TSV corpus")
    drops = drops or Drops()
    pairs = []
    for number, offset, raw in _lines(path):
        where = f"{path}:{number}"
        tabs = raw.count(b"\t")
        if tabs != 1:
            drops.bad("bad_tsv_line",
                      f"{where}: expected exactly one tab (source<TAB>target), found {tabs}. "
                      "Replace tabs inside a side by spaces, remove blank lines, "
                      f"{_SKIP_HINT}.")
            continue
        text = _decode(raw, where, "line", drops, offset)
        if text is None:
            continue
        source, target = text.split("\t")
        pair = check_pair(source, target, where, drops, max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def read_text_pair(source_path: str | os.PathLike, target_path: str | os.PathLike,
                   drops: Drops | None = None, max_length_ratio: float = 0.0) -> list[Pair]:
    """Reads two line-aligned files (line n of one translates line n of the other).

    Raises:
      CorpusError: missing file or different line counts (always); in error mode also invalid
        UTF-8, an empty side or an absurd length ratio.
    """
    source_path, target_path = Path(source_path), Path(target_path)
    _require_file(source_path, "Source file")
    _require_file(target_path, "Target file")
    drops = drops or Drops()
    src, tgt = list(_lines(source_path)), list(_lines(target_path))
    if len(src) != len(tgt):
        raise CorpusError(
            f"Line-aligned files differ in length: {source_path} has {len(src)} lines, "
            f"{target_path} has {len(tgt)}. Line n of one must translate line n of the other; "
            "re-export them together (and check for stray newlines inside a sentence).")
    pairs = []
    for (number, off_s, raw_s), (_, off_t, raw_t) in zip(src, tgt):
        s = _decode(raw_s, f"{source_path}:{number}", "line", drops, off_s)
        if s is None:
            continue
        t = _decode(raw_t, f"{target_path}:{number}", "line", drops, off_t)
        if t is None:
            continue
        pair = check_pair(s, t, f"{source_path}:{number} / {target_path}:{number}", drops,
                          max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def expand_files(pattern: str) -> list[Path]:
    """The files a pattern names, sorted: every non-hidden file under a directory, or a glob's."""
    path = Path(pattern)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        files = sorted(Path(p) for p in globlib.glob(pattern) if Path(p).is_file())
    return files


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def read_tfrecord(pattern: str, drops: Drops | None = None, max_length_ratio: float = 0.0,
                  source_key: str = "source", target_key: str = "target") -> list[Pair]:
    """Reads ``tf.Example`` records with ``source`` / ``target`` bytes features.

    ``pattern`` is a file, a glob or a directory (TFX ExampleGen output, e.g.
    ``.../Split-train``); each file's GZIP compression is detected from its first bytes.

    Raises:
      CorpusError: no files, a corrupt file, a record without the features (in any mode); in
        error mode also invalid UTF-8, an empty side or an absurd length ratio.
    """
    files = expand_files(pattern)
    if not files:
        raise CorpusError(f"No TFRecord files match {pattern!r} (working directory: "
                          f"{os.getcwd()}). Give a file, a glob or a directory.")
    import tensorflow as tf  # lazily: the text readers stay light

    drops = drops or Drops()
    pairs = []
    for path in files:
        compression = "GZIP" if _is_gzip(path) else ""
        dataset = tf.data.TFRecordDataset(str(path), compression_type=compression)
        try:
            for number, record in enumerate(dataset.as_numpy_iterator(), start=1):
                where = f"{path}: record {number}"
                try:
                    example = tf.train.Example.FromString(record)
                except Exception as err:  # protobuf's DecodeError
                    raise CorpusError(f"{where}: not a tf.Example ({err}). Write tf.train.Example "
                                      "records with bytes features "
                                      f"{source_key!r} and {target_key!r}.") from None
                sides = []
                for key in (source_key, target_key):
                    feature = example.features.feature.get(key)
                    if feature is None or not feature.bytes_list.value:
                        present = sorted(example.features.feature.keys())
                        raise CorpusError(
                            f"{where}: no bytes feature {key!r} (features present: {present}). "
                            f"Each tf.Example needs bytes features {source_key!r} and "
                            f"{target_key!r}, as TFX ExampleGen writes for a two-column CSV.")
                    sides.append(_decode(feature.bytes_list.value[0], where,
                                         f"{key!r} feature", drops))
                if sides[0] is None or sides[1] is None:
                    continue
                pair = check_pair(sides[0], sides[1], where, drops, max_length_ratio)
                if pair:
                    pairs.append(pair)
        except tf.errors.DataLossError as err:
            raise CorpusError(f"{path}: corrupt TFRecord file ({err.message.splitlines()[0]}). "
                              "Re-write it, or remove it from the pattern.") from None
    return pairs


def read_tfds(spec: str, source_lang: str, target_lang: str, drops: Drops | None = None,
              max_length_ratio: float = 0.0, default_split: str = "train") -> list[Pair]:
    """Reads ``tfds:<name>[@split]`` from data already prepared on disk (never downloads).

    The data directory is ``$TFDS_DATA_DIR`` or TFDS's default (``~/tensorflow_datasets``).
    Features are the language codes (``data.source_lang`` / ``data.target_lang``), as in TFDS's
    translation datasets (``tfds:wmt19_translate/zh-en`` has ``zh`` and ``en``). The split may
    be a TFDS slice (``@train[:1000000]``, ``@train[:10%]``): every pair is held in memory.

    Raises:
      CorpusError: tensorflow_datasets missing, dataset not prepared, unknown split or language.
    """
    name = spec[len("tfds:"):] if spec.startswith("tfds:") else spec
    name, _, split = name.partition("@")
    split = split or default_split
    try:
        import tensorflow_datasets as tfds  # optional dependency
    except ImportError:
        raise CorpusError(
            f"data.corpus={spec!r} needs tensorflow_datasets, which is not installed: "
            "`pip install 'aiayn[tfds]'` (or tensorflow-datasets), then prepare the dataset with "
            f"`tfds build {name}` (this project never downloads data itself).") from None
    data_dir = os.environ.get("TFDS_DATA_DIR")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:
        raise CorpusError(f"TFDS dataset {name!r}: {err}. Check the name "
                          "(e.g. tfds:wmt14_translate/de-en).") from None
    is_prepared = getattr(builder, "is_prepared", None)
    prepared = is_prepared() if callable(is_prepared) else (
        Path(builder.data_dir) / "dataset_info.json").exists()
    if not prepared:
        raise CorpusError(
            f"TFDS dataset {name!r} is not prepared in {builder.data_dir}. Prepare it first "
            f"(`tfds build {name}`, or download_and_prepare() on a machine with network), or set "
            "TFDS_DATA_DIR to where it is; this project never downloads data itself.")
    if split.split("[", 1)[0] not in builder.info.splits:
        raise CorpusError(f"TFDS dataset {name!r} has no split {split!r}; splits: "
                          f"{sorted(builder.info.splits.keys())}. Use tfds:{name}@<split> (a "
                          "slice such as @train[:1000000] works too).")
    keys = list(builder.info.features.keys())
    for lang in (source_lang, target_lang):
        if lang not in keys:
            raise CorpusError(f"TFDS dataset {name!r} has no feature {lang!r} (features: {keys}). "
                              "Set data.source_lang / data.target_lang to two of them.")
    drops = drops or Drops()
    pairs = []
    for number, ex in enumerate(tfds.as_numpy(builder.as_dataset(split=split)), start=1):
        where = f"tfds:{name}@{split}: example {number}"
        s = _decode(ex[source_lang], where, f"{source_lang!r} feature", drops)
        t = _decode(ex[target_lang], where, f"{target_lang!r} feature", drops)
        if s is None or t is None:
            continue
        pair = check_pair(s, t, where, drops, max_length_ratio)
        if pair:
            pairs.append(pair)
    return pairs


def detect_format(spec: str, source_lang: str = "en", target_lang: str = "es") -> str:
    """Guesses ``tsv``, ``text``, ``tfrecord`` or ``tfds`` from a corpus spec."""
    if spec.startswith("tfds:"):
        return "tfds"
    if "," in spec:
        return "text"
    path = Path(spec)
    if any(ch in spec for ch in "*?["):
        return "tfrecord"
    if path.is_dir():  # TFRecord shards (e.g. ExampleGen's Split-train/), or a mistake
        if tfrecord_files(path):
            return "tfrecord"
        raise _directory_error(path, "Corpus")
    if path.is_file():
        name = path.name.lower()
        if "tfrecord" in name or name.endswith((".gz", ".tfr")):
            return "tfrecord"
        return "tsv"
    if Path(f"{spec}.{source_lang}").exists() or Path(f"{spec}.{target_lang}").exists():
        return "text"  # (a directory there is named by the reader)
    raise CorpusError(
        f"Corpus {spec!r} not found (working directory: {os.getcwd()}): no such file, directory "
        f"or glob, and no {spec}.{source_lang} / {spec}.{target_lang}. Give a TSV file, a prefix "
        "of line-aligned files, two paths joined by a comma, TFRecord files, tfds:<name>, or "
        "'bible'.")


def _text_paths(spec: str, source_lang: str, target_lang: str) -> tuple[str, str]:
    if "," in spec:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise CorpusError(f"Corpus {spec!r}: give exactly two paths joined by a comma "
                              "(source,target).")
        return parts[0], parts[1]
    return f"{spec}.{source_lang}", f"{spec}.{target_lang}"


def read_corpus(spec: str, fmt: str = "auto", *, source_lang: str = "en",
                target_lang: str = "es", drops: Drops | None = None,
                max_length_ratio: float = 0.0, tfds_split: str = "train") -> list[Pair]:
    """Reads a user corpus in any supported format (see the module docstring)."""
    drops = drops or Drops()
    fmt = detect_format(spec, source_lang, target_lang) if fmt == "auto" else fmt
    if fmt == "tsv":
        return read_tsv(spec, drops, max_length_ratio)
    if fmt == "text":
        return read_text_pair(*_text_paths(spec, source_lang, target_lang), drops=drops,
                              max_length_ratio=max_length_ratio)
    if fmt == "tfrecord":
        return read_tfrecord(spec, drops, max_length_ratio)
    if fmt == "tfds":
        return read_tfds(spec, source_lang, target_lang, drops, max_length_ratio, tfds_split)
    raise CorpusError(f"Unknown data.format {fmt!r}; use auto, tsv, text, tfrecord or tfds.")
