"""aiayn.pipeline: the job, one sub-package per stage, in the order the data flows.

    data/        corpus -> train/dev/test TSV + data report; SentencePiece vocabulary; tf.data
    training/    the paper's recipe on model.fit; checkpoints, backup, dev BLEU, averaging
    evaluation/  translate a split with the served graph, sacreBLEU; attention maps, plots
    release/     the verified, versioned SavedModel; serve, translate, verify; the model card
    tfx/         the same job as a TFX pipeline (ExampleGen .. Trainer .. Pusher) and its runners

On top: ``config`` (typed presets), ``errors``, ``fileio`` (foundation, importable by every
stage), and ``cli`` / ``run`` (the commands and the whole job). A stage imports only earlier
stages (tests/test_layering.py); docs/ARCHITECTURE.md has the map.
"""
