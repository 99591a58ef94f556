"""Stage 5, TFX: the same job as components (ExampleGen -> ... -> Trainer -> BleuEvaluator ->
InfraCheck -> Pusher), pushing only a model both checks bless.

    examples.py    ExampleGen's input: tf.Example records with source / target bytes features
    trainer.py     the Trainer's run_fn (stable path: aiayn.pipeline.tfx_module.run_fn)
    blessing.py    the push gate's rule: BLEU floor, margin below the last blessed model
    evaluator.py   the BLEU evaluation's body: translate the eval split, sacreBLEU, blessing
    infra.py       the infra check's body: the export verifier, warmup replayed
    components.py  BleuEvaluator and InfraCheck as TFX Python-function components
    definition.py  the pure pipeline definition
    runners.py     LocalDagRunner (and the run's verdict from ML Metadata), and the Kubeflow
                   V2 / Vertex AI compile
    commands.py    `aiayn tfx-data`, `tfx-run`, `tfx-compile`
"""
