"""tf.data input pipelines: prepared TSV -> token-budget batches of dict features for model.fit.

Training::

    lines -> tokenise (batched, parallel) -> length filter -> cache (tokenised once)
          -> seeded shuffle -> repeat [-> join a share of the pairs two by two]
          -> 2-D length buckets, token budget per batch, pad to the bucket boundaries
          -> seeded batch shuffle -> prefetch

(With subword sampling, ``data.subword_alpha`` > 0, nothing is cached: the lines are shuffled
and repeated first, and every epoch segments them anew.)

Before that pipeline is built, :func:`length_filter_counts` tokenises the file(s) once (no
repeat) and counts what the length filter keeps and drops; when it keeps nothing,
:func:`make_train_dataset` raises at once (a pipeline that repeats before an all-dropping filter
would otherwise look for a batch forever).

Every batch is ``(features, labels)``:

    features["encoder_token_ids"]     int32 (batch_size, src_len)  source ids, pad_id after the end
    features["encoder_padding_mask"]  bool  (batch_size, src_len)  True on real tokens
    features["decoder_token_ids"]     int32 (batch_size, tgt_len)  BOS + target
    features["decoder_padding_mask"]  bool  (batch_size, tgt_len)  True on real tokens
    labels                            int32 (batch_size, tgt_len)  target + EOS (shifted by one)

Lengths count special tokens: ``tgt_len`` of a pair is ``len(target) + 1``; the source gets no
BOS/EOS (as ``SubwordTokenizer.featurize_source``, the featuriser of the exported signature).

Bucketing (§5.1: "sentence pairs were batched together by approximate sequence length"). A pair
goes to the bucket ``(Bs, Bt)``: the smallest boundary of ``data.bucket_boundaries`` at or above
its source length and its target length. Each side is padded to its bucket boundary and a bucket
holds ``token_budget // max(Bs, Bt)`` pairs, so every training batch shape comes from a small fixed
set (XLA compiles each once) and ``batch_size * max(src_len, tgt_len) <= token_budget``. Bucketing
both sides separately (not only by the longer one) is what lifts padding efficiency above 0.90:
on lognormal verse lengths, 1-D buckets padded to the boundary give about 0.83 with the default
boundaries, 2-D buckets about 0.90, and 0.93 with boundaries every 4 tokens up to 32 and every 8
up to 128 (`bench/input_pipeline.py` measures the real corpus).

Training drops pairs longer than ``data.max_length`` (:func:`filter_by_length`) instead of
truncating them. Everything that translates (evaluation, dev BLEU, the export, the server) uses
``SubwordTokenizer.featurize_source`` instead, with the one ``source_limit``; its source side is
the same tokenisation as here (the model's normaliser, no BOS/EOS), so a pair kept for training
is featurised exactly as evaluation and serving featurise it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from aiayn.models.tokenizer import SubwordTokenizer
from aiayn.pipeline.config import DataConfig
from aiayn.pipeline.errors import UserInputError

PathLike = str | os.PathLike
Transformation = Callable[[tf.data.Dataset], tf.data.Dataset]

FEATURE_KEYS = ("encoder_token_ids", "encoder_padding_mask",
                "decoder_token_ids", "decoder_padding_mask")
# Lines tokenised per call of the SentencePiece op (one op call per batch is much faster than
# one per line).
TOKENIZE_BATCH_SIZE = 256
# Batches shuffled after bucketing, so consecutive steps do not follow bucket fill order.
BATCH_SHUFFLE_BUFFER = 16
# The resolution of `concatenate_pairs`'s draws: a probability is compared in 2**-20 steps.
JOIN_DRAW_LEVELS = 2**20
# Consecutive pairs that one call of `concatenate_pairs`'s join handles.
JOIN_GROUP_PAIRS = 32
# Lines per batch of the one counting pass of `length_filter_counts`.
COUNT_BATCH_SIZE = 1024


def _paths(path_or_paths: PathLike | Sequence[PathLike]) -> list[str]:
    if isinstance(path_or_paths, (str, os.PathLike)):
        path_or_paths = [path_or_paths]
    paths = [os.fspath(p) for p in path_or_paths]
    if not paths:
        raise ValueError("No input file given: pass a path or a list of paths to prepared TSVs.")
    missing = [p for p in paths if not tf.io.gfile.exists(p)]
    if missing:
        raise FileNotFoundError(
            f"Prepared data not found: {', '.join(missing)}. Create it with `aiayn data` "
            "(or `make data`).")
    return paths


def effective_boundaries(bucket_boundaries: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The padded lengths actually used: boundaries up to `max_length`, then `max_length`.

    Args:
      bucket_boundaries: increasing positive lengths (``data.bucket_boundaries``).
      max_length: the longest sequence kept, special tokens included.

    Returns:
      Strictly increasing boundaries whose last element is `max_length`.

    Raises:
      ValueError: `max_length` is below 1.
    """
    if max_length < 1:
        raise ValueError(f"`max_length` must be at least 1. Received: {max_length}.")
    kept = sorted({int(b) for b in bucket_boundaries if 0 < int(b) < max_length})
    return tuple(kept) + (int(max_length),)


