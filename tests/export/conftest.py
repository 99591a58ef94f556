"""Fixtures for the export tests: one tiny trained model, exported ONCE per test session.

  export_cfg     the `tiny` preset on the toy corpus, exports under a temporary base dir.
  trained_model  a tiny Transformer (hidden 16, 2 layers) fitted for a few steps on the toy
                 pairs, its weights at <run_dir>/final.weights.h5 (no dependency on pipeline/train).
  exported       (cfg, version_dir) from `aiayn.pipeline.release.export_run.export_run` (verified).
  dev_server     the development server on free ports over that base dir (poll every 0.3 s).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest


@pytest.fixture(scope="session")
def export_cfg(toy_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    return dataclasses.replace(
        toy_config,
        train=dataclasses.replace(toy_config.train, run_dir=str(root / "run")),
        decode=dataclasses.replace(toy_config.decode, beam_size=2, n_best=2, max_extra_length=8),
        export=dataclasses.replace(toy_config.export, base_dir=str(root / "exports"),
                                   max_input_tokens=24, max_batch_size=16))


def _features(tokenizer, pairs):
    import tensorflow as tf

    src = tokenizer.tokenize(tf.constant([s for s, _ in pairs])).to_tensor(tokenizer.pad_id)
    tgt = tokenizer.tokenize(tf.constant([t for _, t in pairs]))
    bos = tf.fill([len(pairs), 1], tokenizer.bos_id)
    eos = tf.fill([len(pairs), 1], tokenizer.eos_id)
    dec = tf.concat([bos, tgt.to_tensor(tokenizer.pad_id)], 1).numpy()
    lab = tf.concat([tgt, tf.RaggedTensor.from_tensor(eos)], 1).to_tensor(tokenizer.pad_id).numpy()
    src = src.numpy()
    return ({"encoder_token_ids": src, "encoder_padding_mask": src != tokenizer.pad_id,
             "decoder_token_ids": dec, "decoder_padding_mask": lab != tokenizer.pad_id}, lab)


@pytest.fixture(scope="session")
def trained_model(export_cfg, toy_tokenizer, toy_pairs):
    import keras

    from aiayn.pipeline.training.artifacts import build_model

    # Seeded, so the model (and what it answers) does not depend on which tests ran before.
    # Seeding clears TensorFlow's kernel cache; the tokenizer re-creates its SentencePiece
    # resource on its next call (SubwordTokenizer._op).
    keras.utils.set_random_seed(20261201)
    model = build_model(export_cfg, toy_tokenizer)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, ignore_class=toy_tokenizer.pad_id))
    x, y = _features(toy_tokenizer, toy_pairs)
    model.fit(x, y, batch_size=len(toy_pairs), epochs=40, verbose=0)
    from pathlib import Path

    run_dir = Path(export_cfg.train.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model.save_weights(str(run_dir / "final.weights.h5"))
    return model


@pytest.fixture(scope="session")
def exported(export_cfg, trained_model):
    from aiayn.pipeline.release.export_run import export_run

    path = export_run(export_cfg)
    return export_cfg, path


@pytest.fixture(scope="session")
def translator(export_cfg, trained_model, toy_tokenizer):
    """In-process translation with the same options as the export."""
    from aiayn.export.saved_model import ServingOptions, Translator

    return Translator(trained_model, toy_tokenizer,
                      ServingOptions.from_configs(export_cfg.decode, export_cfg.export))


@pytest.fixture(scope="session")
def dev_server(exported):
    from aiayn.export.server import DevServer

    cfg, _ = exported
    server = DevServer(cfg.export.base_dir, rest_port=0, grpc_port=0, poll_seconds=0.3,
                       batch_timeout_ms=20).start()
    yield server
    server.stop()


def decode(values):
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in np.asarray(values).tolist()]
