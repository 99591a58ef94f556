"""Stage 5, TFX: the same job as components (ExampleGen -> ... -> Trainer -> Pusher).

    examples.py    ExampleGen's input: tf.Example records with source / target bytes features
    trainer.py     the Trainer's run_fn (stable path: aiayn.pipeline.tfx_module.run_fn)
    definition.py  the pure pipeline definition
    runners.py     LocalDagRunner, and the Kubeflow V2 / Vertex AI compile
    commands.py    `aiayn tfx-data`, `tfx-run`, `tfx-compile`
"""
