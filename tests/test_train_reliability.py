"""Reliability and scale-out of training, in real subprocesses (slow; CI runs them).

(SIGKILL and resume to bit-identical weights: tests/test_train_faults.py.)

* MultiWorkerMirroredStrategy with two worker processes on localhost: both end with identical
  weights, and the loss follows a one-worker run with the same global batch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.weights_helpers import assert_same_weights

pytestmark = pytest.mark.slow

# The command under test: `python train_script.py RUN_DIR [overrides...]`. A callback slows each
# batch down (numerics untouched) so that the test can kill the process mid-training, and each
# process writes its own model weights at the end (to compare workers).
TRAIN_SCRIPT = r'''
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from aiayn.pipeline.config import load_config
from aiayn.pipeline.training import callbacks as cb
from aiayn.pipeline.training import artifacts  # noqa: E402
from aiayn.pipeline.training.train import train
import keras

run_dir, overrides = sys.argv[1], sys.argv[2:]
cfg = load_config(["tiny"], [f"train.run_dir={run_dir}"] + overrides)
delay = float(os.environ.get("AIAYN_TEST_BATCH_DELAY", "0"))
index = os.environ.get("AIAYN_TEST_WORKER", "0")

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(delay)

class SaveMine(keras.callbacks.Callback):
    def on_train_end(self, logs=None):
        artifacts.save_model_weights(self.model, os.path.join(run_dir, f"worker{index}.weights.h5"))

summary = train(cfg, extra_callbacks=[Slow(), SaveMine()])
print("SUMMARY " + __import__("json").dumps({"steps": summary["steps"]}), flush=True)
'''


def _env(**extra):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **extra})
    return env


def _run(script, run_dir, overrides, env, timeout=600):
    proc = subprocess.run([sys.executable, str(script), str(run_dir), *overrides], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train_script.py"
    path.write_text(TRAIN_SCRIPT)
    return path


def _common(toy_config):
    return [f"data.data_dir={toy_config.data.data_dir}", "data.vocab_size=200",
            "train.eval_every=0", "train.keep_checkpoints=2", "train.average_last=2"]


# SIGKILL and resume to bit-identical weights: tests/test_train_faults.py (kills at random
# moments and inside every kind of write, then the same command).


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _mean_loss(run_dir):
    rows = json.loads((Path(run_dir) / "history.json").read_text())["rows"]
    return float(np.mean([r["loss"] for r in rows if "loss" in r]))


def test_multi_worker_mirrored_two_workers_on_localhost(toy_config, spm_model_path, script,
                                                        tmp_path):
    steps = ["train.steps=20", "train.steps_per_epoch=10", "train.checkpoint_every=10",
             "data.token_budget=256"]
    overrides = _common(toy_config) + steps + ["train.distribute=multi_worker"]
    run_dir = tmp_path / "mwms"
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen(
            [sys.executable, str(script), str(run_dir), *overrides],
            env=_env(TF_CONFIG=tf_config, AIAYN_TEST_WORKER=str(index)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
        assert '"steps": 20' in out
    assert "CollectiveAllReduceStrategy (2 replica(s))" in outputs[0]  # = MultiWorkerMirrored
    assert_same_weights(run_dir / "worker0.weights.h5", run_dir / "worker1.weights.h5")
    assert (run_dir / "final.weights.h5").exists()

    # One worker, the same global batch: twice the per-replica token budget.
    single = tmp_path / "single"
    one = _common(toy_config) + steps[:-1] + ["data.token_budget=512", "train.distribute=default"]
    _run(script, single, one, _env())
    two_workers, one_worker = _mean_loss(run_dir), _mean_loss(single)
    assert abs(two_workers - one_worker) < 0.05 * one_worker, (two_workers, one_worker)