def featurize_pairs(tokenizer: SubwordTokenizer, alpha: float = 0.0,
                    nbest_size: int = -1) -> Transformation:
    """Training's featuriser: TSV lines -> unpadded examples (over-long pairs are kept here and
    dropped by :func:`filter_by_length`).

    Lines are tokenised `TOKENIZE_BATCH_SIZE` at a time in a parallel, order-preserving map.
    Blank lines are skipped.

    Args:
      tokenizer: the :class:`SubwordTokenizer` (special ids are read from it).
      alpha, nbest_size: subword regularisation of both sides (``data.subword_alpha``,
        ``data.subword_nbest``: :meth:`SubwordTokenizer.tokenize`); alpha 0, the default and
        the only value outside training, is the one segmentation evaluation and the export use.

    Returns:
      A transformation for `dataset.apply` from a dataset of `tf.string` lines
      (`source<TAB>target`) to a dataset of `(features, labels)` with unpadded shapes: source
      features `(src_len,)`, decoder features and labels `(tgt_len,)`.

    Raises:
      tf.errors.InvalidArgumentError: (on iteration) a line has no tab or more than one.
    """
    bos, eos = tokenizer.bos_id, tokenizer.eos_id

    def featurize(lines: tf.Tensor) -> tuple[dict[str, tf.RaggedTensor], tf.RaggedTensor]:
        # lines: (n,) tf.string
        fields, sides = _split_lines(lines)
        check = tf.debugging.assert_equal(
            fields, tf.constant(2, tf.int64),
            message="Each line must be `source<TAB>target` with exactly one tab; rebuild the "
                    "prepared data with `aiayn data`.")
        with tf.control_dependencies([check]):
            # (n, (src_len)) as featurize_source, (n, (tgt_len - 1))
            source = tokenizer.tokenize(sides[:, 0], alpha, nbest_size)
            target = tokenizer.tokenize(sides[:, 1], alpha, nbest_size)
        n = tf.shape(lines)[0]
        bos_column = tf.RaggedTensor.from_tensor(tf.fill([n, 1], tf.constant(bos, tf.int32)))
        eos_column = tf.RaggedTensor.from_tensor(tf.fill([n, 1], tf.constant(eos, tf.int32)))
        decoder_ids = tf.concat([bos_column, target], axis=1)  # (n, (tgt_len)) BOS + target
        labels = tf.concat([target, eos_column], axis=1)  # (n, (tgt_len)) target + EOS
        features = {
            "encoder_token_ids": source,
            "encoder_padding_mask": tf.ones_like(source, dtype=tf.bool),
            "decoder_token_ids": decoder_ids,
            "decoder_padding_mask": tf.ones_like(decoder_ids, dtype=tf.bool),
        }
        return features, labels

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        dataset = dataset.filter(lambda line: tf.strings.length(line) > 0)
        dataset = dataset.batch(TOKENIZE_BATCH_SIZE)
        dataset = dataset.map(featurize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # Unbatching ragged rows gives 0-ragged-rank specs; make them plain tensors (`(len,)`).
        return dataset.unbatch().map(_as_dense)

    return apply


def _split_lines(lines: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`source<TAB>target` lines -> (fields per line int64 (n,), sides tf.string (n, 2)). Lines
    without exactly one tab give padded or cut sides: callers check the field counts."""
    fields = tf.strings.split(lines, "\t")  # (n, (num_fields))
    return fields.row_lengths(), fields.to_tensor(shape=[None, 2])


def _as_dense(features, labels):
    def dense(value):
        return value.to_tensor() if isinstance(value, tf.RaggedTensor) else tf.identity(value)

    return {key: dense(value) for key, value in features.items()}, dense(labels)


def _lengths(features: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.shape(features["encoder_token_ids"])[0], tf.shape(features["decoder_token_ids"])[0]


def filter_by_length(max_length: int) -> Transformation:
    """Drops pairs whose source is empty or longer than `max_length`, or whose decoder side
    (BOS + target) is longer than `max_length` (training only).

    Args:
      max_length: the longest sequence kept, special tokens included.

    Returns:
      A transformation for `dataset.apply` over unpadded `(features, labels)` examples.

    Raises:
      ValueError: `max_length` is below 1.
    """
    if max_length < 1:
        raise ValueError(f"`max_length` must be at least 1. Received: {max_length}.")

    def keep(features, labels):
        src_len, tgt_len = _lengths(features)
        return tf.logical_and(tf.logical_and(src_len >= 1, src_len <= max_length),
                              tgt_len <= max_length)

    return lambda dataset: dataset.filter(keep)


def _appended_rows(src_lengths: tf.Tensor, tgt_lengths: tf.Tensor, n: tf.Tensor,
                   draws: tf.Tensor, threshold: tf.Tensor, max_length: int) -> tf.Tensor:
    """int64 ``(n,)``: 1 where row r is the second of a joined pair, appended to row r - 1 (its
    pair's draw is below `threshold` and the joined pair fits `max_length`), else 0."""
    firsts = tf.range(n // 2, dtype=tf.int64) * 2  # an odd last row has no pair
    seconds = firsts + 1

    def pair_total(lengths):
        return tf.gather(lengths, firsts) + tf.gather(lengths, seconds)

    join = (draws[:n // 2] % JOIN_DRAW_LEVELS < threshold) & (
        pair_total(src_lengths) <= max_length) & (pair_total(tgt_lengths) - 1 <= max_length)
    return tf.scatter_nd(seconds[:, None], tf.cast(join, tf.int64), [n])


def _without(values: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
    """`values` (1-D) less those at `positions` (int64)."""
    dropped = tf.scatter_nd(positions[:, None], tf.ones_like(positions), tf.shape(
        values, out_type=tf.int64))
    return tf.boolean_mask(values, tf.equal(dropped, 0))


def _join_rows(rows, draws: tf.Tensor, threshold: tf.Tensor, max_length: int):
    """One group of :func:`concatenate_pairs`: ragged ``(features, labels)`` rows and one draw
    a pair -> the rows with the pairs drawn (and fitting) joined, ragged."""
    features, labels = rows  # ragged (n, (len)) each; rows 2i and 2i + 1 are pair i
    source, decoder = features["encoder_token_ids"], features["decoder_token_ids"]
    src_lengths, tgt_lengths = source.row_lengths(), decoder.row_lengths()
    n = tf.size(src_lengths, out_type=tf.int64)
    appended = _appended_rows(src_lengths, tgt_lengths, n, draws, threshold, max_length)
    out_row = tf.cumsum(1 - appended) - 1
    out_rows = n - tf.reduce_sum(appended)

    def lengths(row_lengths):
        return tf.math.unsorted_segment_sum(row_lengths, out_row, out_rows)

    # Joined, the second decoder row loses its BOS (its first value) and the first label
    # row its EOS (the value before the second row's start): one value less a joined pair.
    starts = tf.gather(decoder.row_starts(), tf.where(appended > 0)[:, 0])
    tgt_rows = lengths(tgt_lengths - appended)
    joined_source = tf.RaggedTensor.from_row_lengths(source.values, lengths(src_lengths))
    joined_decoder = tf.RaggedTensor.from_row_lengths(_without(decoder.values, starts),
                                                      tgt_rows)
    joined = {
        "encoder_token_ids": joined_source,
        "encoder_padding_mask": tf.ones_like(joined_source, dtype=tf.bool),
        "decoder_token_ids": joined_decoder,
        "decoder_padding_mask": tf.ones_like(joined_decoder, dtype=tf.bool),
    }
    return joined, tf.RaggedTensor.from_row_lengths(_without(labels.values, starts - 1),
                                                    tgt_rows)


def concatenate_pairs(fraction: float, max_length: int, seed: int) -> Transformation:
    """Joins a share of the training examples two by two into longer pairs (data
    augmentation by concatenation: Nguyen et al., 2021; Kondo et al., 2021).

    The shuffled stream is taken two examples at a time. With probability `fraction`, and
    when the joined pair still fits `max_length`, the two become one example: source ``s1 +
    s2``, decoder side ``BOS + t1 + t2``, labels ``t1 + t2 + EOS`` (no EOS or BOS inside: the
    pieces of the second sentence start a word, as after a space). Otherwise both pass
    unchanged. Nothing is dropped: every token of the input stream is in the output, in order.
    The draws are seeded, so the same seed gives the same examples.

    Args:
      fraction: the probability that two consecutive examples are joined, in [0, 1].
      max_length: the longest joined sequence (``data.max_length``, special tokens included).
      seed: the seed of the draws.

    Returns:
      A transformation for `dataset.apply` over unpadded `(features, labels)` examples.
    """
    threshold = tf.constant(round(float(fraction) * JOIN_DRAW_LEVELS), tf.int64)

    def join_rows(rows, draws):
        return _join_rows(rows, draws, threshold, max_length)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        # JOIN_GROUP_PAIRS pairs a call: one op graph over many pairs costs the pipeline's
        # thread far less than one a pair. Pair i of the stream takes draw i, as one a call did.
        groups = dataset.ragged_batch(2 * JOIN_GROUP_PAIRS)
        draws = tf.data.Dataset.random(seed=seed).batch(JOIN_GROUP_PAIRS)
        joined = tf.data.Dataset.zip(groups, draws).map(join_rows)
        return joined.unbatch().map(_as_dense)

    return apply


def length_filter_counts(path_or_paths: PathLike | Sequence[PathLike],
                         tokenizer: SubwordTokenizer, data_cfg: DataConfig) -> dict[str, Any]:
    """What the training length filter keeps of the prepared TSV(s): one pass, no repeat.

    Lines are tokenised `COUNT_BATCH_SIZE` at a time exactly as :func:`featurize_pairs` does
    (blank lines skipped, no BOS/EOS on the source, BOS + target on the decoder side), and
    counted as :func:`filter_by_length` decides.

    Args:
      path_or_paths: prepared TSV file(s), one `source<TAB>target` pair per line.
      tokenizer: the :class:`SubwordTokenizer` training uses.
      data_cfg: ``cfg.data`` (`max_length`).

    Returns:
      A dict: `max_length`, `pairs` (non-blank lines), `kept`, `dropped_too_long` (source or
      decoder side over `max_length`), `dropped_empty` (a source with no tokens), and over all
      pairs `shortest_pair` / `longest_pair` (the longer side's length, BOS/EOS counted as the
      filter counts them; None without pairs), `longest_source`, `longest_target` (the decoder
      side: BOS + target), `files`.

    Raises:
      FileNotFoundError: an input file is missing (run `aiayn data`).
      UserInputError: a line without exactly one tab (file and line named).
    """
    paths = _paths(path_or_paths)
    max_length = int(data_cfg.max_length)

    def lengths(lines: tf.Tensor):
        fields, sides = _split_lines(lines)
        source = tokenizer.tokenize(sides[:, 0])
        target = tokenizer.tokenize(sides[:, 1])
        return (fields, tf.strings.length(lines), tf.cast(source.row_lengths(), tf.int64),
                tf.cast(target.row_lengths(), tf.int64) + 1)

    counts = dict(max_length=max_length, pairs=0, kept=0, dropped_too_long=0, dropped_empty=0,
                  shortest_pair=None, longest_pair=None, longest_source=0, longest_target=0,
                  files=paths)
    for path in paths:
        dataset = (tf.data.TextLineDataset(path).batch(COUNT_BATCH_SIZE)
                   .map(lengths, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                   .prefetch(tf.data.AUTOTUNE))
        first_line = 1
        for fields, chars, src, tgt in dataset.as_numpy_iterator():
            real = chars > 0  # blank lines are skipped, as featurize_pairs skips them
            bad = np.flatnonzero(real & (fields != 2))
            if bad.size:
                raise UserInputError(
                    f"{path}:{first_line + int(bad[0])}: expected `source<TAB>target` with "
                    f"exactly one tab, found {int(fields[bad[0]]) - 1}. Rebuild the prepared "
                    "data with `aiayn data`.")
            first_line += len(chars)
            src, tgt = src[real], tgt[real]
            if not src.size:
                continue
            pair = np.maximum(src, tgt)
            empty = src < 1
            too_long = ~empty & ((src > max_length) | (tgt > max_length))
            counts["pairs"] += int(src.size)
            counts["dropped_empty"] += int(empty.sum())
            counts["dropped_too_long"] += int(too_long.sum())
            counts["kept"] += int((~empty & ~too_long).sum())
            low, high = int(pair.min()), int(pair.max())
            counts["shortest_pair"] = low if counts["shortest_pair"] is None else min(
                counts["shortest_pair"], low)
            counts["longest_pair"] = max(counts["longest_pair"] or 0, high)
            counts["longest_source"] = max(counts["longest_source"], int(src.max()))
            counts["longest_target"] = max(counts["longest_target"], int(tgt.max()))
    return counts


def _no_pair_fits(counts: dict[str, Any]) -> UserInputError:
    files = ", ".join(counts["files"])
    if not counts["pairs"]:
        return UserInputError(f"{files} holds no sentence pairs, so there is nothing to train on. "
                              "Rebuild the prepared data with `aiayn data`.")
    max_length = counts["max_length"]
    if not counts["dropped_too_long"]:
        return UserInputError(
            f"None of the {counts['pairs']} pairs of {files} can be trained on: every source "
            "side tokenises to nothing. Check the corpus and the vocabulary (`aiayn data`, "
            "`aiayn vocab`).")
    return UserInputError(
        f"No training pair fits data.max_length={max_length}: all {counts['pairs']} pairs of "
        f"{files} are dropped ({counts['dropped_too_long']} too long, {counts['dropped_empty']} "
        f"with an empty source); pair lengths (tokens of the longer side, BOS/EOS counted) range "
        f"from {counts['shortest_pair']} to {counts['longest_pair']}. Raise data.max_length to at "
        f"least {counts['shortest_pair']} (e.g. --set data.max_length={counts['longest_pair']}; "
        "data.token_budget must be at least as large).")


def padding_values(pad_id: int) -> tuple[dict[str, Any], Any]:
    """``padded_batch`` values for training's ``(features, labels)``: ``pad_id``, masks False."""
    pad = tf.constant(pad_id, tf.int32)
    return ({"encoder_token_ids": pad, "encoder_padding_mask": False,
             "decoder_token_ids": pad, "decoder_padding_mask": False}, pad)


def batch_by_token_budget(boundaries: Sequence[int], token_budget: int, pad_id: int,
                          drop_remainder: bool = True) -> Transformation:
    """Groups examples into 2-D length buckets and batches each to a token budget.

    A pair of source length `s` and decoder length `t` goes to bucket `(Bs, Bt)`, the smallest
    boundaries with `Bs >= s` and `Bt >= t`. Its batches hold `token_budget // max(Bs, Bt)` pairs,
    the source padded to `Bs` and the decoder side to `Bt` with `pad_id` (masks with False).
    Similar to OpenNMT-tf's token batching, but with padded lengths from a fixed set.

    Args:
      boundaries: strictly increasing padded lengths; the last must be at least every example's
        length (see :func:`effective_boundaries`).
      token_budget: the most `batch_size * max(src_len, tgt_len)` of a batch.
      pad_id: the tokenizer's pad id.
      drop_remainder: drop each bucket's last incomplete batch (training repeats forever, so
        none is lost; it keeps batch sizes fixed).

    Returns:
      A transformation for `dataset.apply` from unpadded `(features, labels)` examples to
      batches: `(batch_size, Bs)` source features, `(batch_size, Bt)` decoder features and labels.

    Raises:
      ValueError: `boundaries` is empty or not strictly increasing, or `token_budget` is smaller
        than the largest boundary (a batch could not hold one pair).
    """
    bounds = [int(b) for b in boundaries]
    if not bounds or bounds != sorted(set(bounds)) or bounds[0] < 1:
        raise ValueError(f"`boundaries` must be strictly increasing positive integers. "
                         f"Received: {boundaries}.")
    if token_budget < bounds[-1]:
        raise ValueError(
            f"`token_budget` ({token_budget}) must be at least the largest boundary "
            f"({bounds[-1]}) so that the longest pair fits in a batch; raise "
            "`data.token_budget` or lower `data.max_length`.")
    num = len(bounds)
    bounds_tensor = tf.constant(bounds, tf.int32)
    # Batch size of each 2-D bucket, flattened as key = i * num + j.
    sizes = tf.constant([token_budget // max(bi, bj) for bi in bounds for bj in bounds], tf.int64)

    def key_fn(features, labels):
        src_len, tgt_len = _lengths(features)
        i = tf.searchsorted(bounds_tensor, tf.reshape(src_len, [1]), side="left")[0]
        j = tf.searchsorted(bounds_tensor, tf.reshape(tgt_len, [1]), side="left")[0]
        return tf.cast(i * num + j, tf.int64)

    def window_size_fn(key):
        return sizes[key]

    def reduce_fn(key, window):
        src_pad = tf.cast(bounds_tensor[key // num], tf.int64)
        tgt_pad = tf.cast(bounds_tensor[key % num], tf.int64)
        shapes = ({"encoder_token_ids": [src_pad], "encoder_padding_mask": [src_pad],
                   "decoder_token_ids": [tgt_pad], "decoder_padding_mask": [tgt_pad]}, [tgt_pad])
        return window.padded_batch(sizes[key], padded_shapes=shapes,
                                   padding_values=padding_values(pad_id),
                                   drop_remainder=drop_remainder)

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.group_by_window(key_func=key_fn, reduce_func=reduce_fn,
                                       window_size_func=window_size_fn)

    return apply


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True
    return options


def _shuffled_examples(lines: tf.data.Dataset, tokenizer: SubwordTokenizer,
                       data_cfg: DataConfig, seed: int) -> tf.data.Dataset:
    """Lines -> an endless, seeded, reshuffled-each-epoch stream of unpadded examples.

    With one segmentation (``subword_alpha`` 0) the file is tokenised once, in the first
    epoch, and its examples are kept in memory (``cache``): on a 2-core CPU tokenising every
    epoch again took 5-10% of each training step from the model (docs/RECIPE.md,
    "Throughput"). With subword sampling every epoch must segment anew, so the lines are
    shuffled and tokenised each epoch.
    """
    shuffle_buffer = max(1, data_cfg.shuffle_buffer)
    featurize = featurize_pairs(tokenizer, data_cfg.subword_alpha, data_cfg.subword_nbest)
    if data_cfg.subword_alpha:
        # Shuffle lines (cheap strings) before tokenising; reshuffled each epoch, seeded.
        dataset = lines.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        return dataset.repeat().apply(featurize).apply(filter_by_length(data_cfg.max_length))
    dataset = lines.apply(featurize).apply(filter_by_length(data_cfg.max_length)).cache()
    return dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()


def make_train_dataset(path_or_paths: PathLike | Sequence[PathLike],
                       tokenizer: SubwordTokenizer, data_cfg: DataConfig,
                       seed: int | None = None,
                       length_counts: dict[str, Any] | None = None) -> tf.data.Dataset:
    """The training pipeline: shuffled, repeated, token-budget batches of dict features.

    Args:
      path_or_paths: prepared TSV file(s), one `source<TAB>target` pair per line.
      tokenizer: the :class:`SubwordTokenizer` (the same object the export uses).
      data_cfg: ``cfg.data``: `max_length`, `token_budget`, `bucket_boundaries`,
        `shuffle_buffer`, `seed`.
      seed: the shuffle seed; default `data_cfg.seed`. The same seed gives the same batches in
        the same order; the order changes between epochs. With subword sampling
        (`data_cfg.subword_alpha` > 0) the same lines in the same order, segmented anew each
        time by SentencePiece's own generator, which tensorflow-text does not seed.
      length_counts: :func:`length_filter_counts` of the same files, tokenizer and
        `max_length`, when the caller has them already (else they are computed here).

    Returns:
      An infinite `tf.data.Dataset` of `(features, labels)`: see the module docstring; every
      batch has `batch_size * max(src_len, tgt_len) <= data_cfg.token_budget`.

    Raises:
      FileNotFoundError: an input file is missing (run `aiayn data`).
      UserInputError: no pair survives the length filter (raise `data.max_length`), or a line
        is not `source<TAB>target` (file and line named).
      ValueError: no input file, or inconsistent `max_length` / `token_budget`.
    """
    seed = data_cfg.seed if seed is None else int(seed)
    bounds = effective_boundaries(data_cfg.bucket_boundaries, data_cfg.max_length)
    paths = _paths(path_or_paths)
    counts = (length_filter_counts(paths, tokenizer, data_cfg) if length_counts is None
              else length_counts)
    if not counts["kept"]:  # else repeat() + filter would look for a first batch forever
        raise _no_pair_fits(counts)
    dataset = _shuffled_examples(tf.data.TextLineDataset(paths), tokenizer, data_cfg, seed)
    if data_cfg.concat_fraction:
        dataset = dataset.apply(concatenate_pairs(data_cfg.concat_fraction, data_cfg.max_length,
                                                  seed + 2))
    dataset = dataset.apply(batch_by_token_budget(bounds, data_cfg.token_budget,
                                                  tokenizer.pad_id, drop_remainder=True))
    dataset = dataset.shuffle(BATCH_SHUFFLE_BUFFER, seed=seed + 1, reshuffle_each_iteration=True)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(_options())


def batch_statistics(batches: Iterable[tuple[dict[str, Any], Any]]) -> dict[str, float]:
    """Counts real and padded tokens of batches (for tests and the input benchmark).

    Args:
      batches: `(features, labels)` batches (tensors or NumPy arrays).

    Returns:
      A dict: `batches`, `examples`, `source_tokens` and `target_tokens` (real, the target counted
      as BOS + target), `padded_tokens` (source + target slots), `padding_efficiency`
      (real / padded, both sides), `max_batch_tokens` (largest `batch * max(src_len, tgt_len)`),
      `shapes` (number of distinct batch shapes).
    """
    stats = dict(batches=0, examples=0, source_tokens=0, target_tokens=0, padded_tokens=0,
                 max_batch_tokens=0)
    shapes = set()
    for features, _ in batches:
        src_mask = np.asarray(features["encoder_padding_mask"])
        tgt_mask = np.asarray(features["decoder_padding_mask"])
        stats["batches"] += 1
        stats["examples"] += src_mask.shape[0]
        stats["source_tokens"] += int(src_mask.sum())
        stats["target_tokens"] += int(tgt_mask.sum())
        stats["padded_tokens"] += src_mask.size + tgt_mask.size
        batch_tokens = src_mask.shape[0] * max(src_mask.shape[1], tgt_mask.shape[1])
        stats["max_batch_tokens"] = max(stats["max_batch_tokens"], batch_tokens)
        shapes.add(src_mask.shape + tgt_mask.shape[1:])
    real = stats["source_tokens"] + stats["target_tokens"]
    stats["padding_efficiency"] = real / stats["padded_tokens"] if stats["padded_tokens"] else 0.0
    stats["shapes"] = len(shapes)
    return stats
