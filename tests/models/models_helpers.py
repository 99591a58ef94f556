"""Tiny model and batch builders for the models tests (hidden 16, 2 heads, 2 layers)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from aiayn.models.transformer import Transformer  # noqa: E402

TINY = dict(num_layers=2, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.1,
            attention_dropout=0.0, norm_first=False, tie_embeddings=True, max_position=256,
            layer_norm_epsilon=1e-6)
VOCAB, PAD, BOS, EOS = 40, 0, 2, 3


def make_model(**overrides):
    keras.utils.set_random_seed(1234)
    model = Transformer(vocabulary_size=VOCAB, pad_id=PAD, **{**TINY, **overrides})
    model.build()
    return model


def make_batch(batch=3, src_len=7, tgt_len=6, seed=0, pad_tail=True):
    """Random features with some right padding (row 0 full length)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, VOCAB, (batch, src_len)).astype("int32")
    tgt = rng.integers(4, VOCAB, (batch, tgt_len)).astype("int32")
    src_mask = np.ones((batch, src_len), bool)
    tgt_mask = np.ones((batch, tgt_len), bool)
    if pad_tail:
        for i in range(1, batch):
            src_mask[i, src_len - i:] = False
            tgt_mask[i, tgt_len - i:] = False
    src = np.where(src_mask, src, PAD)
    tgt = np.where(tgt_mask, tgt, PAD)
    return {"encoder_token_ids": src, "encoder_padding_mask": src_mask,
            "decoder_token_ids": tgt, "decoder_padding_mask": tgt_mask}


