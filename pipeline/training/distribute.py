"""Hardware levers resolved from the config: tf.distribute strategy, dtype policy, XLA.

Each ``train.*`` setting may be ``auto``; this module is the one place that decides what ``auto``
means on the running hardware, so the choice is logged once and reproducible:

    distribute       auto -> MultiWorkerMirroredStrategy if TF_CONFIG names a cluster,
                             MirroredStrategy if more than one GPU, else the default strategy
    mixed_precision  auto -> mixed_float16 on GPU (loss-scaled by Keras 3's LossScaleOptimizer),
                             mixed_bfloat16 on TPU and on CPUs with bfloat16 matrix units
                             (Intel AMX / AVX512_BF16: oneDNN runs bf16 matmuls there; measured
                             1.7x the float32 tokens/s on the project's 2-core CPU), else float32
    jit_compile      auto -> on for GPU/TPU; off on CPU (measured on the 2-core CPU this project
                             targets: compiling every bucket shape cost far more than it saved,
                             see ``CPU_JIT_COMPILE`` below)

Example:

    strategy = resolve_strategy(cfg.train.distribute)
    with strategy.scope():
        ...
"""

from __future__ import annotations

import json
import logging
import os

import tensorflow as tf

from aiayn.pipeline.errors import UserInputError

log = logging.getLogger(__name__)

# Measured on the small preset on the project's 2-core CPU: without XLA 0.29 steps/s (float32);
# with jit_compile=True the first 60 steps had not finished after 8 minutes (each of the many
# 2-D bucket shapes compiles separately, several seconds to minutes apiece on 2 cores), so
# `auto` leaves XLA off on CPU.
CPU_JIT_COMPILE = False


def num_gpus() -> int:
    return len(tf.config.list_physical_devices("GPU"))


def num_tpus() -> int:
    return len(tf.config.list_logical_devices("TPU"))


def tf_config_cluster() -> dict:
    """The ``cluster`` of ``TF_CONFIG`` (``{}`` when unset).

    Raises:
      UserInputError: TF_CONFIG is not valid JSON.
    """
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return {}
    try:
        return dict(json.loads(raw).get("cluster", {}))
    except (ValueError, AttributeError) as err:
        raise UserInputError(
            f"TF_CONFIG is not valid JSON ({err}). Expected e.g. "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}.') from None


def resolve_distribute(setting: str) -> str:
    """Maps ``train.distribute`` (possibly ``auto``) to a concrete strategy name."""
    if setting != "auto":
        return setting
    cluster = tf_config_cluster()
    if sum(len(v) for v in cluster.values()) > 1:
        return "multi_worker"
    if num_gpus() > 1:
        return "mirrored"
    return "default"


_STRATEGY_CACHE: dict[str, tf.distribute.Strategy] = {}


def resolve_strategy(setting: str) -> tf.distribute.Strategy:
    """Creates (once per process) the ``tf.distribute`` strategy for ``train.distribute``.

    ``multi_worker`` reads the cluster from ``TF_CONFIG``; ``tpu`` connects to the local TPU
    (or ``TPU_NAME``). MultiWorkerMirroredStrategy may only be created once per process and
    before other TensorFlow ops run, so the strategy is cached.

    Raises:
      UserInputError: an unknown setting, or ``tpu`` requested where no TPU can be reached.
    """
    name = resolve_distribute(setting)
    if name in _STRATEGY_CACHE:
        return _STRATEGY_CACHE[name]
    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif name == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
                tpu=os.environ.get("TPU_NAME", "local"))
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, tf.errors.OpError) as err:
            raise UserInputError(
                f"train.distribute=tpu but no TPU could be reached ({err}). Use "
                "train.distribute=auto on machines without a TPU.") from None
        strategy = tf.distribute.TPUStrategy(resolver)
    else:
        raise UserInputError(
            f"train.distribute={setting!r}: expected auto, default, mirrored, multi_worker or tpu.")
    log.info("distribute=%s -> %s with %d replica(s)", setting, type(strategy).__name__,
             strategy.num_replicas_in_sync)
    _STRATEGY_CACHE[name] = strategy
    return strategy


def cpu_has_bfloat16_units() -> bool:
    """True on x86 CPUs that advertise AMX-BF16 or AVX512_BF16 (Linux ``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"amx_bf16", "avx512_bf16"} & flags)
    except OSError:
        pass
    return False


def resolve_mixed_precision(setting: str) -> str:
    """The Keras dtype policy name for ``train.mixed_precision``."""
    if setting != "auto":
        return setting
    if num_tpus():
        return "mixed_bfloat16"
    if num_gpus():
        return "mixed_float16"
    if cpu_has_bfloat16_units():
        return "mixed_bfloat16"
    return "float32"


def resolve_jit_compile(setting: str) -> bool:
    """Whether ``model.compile`` gets ``jit_compile=True`` for ``train.jit_compile``."""
    if setting in ("true", "false"):
        return setting == "true"
    if num_gpus() or num_tpus():
        return True
    return CPU_JIT_COMPILE


def is_chief() -> bool:
    """True for the process that writes the run's files (worker 0, or the only process)."""
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return True
    task = json.loads(raw).get("task", {})
    task_type, index = task.get("type", "worker"), int(task.get("index", 0))
    return task_type == "chief" or (task_type == "worker" and index == 0 and
                                    "chief" not in tf_config_cluster())
