"""The Transformer (Vaswani et al., 2017): encoder-decoder with shared embeddings (§3)."""

from __future__ import annotations

import functools

import keras
from keras import ops

from aiayn.models import decoding
from aiayn.models.decoder import TransformerDecoder
from aiayn.models.embedding import TransformerEmbedding
from aiayn.models.encoder import TransformerEncoder
from aiayn.models.masks import update_at
from aiayn.models.stack import LAYER_ARGS


@keras.saving.register_keras_serializable(package="aiayn")
class Transformer(keras.Model):
    """Encoder-decoder Transformer over one joint vocabulary, with cached beam search.

    The keyword names equal ``aiayn.pipeline.config.ModelConfig``'s fields, so
    ``Transformer(vocabulary_size=v, pad_id=p, **dataclasses.asdict(cfg.model))`` works.

    Args:
      vocabulary_size: size of the joint (source + target) vocabulary.
      pad_id: the padding id (from the tokenizer); generated outputs are padded with it.
      num_layers: N, layers of the encoder (and of the decoder, unless
        ``num_decoder_layers`` is given).
      num_decoder_layers: layers of the decoder; ``None`` or 0: as many as the encoder (the
        paper). A deep encoder and a shallow decoder (Kasai et al., 2021) costs less a training
        step and much less a decoding step, which runs the decoder once per produced token.
      hidden_dim: d_model.
      intermediate_dim: d_ff.
      num_heads: h.
      dropout: P_drop (embeddings sums and every sub-layer output, §5.4).
      attention_dropout: dropout on attention weights (0 in the paper).
      token_dropout: the probability that a source or target token's embedding is zeroed in
        training (word dropout; 0 in the paper): ``TransformerEmbedding``.
      norm_first: pre-norm residual blocks instead of the paper's post-norm.
      tie_embeddings: the pre-softmax projection reuses the shared embedding matrix (§3.4).
      max_position: longest target the model decodes (``generate`` caps its length here).
      layer_norm_epsilon: LayerNorm epsilon.
      ffn_activation: the feed-forward networks' activation: ``"relu"`` (the paper),
        ``"gelu"``, or gated (Shazeer, 2020) ``"swiglu"`` / ``"geglu"``, whose inner layer is
        ``2 * intermediate_dim`` wide (``models.feedforward.FeedForward``).
      output_ids: the token ids the decoder may produce, ascending (None: the whole joint
        vocabulary, the paper); they must include PAD, BOS and EOS. With a joint vocabulary
        many pieces occur only on the source side (a third of the en->es Bible's); the
        projection, the softmax and the loss then cover these rows of the table only (fewer
        FLOPs in training and in every decoding step), and no other id is ever produced. The
        weights are the same either way.

    Call args:
      inputs: dict with ``encoder_token_ids`` int ``(B, S)``, ``encoder_padding_mask`` bool
        ``(B, S)``, ``decoder_token_ids`` int ``(B, T)``, ``decoder_padding_mask`` bool
        ``(B, T)`` (masks True on real tokens).
      training: enables dropout.

    Returns:
      logits float32 ``(B, T, V)`` (also under mixed precision): column ``j`` is token
      ``output_ids[j]``, ``V = len(output_ids)``; without ``output_ids``, ``V =
      vocabulary_size`` and column = id. (:meth:`decode_step` returns the same columns;
      :meth:`generate` searches over them and returns token ids.)

    Raises:
      ValueError: inconsistent sizes (e.g. ``num_heads`` does not divide ``hidden_dim``,
        ``pad_id`` outside the vocabulary).

    Example:
      >>> model = Transformer(vocabulary_size=128, pad_id=0, num_layers=2, hidden_dim=16,
      ...                     intermediate_dim=32, num_heads=2)
      >>> out = model.generate(ids, mask, bos_id=2, eos_id=3, beam_size=4)
    """

    def __init__(self, vocabulary_size, pad_id, num_layers=6, hidden_dim=512,
                 intermediate_dim=2048, num_heads=8, dropout=0.1, attention_dropout=0.0,
                 norm_first=False, tie_embeddings=True, max_position=1024,
                 layer_norm_epsilon=1e-6, num_decoder_layers=None, ffn_activation="relu",
                 token_dropout=0.0, output_ids=None, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= pad_id < vocabulary_size:
            raise ValueError(
                f"`pad_id` must be a token id in [0, vocabulary_size={vocabulary_size}). "
                f"Received: pad_id={pad_id}. Fix: read it from the tokenizer (`.pad_id`)."
            )
        self.output_ids = _checked_output_ids(output_ids, vocabulary_size)
        if max_position < 1:
            raise ValueError(f"`max_position` must be positive. Received: {max_position}.")
        self.vocabulary_size = vocabulary_size
        self.pad_id = pad_id
        self.num_layers = num_layers
        self.num_decoder_layers = num_decoder_layers or num_layers
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.norm_first = norm_first
        self.tie_embeddings = tie_embeddings
        self.max_position = max_position
        self.layer_norm_epsilon = layer_norm_epsilon
        self.ffn_activation = ffn_activation
        self.token_dropout = token_dropout
        stack = {name: getattr(self, name) for name in LAYER_ARGS} | {"dtype": self.dtype_policy}
        self.embedding = TransformerEmbedding(vocabulary_size, hidden_dim, dropout,
                                              token_dropout=token_dropout,
                                              dtype=self.dtype_policy, name="embedding")
        self.encoder = TransformerEncoder(num_layers, name="encoder", **stack)
        self.decoder = TransformerDecoder(self.num_decoder_layers, name="decoder", **stack)
        self.output_projection = None
        if not tie_embeddings:
            self.output_projection = keras.layers.Dense(
                vocabulary_size, dtype=self.dtype_policy, name="output_projection")

    def build(self, input_shape=None):
        self.embedding.build((None, None))
        self.encoder.build((None, None, self.hidden_dim))
        self.decoder.build((None, None, self.hidden_dim))
        if self.output_projection is not None:
            self.output_projection.build((None, None, self.hidden_dim))
        self.built = True

    # -- teacher forcing ----------------------------------------------------------------------
    def output_kernel(self):
        """The pre-softmax projection ``(hidden, V)`` in the compute dtype, V the output
        columns (``output_ids``, or the whole vocabulary).

        Tied (§3.4): the embedding table transposed, as a new tensor. Decoding computes it once
        before its loop and passes it to every step: on 2-core x86 CPUs a matmul against the
        ``(V, hidden)`` table with the transpose folded in (Eigen, 128 rows, V = 8000) ran at
        0.6x the speed of one against this copy; bench/decode_profile.py shows the share.
        """
        if self.output_projection is not None:
            kernel = ops.cast(self.output_projection.kernel, self.compute_dtype)
            return kernel if self.output_ids is None else ops.take(
                kernel, self._output_columns(), axis=1)
        table = self.embedding.embeddings
        if self.output_ids is not None:
            table = ops.take(table, self._output_columns(), axis=0)
        return ops.transpose(ops.cast(table, self.compute_dtype))

    def _output_columns(self):
        """``output_ids`` as an int32 tensor: the token id of each output column."""
        return ops.convert_to_tensor(self.output_ids, "int32")

    def _logits(self, x, output_kernel=None):
        """``(B, T, hidden)`` -> float32 ``(B, T, V)`` over the output columns (``output_ids``,
        or the whole vocabulary), or 2-D -> 2-D.

        ``output_kernel``: :meth:`output_kernel`, computed once by the caller (decoding);
        None: the projection reads the weights itself (training, where the transpose folds
        into the matmul and its gradient).
        """
        # One 2-D matmul over all B * T positions: a (B, T, d) x (V, d)^T batched product
        # broadcasts the table over B, and its gradient is then B per-sentence (V, d) products
        # summed afterwards (a (B, V, d) intermediate; 1.5x the forward cost).
        flat = ops.reshape(x, (-1, self.hidden_dim)) if len(x.shape) == 3 else x
        if self.output_projection is not None and self.output_ids is None \
                and output_kernel is None:
            logits = self.output_projection(flat)
        elif self.output_projection is not None:
            kernel = self.output_kernel() if output_kernel is None else output_kernel
            logits = ops.matmul(flat, ops.cast(kernel, flat.dtype))  # (B * T, V)
            if self.output_projection.use_bias:
                bias = self.output_projection.bias
                if self.output_ids is not None:
                    bias = ops.take(bias, self._output_columns(), axis=0)
                logits = logits + ops.cast(bias, logits.dtype)
        elif output_kernel is not None:
            logits = ops.matmul(flat, output_kernel)  # (B * T, V)
        else:
            # §3.4: the same matrix as the embeddings (transposed), in the compute dtype.
            table = self.embedding.embeddings  # (V, hidden)
            if self.output_ids is not None:  # the output rows only (their gradient: a scatter)
                table = ops.take(table, self._output_columns(), axis=0)
            table = ops.cast(table, x.dtype)
            logits = ops.matmul(flat, ops.transpose(table))  # (B * T, V), transpose folded
        if len(x.shape) == 3:
            logits = ops.reshape(logits, (ops.shape(x)[0], ops.shape(x)[1],
                                          ops.shape(logits)[-1]))
        return ops.cast(logits, "float32")

    def encode(self, encoder_token_ids, encoder_padding_mask, training=False):
        """Source ids ``(B, S)`` and mask -> encoder outputs ``(B, S, hidden_dim)``."""
        x = self.embedding(encoder_token_ids, training=training)
        return self.encoder(x, padding_mask=encoder_padding_mask, training=training)

    def call(self, inputs, training=None):
        encoder_mask = inputs["encoder_padding_mask"]
        encoded = self.encode(inputs["encoder_token_ids"], encoder_mask, training=training)
        x = self.embedding(inputs["decoder_token_ids"], training=training)
        x = self.decoder(x, encoded, decoder_padding_mask=inputs["decoder_padding_mask"],
                         encoder_padding_mask=encoder_mask, training=training)
        return self._logits(x)

    def attention_weights(self, inputs):
        """Attention weights under teacher forcing (inference mode), for plots.

        Returns:
          dict of lists over layers, float32: ``encoder_self`` ``(B, heads, S, S)``,
          ``decoder_self`` ``(B, heads, T, T)``, ``cross`` ``(B, heads, T, S)``.
        """
        encoder_mask = inputs["encoder_padding_mask"]
        x = self.embedding(inputs["encoder_token_ids"], training=False)
        encoded, encoder_self = self.encoder.call_with_weights(x, encoder_mask, training=False)
        y = self.embedding(inputs["decoder_token_ids"], training=False)
        _, decoder_self, cross = self.decoder.call_with_weights(
            y, encoded, inputs["decoder_padding_mask"], encoder_mask, training=False)
        return {"encoder_self": encoder_self, "decoder_self": decoder_self, "cross": cross}

    # -- cached incremental decoding ----------------------------------------------------------
    def encoder_memory(self, encoder_outputs, encoder_padding_mask):
        """What every decoding step reads but never changes: per-layer cross-attention
        ``(key, value)`` ``(B, H, S, D)`` and the source padding mask ``(B, S)``."""
        return {"cross": self.decoder.cross_cache(encoder_outputs),
                "encoder_padding_mask": ops.cast(encoder_padding_mask, "bool")}

    def init_cache(self, batch_size, max_length, beam_size=1):
        """Zeroed decoding state for ``batch_size`` sentences of ``beam_size`` rows each.

        A dict: ``"layers"``, the decoder self-attention cache (``(B, H, K * L, D)`` per layer
        and tensor, contract in ``aiayn.models.attention``), and ``"ancestry"``, int32
        ``(B * K, L)``: for each row (beam), which beam slot holds each position of its
        hypothesis. Beam search re-ranks rows with :meth:`reorder_cache`, which moves only
        the ancestry, never the keys and values.
        """
        return {"layers": self.decoder.init_cache(batch_size, max_length, beam_size),
                "ancestry": ops.zeros((batch_size * beam_size, max_length), "int32")}

    @staticmethod
    def reorder_cache(cache, rows):
        """Beam re-ranking: row ``r`` continues the hypothesis of row ``rows[r]`` (a
        ``reorder_fn`` for :func:`aiayn.models.decoding.beam_search`)."""
        return {"layers": cache["layers"], "ancestry": ops.take(cache["ancestry"], rows, axis=0)}

    def decode_step(self, token_ids, cache, index, memory, beam_size=1, output_kernel=None):
        """One cached decoder step for ``B * K`` rows (K = beam_size, beams adjacent).

        Args:
          token_ids: int ``(B * K,)``, the tokens at position ``index``.
          cache: from :meth:`init_cache` (same ``beam_size``) or the previous step.
          index: int32 scalar position.
          memory: from :meth:`encoder_memory`, one row per *sentence* (B rows, not B * K).
          beam_size: K (Python int).
          output_kernel: :meth:`output_kernel`, computed once before the loop (or None).

        Returns:
          ``(logits float32 (B * K, V) for position index + 1, cache)``, V the output columns
          (as :meth:`call`'s).
        """
        x = self.embedding(token_ids[:, None], start_index=index, training=False)  # (BK, 1, d)
        if beam_size == 1:
            x, layers = self.decoder.call_cached(x, cache["layers"], memory["cross"], index,
                                                 memory["encoder_padding_mask"])
            return (self._logits(x, output_kernel)[:, 0, :],
                    {"layers": layers, "ancestry": cache["ancestry"]})
        # Row (b, j) writes slot j at `index`; its earlier positions keep their slots.
        own_slot = ops.arange(ops.shape(token_ids)[0], dtype="int32") % beam_size  # (B*K,)
        ancestry = update_at(cache["ancestry"], index, own_slot[:, None], axis=1)  # (B*K, L)
        x = ops.reshape(x, (-1, beam_size, self.hidden_dim))  # (B, K, d): beams as queries
        x, layers = self.decoder.call_cached(
            x, cache["layers"], memory["cross"], index, memory["encoder_padding_mask"],
            ancestry=ops.reshape(ancestry, (-1, beam_size, ops.shape(ancestry)[1])))
        logits = self._logits(ops.reshape(x, (-1, 1, self.hidden_dim)), output_kernel)[:, 0, :]
        return logits, {"layers": layers, "ancestry": ancestry}

    # -- growing cache, shrinking batch (dynamic shapes) ---------------------------------------
    def growing_cache(self, memory, beam_size, length):
        """The state of :func:`aiayn.models.decoding.shrinking_beam_search`: the encoder memory
        (one row per sentence) and an empty growing self-attention cache (one row per beam);
        ``length`` is a 0 the graph cannot know (see ``Decoder.empty_cache``)."""
        rows = ops.shape(memory["encoder_padding_mask"])[0] * beam_size
        return {"memory": memory, "layers": self.decoder.empty_cache(rows, length)}

    @staticmethod
    def reorder_growing_cache(cache, rows, beam_size):
        """Row ``r`` continues old row ``rows[r]``; sentences whose rows are gone leave the
        memory too (``rows[::K] // K`` are the sentences kept)."""
        memory = cache["memory"]
        kept = ops.take(rows, ops.arange(0, ops.size(rows), beam_size), axis=0) // beam_size
        memory = ops.cond(  # most steps no sentence leaves: no copy of the memory then
            ops.less(ops.size(kept), ops.shape(memory["encoder_padding_mask"])[0]),
            lambda: keras.tree.map_structure(lambda t: ops.take(t, kept, axis=0), memory),
            lambda: memory)
        return {"memory": memory,
                "layers": keras.tree.map_structure(lambda t: ops.take(t, rows, axis=0),
                                                   cache["layers"])}

    def decode_step_growing(self, token_ids, cache, index, beam_size, output_kernel=None):
        """One decoder step on a :meth:`growing_cache`: ``token_ids`` ``(B * K,)`` at position
        ``index`` -> ``(logits float32 (B * K, V), cache)`` (V and ``output_kernel`` as
        :meth:`decode_step`)."""
        x = self.embedding(token_ids[:, None], start_index=index, training=False)[:, 0]  # (BK, d)
        memory = cache["memory"]
        x, layers = self.decoder.call_growing(x, cache["layers"], memory["cross"],
                                              memory["encoder_padding_mask"], beam_size)
        return self._logits(x, output_kernel), {"memory": memory, "layers": layers}

    def generate(self, encoder_token_ids, encoder_padding_mask, bos_id, eos_id, beam_size=4,
                 length_penalty=0.6, max_extra_length=50, n_best=1, dynamic_shapes=False,
                 stop_rule="current"):
        """Translates a batch: encode once, then cached greedy (beam_size=1) or beam search.

        Graph-only (``keras.ops.while_loop``); traceable in ``tf.function`` with
        ``[None, None]`` input signatures and under XLA. PAD and BOS are never generated.

        Args:
          encoder_token_ids: int ``(B, S)``; encoder_padding_mask: bool ``(B, S)``.
          bos_id, eos_id: from the tokenizer.
          beam_size: 1 = greedy search.
          length_penalty: GNMT alpha (paper 0.6).
          max_extra_length: at most ``S + max_extra_length`` tokens (EOS included) are
            generated, capped at ``max_position``.
          n_best: hypotheses per sentence (<= beam_size).
          dynamic_shapes: beam search only. True: finished sentences leave the batch and the
            self-attention cache grows with the step (:func:`decoding.shrinking_beam_search`,
            the fast path in eager mode or ``tf.function`` with unknown batch and source
            length, as the export runs it); False: static shapes (XLA, JAX). Same results.
          stop_rule: beam search only: when a sentence stops, ``"current"`` or ``"bound"``
            (:mod:`aiayn.models.decoding`).

        Returns:
          dict ``token_ids`` int32 ``(B, n_best, L)`` (no BOS; EOS and after = pad_id),
          ``scores`` float32 ``(B, n_best)`` (length-normalised log-probabilities, best
          first), ``lengths`` int32 ``(B, n_best)`` (tokens before EOS).

        Raises:
          ValueError: ``beam_size < 1``, ``n_best`` not in ``[1, beam_size]``, an unknown
            ``stop_rule``, or BOS, EOS or PAD outside ``output_ids``.
        """
        self._check_search_args(beam_size, n_best, stop_rule)
        # The search runs over the output columns: with output_ids, column j is token
        # output_ids[j] (the projection and its softmax cover those only), mapped back at the end.
        bos, eos, pad = self._special_columns(bos_id, eos_id)
        if not self.built:
            self.build()
        token_ids = ops.cast(encoder_token_ids, "int32")
        padding_mask = ops.cast(encoder_padding_mask, "bool")
        batch_size, source_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        max_length = ops.minimum(source_length + max_extra_length, self.max_position)
        # One row per sentence: the K beams of a sentence are K queries against it.
        memory = self.encoder_memory(self.encode(token_ids, padding_mask), padding_mask)
        kernel = self.output_kernel()  # once, outside the loop: every step reads it
        banned = self._banned_columns(bos, eos, pad)
        output_ids = None if self.output_ids is None else self._output_columns()

        if beam_size > 1 and dynamic_shapes:
            cache = self.growing_cache(memory, beam_size, length=max_length * 0)
            step_fn = self._masked_step_fn(
                functools.partial(self.decode_step_growing, beam_size=beam_size,
                                  output_kernel=kernel), banned, output_ids)
            out = decoding.shrinking_beam_search(
                step_fn, cache, batch_size, bos, eos, pad, beam_size,
                max_length, length_penalty, n_best,
                reorder_fn=functools.partial(self.reorder_growing_cache, beam_size=beam_size),
                stop_rule=stop_rule)
            return self._as_token_ids(out)
        cache = self.init_cache(batch_size, max_length, beam_size)
        step_fn = self._masked_step_fn(
            functools.partial(self.decode_step, memory=memory, beam_size=beam_size,
                              output_kernel=kernel), banned, output_ids)
        if beam_size == 1:
            out = decoding.greedy_search(step_fn, cache, batch_size, bos, eos, pad, max_length,
                                         length_penalty)
            return self._as_token_ids({key: ops.expand_dims(value, 1)
                                       for key, value in out.items()})
        return self._as_token_ids(decoding.beam_search(
            step_fn, cache, batch_size, bos, eos, pad, beam_size, max_length, length_penalty,
            n_best, reorder_fn=self.reorder_cache, stop_rule=stop_rule))

    @staticmethod
    def _check_search_args(beam_size, n_best, stop_rule):
        """Raises the ValueError of :meth:`generate` for a bad ``beam_size``, ``n_best`` or
        ``stop_rule``."""
        if beam_size < 1:
            raise ValueError(f"`beam_size` must be at least 1. Received: {beam_size}.")
        if not 1 <= n_best <= beam_size:
            raise ValueError(
                f"`n_best` must be in [1, beam_size]. Received: n_best={n_best}, "
                f"beam_size={beam_size}. Fix: raise beam_size or lower n_best.")
        if stop_rule not in decoding.STOP_RULES:  # checked for greedy search too (a typo errs)
            raise ValueError(f"`stop_rule` must be one of {', '.join(decoding.STOP_RULES)}. "
                             f"Received: {stop_rule!r}.")

    def _banned_columns(self, bos, eos, pad):
        """Bool ``(V,)``: the output columns a search never generates."""
        columns = ops.arange(len(self.output_ids or ()) or self.vocabulary_size, dtype="int32")
        return ops.logical_or(  # (V,) PAD (unless it doubles as EOS) and BOS
            ops.equal(columns, bos),
            ops.logical_and(ops.equal(columns, pad), ops.not_equal(pad, eos)))

    @staticmethod
    def _masked_step_fn(decode, banned, output_ids):
        """A search's ``step_fn(ids, cache, index)``: ``decode(token_ids, cache, index)`` on the
        token at ``index`` of each row (``ids`` holds columns; ``output_ids`` maps them to
        token ids, None: they are token ids), its ``banned`` columns' logits set to -inf."""

        def step_fn(ids, cache, index):
            token = ops.take(ids, index, axis=1)
            if output_ids is not None:
                token = ops.take(output_ids, token)
            logits, cache = decode(token, cache, index)
            return ops.where(banned[None, :], decoding.NEG_INF, logits), cache

        return step_fn

    def _special_columns(self, bos_id, eos_id):
        """The output columns of BOS, EOS and PAD (their ids, without ``output_ids``)."""
        if self.output_ids is None:
            return bos_id, eos_id, self.pad_id
        column = {token: j for j, token in enumerate(self.output_ids)}
        named = (("bos_id", int(bos_id)), ("eos_id", int(eos_id)), ("pad_id", self.pad_id))
        missing = [f"`{name}` {token}" for name, token in named if token not in column]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} not among the model's `output_ids`: the search starts "
                "at BOS, ends at EOS and pads with PAD. Fix: include the special ids in "
                "`output_ids` (aiayn.pipeline.data.vocab.output_ids does).")
        return tuple(column[token] for _, token in named)

    def _as_token_ids(self, out):
        """A search's result over output columns -> over token ids."""
        if self.output_ids is None:
            return out
        return {**out, "token_ids": ops.take(self._output_columns(), out["token_ids"])}

    def get_config(self):
        config = super().get_config()
        config.update(vocabulary_size=self.vocabulary_size, pad_id=self.pad_id,
                      num_layers=self.num_layers,
                      num_decoder_layers=self.num_decoder_layers, hidden_dim=self.hidden_dim,
                      intermediate_dim=self.intermediate_dim, num_heads=self.num_heads,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      norm_first=self.norm_first, tie_embeddings=self.tie_embeddings,
                      max_position=self.max_position,
                      layer_norm_epsilon=self.layer_norm_epsilon,
                      ffn_activation=self.ffn_activation, token_dropout=self.token_dropout,
                      output_ids=None if self.output_ids is None else list(self.output_ids))
        return config


def _checked_output_ids(output_ids, vocabulary_size):
    """``output_ids`` as a tuple of ints, ascending, unique, in ``[0, vocabulary_size)``."""
    if output_ids is None:
        return None
    ids = tuple(int(i) for i in output_ids)
    if not ids or any(b <= a for a, b in zip(ids, ids[1:])) or not (
            0 <= ids[0] and ids[-1] < vocabulary_size):
        raise ValueError(
            "`output_ids` must be token ids in [0, vocabulary_size="
            f"{vocabulary_size}), ascending and unique. Received {len(ids)} ids"
            + (f" from {ids[0]} to {ids[-1]}." if ids else ".")
            + " Fix: pass sorted(set(ids)), or None for the whole vocabulary.")
    return ids
