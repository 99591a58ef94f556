"""The stable import path of the TFX Trainer's ``run_fn``: ``aiayn.pipeline.tfx_module.run_fn``.

TFX stores this dotted path in compiled pipelines (Kubeflow V2 / Vertex JSON) and in ML
Metadata, so it must keep resolving when the code moves. The implementation lives in
:mod:`aiayn.pipeline.tfx.trainer`; this module only re-exports it (and sits above the stages, so
it may import the tfx stage).
"""

from aiayn.pipeline.tfx.trainer import RUN_FN, run_fn

__all__ = ["RUN_FN", "run_fn"]
