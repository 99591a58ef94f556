"""TensorFlow's start-up settings: oneDNN on unless the user chose, never after TF loaded."""

import subprocess
import sys

from aiayn.pipeline.tf_runtime import ONEDNN, onednn_setting, prepare_tensorflow


def test_onednn_turned_on_before_tensorflow_loads():
    environ = {}
    assert prepare_tensorflow(environ, modules={}) is True
    assert environ == {ONEDNN: "1"} and onednn_setting(environ) == "on"


def test_the_users_choice_wins():
    environ = {ONEDNN: "0"}
    assert prepare_tensorflow(environ, modules={}) is True
    assert environ == {ONEDNN: "0"} and onednn_setting(environ) == "off"


def test_nothing_changes_once_tensorflow_is_loaded():
    environ = {}
    assert prepare_tensorflow(environ, modules={"tensorflow": object()}) is False
    assert environ == {} and onednn_setting(environ) == "default"


def test_the_cli_sets_it_before_tensorflow_reads_it():
    """`aiayn` imports TensorFlow only in its handlers, after main() prepared it."""
    code = ("import os, sys\n"
            "os.environ.pop('TF_ENABLE_ONEDNN_OPTS', None)\n"
            "from aiayn.pipeline import cli\n"
            "assert 'tensorflow' not in sys.modules\n"
            "try:\n    cli.main(['data', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1"
