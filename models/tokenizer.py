"""The subword tokenizer: one in-graph object for training data and for the exported model.

:class:`SubwordTokenizer` wraps ``tensorflow_text.SentencepieceTokenizer``, whose op is linked into
the stock ``tensorflow_model_server``. The serialized SentencePiece model (its vocabulary *and* its
normaliser, ``nmt_nfkc`` as trained by ``aiayn.pipeline.data.vocab``) is carried inside the graph,
so a
SavedModel that calls this object tokenises, NFKC-normalises and detokenises exactly as training
did, with no file to ship beside it and no Python at serving time.

Special-token ids are read from the model proto when the tokenizer is built, never hard-coded.

Example::

    tokenizer = SubwordTokenizer.from_file("data/spm.model")
    ids = tokenizer.tokenize(tf.constant(["I love you.", "我爱你"]))  # ragged (2, (len))
    tokenizer.detokenize(ids)  # [b"I love you.", "我爱你".encode()]
"""

from __future__ import annotations

import os
from typing import NamedTuple

import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

IdsLike = tf.Tensor | tf.RaggedTensor


class SubwordTokenizer(tf.Module):
    """An in-graph SentencePiece tokenizer that can be saved inside a SavedModel.

    Args:
      model_proto: the serialized SentencePiece ``ModelProto`` (the bytes of a ``.model`` file).
      name: the module name.

    Attributes:
      model_proto: the serialized model (bytes).
      vocabulary_size: number of pieces, special tokens included.
      pad_id, unk_id, bos_id, eos_id: the special ids as the model defines them (Python ints).

    Raises:
      ValueError: `model_proto` is empty or not a SentencePiece model, or the model lacks a pad,
        BOS or EOS piece (train it with ``aiayn.pipeline.data.vocab.train_vocab``).
    """

    def __init__(self, model_proto: bytes, name: str = "subword_tokenizer"):
        super().__init__(name=name)
        if not isinstance(model_proto, (bytes, bytearray)) or not model_proto:
            raise ValueError(
                "`model_proto` must be the non-empty bytes of a SentencePiece .model file. "
                f"Received: {type(model_proto).__name__} of length "
                f"{len(model_proto) if hasattr(model_proto, '__len__') else 'n/a'}.")
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(bytes(model_proto))
        except (RuntimeError, OSError) as err:
            raise ValueError(f"`model_proto` is not a valid SentencePiece model: {err}") from err
        self.model_proto = bytes(model_proto)
        self.vocabulary_size = int(processor.GetPieceSize())
        self.pad_id = int(processor.pad_id())
        self.unk_id = int(processor.unk_id())
        self.bos_id = int(processor.bos_id())
        self.eos_id = int(processor.eos_id())
        missing = [n for n, i in (("pad", self.pad_id), ("bos", self.bos_id),
                                  ("eos", self.eos_id)) if i < 0]
        if missing:
            raise ValueError(
                f"The SentencePiece model has no {', '.join(missing)} piece (id -1). Train it with "
                "`aiayn vocab` (pad=0, unk=1, bos=2, eos=3).")
        # The op and its resource (holding `model_proto`) are tracked as a child, so
        # tf.saved_model.save carries the model inside the graph.
        self._sentencepiece = self._new_op()
        self._generation = 0
        # Sampling ops (training's subword regularisation), made on first use. Held in a plain
        # object, which tf.Module does not track: a SavedModel never samples, so it carries
        # only the op above.
        self._samplers = _Samplers()

    def _new_op(self, nbest_size: int = 0, alpha: float = 1.0) -> tf_text.SentencepieceTokenizer:
        return tf_text.SentencepieceTokenizer(
            model=self.model_proto, out_type=tf.int32, nbest_size=nbest_size, alpha=alpha,
            add_bos=False, add_eos=False)

    def resource_generation(self) -> int:
        """Re-creates the SentencePiece resource if it was lost; returns its generation.

        The resource is owned by the op kernel that created it, and eager
        ``tf.random.set_seed`` (``keras.utils.set_random_seed``) clears the kernel cache, which
        deletes it ("Resource ... SentencepieceOp does not exist"). A one-op probe, run eagerly
        (also while a tf.function or tf.data map is being traced), re-creates it, so a seed set
        after this tokenizer was built cannot break later calls. The generation is 0 at
        construction and grows by one each time the resource is re-created (by any caller): a
        graph function traced at an earlier generation holds a deleted resource and must be
        traced again.
        """
        with tf.init_scope():
            if tf.executing_eagerly():
                try:
                    self._sentencepiece.vocab_size()
                except tf.errors.NotFoundError:
                    self._sentencepiece = self._new_op()
                    self._samplers.ops.clear()  # lost with it (the same kernel cache)
                    self._generation += 1
        return self._generation

    @property
    def _op(self) -> tf_text.SentencepieceTokenizer:
        """The tensorflow-text tokenizer, its resource re-created if it was lost."""
        self.resource_generation()
        return self._sentencepiece

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SubwordTokenizer:
        """Builds the tokenizer from a ``.model`` file.

        Args:
          path: a SentencePiece model file (``vocab_path(cfg)``, usually ``data/spm.model``).

        Returns:
          A :class:`SubwordTokenizer`.

        Raises:
          FileNotFoundError: the file does not exist (run ``aiayn vocab`` to create it).
          ValueError: the file is not a usable SentencePiece model.
        """
        path = os.fspath(path)
        if not tf.io.gfile.exists(path):
            raise FileNotFoundError(
                f"SentencePiece model not found: {path}. Create it with `aiayn vocab` "
                "(or `make train`, which runs the data and vocabulary stages first).")
        with tf.io.gfile.GFile(path, "rb") as f:
            return cls(f.read())

    def tokenize(self, strings: tf.Tensor, alpha: float = 0.0,
                 nbest_size: int = -1) -> tf.RaggedTensor:
        """Splits strings into subword ids; no BOS or EOS is added.

        The model's own normaliser (NFKC-based ``nmt_nfkc``) runs in-graph first, so text
        without spaces (Chinese, Japanese) and full-width forms work as in training.

        Args:
          strings: `tf.string` of shape `(batch_size,)` (a Python list of str works too).
          alpha: 0 (the default, and the only value outside training): the one most likely
            segmentation. Above 0: a segmentation *sampled* anew at each call, subword
            regularisation (Kudo, 2018): for a unigram model the inverse temperature of the
            sampling (smaller is more varied), for a BPE model the probability of dropping a
            merge (BPE-dropout, Provilkov et al., 2020). The ids decode to the same text.
          nbest_size: with `alpha` > 0, sample from the `nbest_size` best segmentations, or from
            all of them (-1, forward-filtering backward-sampling: as cheap as one Viterbi pass).

        Returns:
          `tf.RaggedTensor` int32 of shape `(batch_size, (num_tokens))`.

        Raises:
          tf.errors.InvalidArgumentError: an input is not a string tensor.
          ValueError: `alpha` < 0, or `nbest_size` is 0 or 1 with `alpha` > 0 (no sampling).
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        if alpha == 0:
            return self._op.tokenize(strings)
        return self._sampler(float(alpha), int(nbest_size)).tokenize(strings)

    def _sampler(self, alpha: float, nbest_size: int) -> tf_text.SentencepieceTokenizer:
        if alpha < 0 or nbest_size in (0, 1):
            raise ValueError(
                "Subword sampling needs `alpha` > 0 and `nbest_size` of -1 (all segmentations) "
                f"or >= 2. Received: alpha={alpha}, nbest_size={nbest_size}. Fix: alpha=0 "
                "tokenises without sampling.")
        self.resource_generation()  # clears the samplers if the kernel cache was cleared
        key = (alpha, nbest_size)
        if key not in self._samplers.ops:
            with tf.init_scope():
                self._samplers.ops[key] = self._new_op(nbest_size, alpha)
        return self._samplers.ops[key]

    def detokenize(self, ids: IdsLike) -> tf.Tensor:
        """Turns ids back into text.

        Control pieces (pad, BOS, EOS) produce no text. For a dense input, everything from the
        first EOS or pad on is ignored (the decoder's output after it ends); a ragged input is
        taken as it is.

        Args:
          ids: integer ids, `tf.RaggedTensor` of shape `(batch_size, (len))` or dense
            `tf.Tensor` of shape `(batch_size, len)`.

        Returns:
          `tf.string` of shape `(batch_size,)`.

        Raises:
          ValueError: `ids` is dense and not of rank 2.
        """
        if isinstance(ids, tf.RaggedTensor):
            return self._op.detokenize(tf.cast(ids, tf.int32))
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        if ids.shape.rank is not None and ids.shape.rank != 2:
            raise ValueError(
                "`detokenize` expects ids of shape (batch_size, len) or a ragged tensor. "
                f"Received shape: {ids.shape}.")
        # (batch, len): True up to (excluding) the first EOS or pad.
        ended = tf.logical_or(tf.equal(ids, self.eos_id), tf.equal(ids, self.pad_id))
        keep = tf.equal(tf.cumsum(tf.cast(ended, tf.int32), axis=1), 0)
        lengths = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)  # (batch,)
        return self._op.detokenize(tf.RaggedTensor.from_tensor(ids, lengths=lengths))

    def id_to_piece(self, ids: IdsLike) -> IdsLike:
        """Maps ids to their pieces (e.g. ``"▁love"``), for inspection.

        Args:
          ids: int ids of any shape, dense or ragged.

        Returns:
          `tf.string` of the same shape.
        """
        return self._op.id_to_string(ids)

    def featurize_source(self, strings: tf.Tensor, limit: int) -> SourceFeatures:
        """THE source featuriser: text to encoder inputs, for every path that translates.

        Evaluation, dev BLEU, checkpoint selection, ``translate --explain``, the exported
        signature and the development server's length checks all call this, with the limit of
        :func:`aiayn.models.limits.source_limit`, so the text the model sees cannot differ
        between them.

        In order: the input must be valid UTF-8 (an in-graph assertion, INVALID_ARGUMENT
        otherwise); it is tokenised (the model's own normaliser, no BOS/EOS on the source side);
        the first `limit` ids are kept; rows are padded with `pad_id` to the longest row of the
        batch (at least one column). An input with no tokens at all (empty, whitespace-only)
        gets a lone EOS, so that no row is all padding (attention over no keys); its
        translation is the empty string (``empty`` tells the caller).

        ``unknown_fraction`` is the share of the input's characters (whitespace not counted)
        that the vocabulary does not know, i.e. that fall inside ``<unk>`` pieces. It counts
        characters, not pieces, because SentencePiece merges a run of unknown characters into
        one ``<unk>``: "我爱你" for an English-Spanish vocabulary is ``▁`` + ``<unk>``, 1 of 2
        pieces but 3 of 3 characters. The model cannot translate what it cannot see: a high
        fraction means its output is a guess (``aiayn translate`` warns above one half).

        Args:
          strings: `tf.string` of shape `(batch_size,)`.
          limit: the most source tokens kept (:func:`aiayn.models.limits.source_limit`).

        Returns:
          :class:`SourceFeatures`: ``token_ids`` int32 and ``padding_mask`` bool, both
          `(batch_size, src_len)` with `1 <= src_len <= limit`; ``lengths`` int32
          `(batch_size,)`, the token count before truncation; ``truncated`` and ``empty`` bool
          `(batch_size,)`; ``unknown_fraction`` float32 `(batch_size,)` in [0, 1] (of the whole
          input, before truncation; 0 for an empty one).

        Raises:
          ValueError: `limit` is below 1.
          tf.errors.InvalidArgumentError: an input is not valid UTF-8 (at run time).
        """
        if limit < 1:
            raise ValueError(f"`limit` must be at least 1. Received: {limit}.")
        strings = _checked_utf8(tf.convert_to_tensor(strings, dtype=tf.string))
        # The same SentencePiece encoding as `tokenize` (tests/test_tokenizer.py checks the ids
        # are equal), plus each piece's byte span in the input, for the unknown fraction.
        pieces, starts, ends = self._op.tokenize_with_offsets(strings)  # (batch, (len)) each
        lengths = tf.cast(pieces.row_lengths(), tf.int32)  # (batch,)
        kept = pieces[:, :limit]  # (batch, (len <= limit))
        batch = tf.shape(strings)[0]
        width = tf.maximum(tf.cast(tf.reduce_max(kept.row_lengths()), tf.int32), 1)
        width = tf.where(batch > 0, width, 1)
        token_ids = kept.to_tensor(default_value=self.pad_id,
                                   shape=tf.stack([batch, width]))  # (batch, src_len)
        padding_mask = tf.sequence_mask(kept.row_lengths(), maxlen=width)  # (batch, src_len)
        empty = tf.equal(lengths, 0)  # (batch,)
        # An empty row becomes a lone EOS (column 0): every row attends over at least one key.
        first = tf.one_hot(tf.zeros_like(lengths), width, on_value=True, off_value=False,
                           dtype=tf.bool)  # (batch, src_len): True at column 0
        lone_eos = tf.logical_and(empty[:, None], first)  # (batch, src_len)
        token_ids = tf.where(lone_eos, tf.constant(self.eos_id, tf.int32), token_ids)
        padding_mask = tf.logical_or(padding_mask, lone_eos)
        return SourceFeatures(token_ids=token_ids, padding_mask=padding_mask, lengths=lengths,
                              truncated=lengths > limit, empty=empty,
                              unknown_fraction=self._unknown_fraction(strings, pieces, starts,
                                                                      ends))

    def _unknown_fraction(self, strings: tf.Tensor, pieces: tf.RaggedTensor,
                          starts: tf.RaggedTensor, ends: tf.RaggedTensor) -> tf.Tensor:
        """Per input, the share of its visible characters covered by ``<unk>`` pieces.

        Args:
          strings: `tf.string` `(batch,)`; pieces, starts, ends: ragged `(batch, (len))` ids
            and byte offsets into `strings` (``tokenize_with_offsets``).

        Returns:
          float32 `(batch,)` in [0, 1]; 0 where an input has no visible character.
        """
        is_unk = tf.equal(pieces.flat_values, self.unk_id)  # (pieces,)
        rows = tf.boolean_mask(pieces.value_rowids(), is_unk)  # (unk pieces,) int64
        begin = tf.boolean_mask(starts.flat_values, is_unk)  # (unk pieces,) byte offsets
        size = tf.boolean_mask(ends.flat_values - starts.flat_values, is_unk)
        spans = tf.strings.substr(tf.gather(strings, rows), tf.cast(begin, tf.int32),
                                  tf.cast(size, tf.int32))  # (unk pieces,) the unknown text
        batch = tf.shape(strings, out_type=tf.int64)[0]
        unknown = tf.math.unsorted_segment_sum(visible_chars(spans), rows, batch)  # (batch,)
        total = visible_chars(strings)  # (batch,)
        fraction = tf.cast(unknown, tf.float32) / tf.cast(tf.maximum(total, 1), tf.float32)
        return tf.where(total > 0, tf.minimum(fraction, 1.0), 0.0)


class _Samplers:
    """A plain holder of :class:`SubwordTokenizer`'s sampling ops, keyed by ``(alpha,
    nbest_size)``; not a dict attribute, which tf.Module would track into a SavedModel."""

    def __init__(self):
        self.ops: dict[tuple[float, int], tf_text.SentencepieceTokenizer] = {}


class SourceFeatures(NamedTuple):
    """What :meth:`SubwordTokenizer.featurize_source` returns (shapes in its docstring)."""

    token_ids: tf.Tensor
    padding_mask: tf.Tensor
    lengths: tf.Tensor
    truncated: tf.Tensor
    empty: tf.Tensor
    unknown_fraction: tf.Tensor


def visible_chars(strings: tf.Tensor) -> tf.Tensor:
    """int32 `(batch,)`: characters of each string, whitespace (any Unicode space) not counted.
    """
    visible = tf.strings.regex_replace(strings, r"[\s\p{Z}]+", "")
    return tf.strings.length(visible, unit="UTF8_CHAR")


def _checked_utf8(strings: tf.Tensor) -> tf.Tensor:
    """`strings` behind an assertion that each is valid UTF-8 (no silent replacement chars)."""
    repaired = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD)
    valid = tf.equal(repaired, strings)  # (batch,)
    check = tf.debugging.Assert(
        tf.reduce_all(valid),
        ["Input `text` must be valid UTF-8. Invalid element(s) at batch index:",
         tf.reshape(tf.where(tf.logical_not(valid)), [-1])],
        name="check_utf8")
    with tf.control_dependencies([check]):
        return tf.identity(strings)
