"""Every command turns an expected failure into ONE line on stderr, exit status 2, no traceback.

The contract (``aiayn.pipeline.cli.main``): a bad config value, a missing export, a failed
verification or an unreadable file is a user-input error; the command prints exactly one line
``aiayn <command>: ...`` that names the thing (path, field or value) and the fix, and returns 2.

``CASES`` holds at least one realistic bad input per command (``test_every_command_has_a_case``
fails when a command is added without one); ``CONFIG_CASES`` are the bad settings every command
shares, tried on each command. Most cases run in-process through ``main([...])``; a few run as a
real ``python -m aiayn.pipeline.cli`` process to show that no traceback reaches the terminal.

Every path setting points into ``tmp_path``; nothing is written to the repository.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from aiayn.pipeline.cli import build_parser, main

# The conftest trains its toy vocabulary with data.vocab_size=200; cases that load it say so too.
VOCAB_SETTINGS = ["--set", "data.vocab_size=200"]


def _path_settings(tmp: Path) -> list[str]:
    """The tiny preset, with every path setting inside `tmp`."""
    return ["--preset", "tiny",
            "--set", f"data.data_dir={tmp / 'data'}",
            "--set", f"data.corpus={tmp / 'corpus.tsv'}",
            "--set", f"train.run_dir={tmp / 'run'}",
            "--set", f"export.base_dir={tmp / 'exports'}"]


# --------------------------------------------------------------------------------------------
# Setups: each gets (tmp_path, request) and lays out the bad input.
# --------------------------------------------------------------------------------------------

def _toy_data(tmp: Path, request, vocab: bool = True) -> None:
    """`tmp/data` with the conftest's train/dev/test.tsv (and its trained spm.model)."""
    source = Path(request.getfixturevalue("spm_model_path" if vocab else "toy_data_dir"))
    source_dir = source.parent if vocab else source
    (tmp / "data").mkdir(parents=True, exist_ok=True)
    for f in source_dir.iterdir():
        if f.name.endswith(".tsv") or (vocab and f.name.startswith("spm.")):
            shutil.copy(f, tmp / "data" / f.name)


def _not_hdf5(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("this is not an HDF5 file\n", encoding="utf-8")


def _weights_of_another_config(tmp: Path, request) -> None:
    """`tmp/other.weights.h5`: the toy vocabulary, but model.num_layers=1 (tiny has 2)."""
    _toy_data(tmp, request)
    from aiayn.pipeline.config import load_config
    from aiayn.pipeline.training.artifacts import build_model, load_tokenizer, save_model_weights

    cfg = load_config(["tiny"], [f"data.data_dir={tmp / 'data'}", "data.vocab_size=200",
                                 "model.num_layers=1"])
    save_model_weights(build_model(cfg, load_tokenizer(cfg)), tmp / "other.weights.h5")


def _export_card(tmp: Path, request) -> None:
    card = tmp / "exports" / "translate" / "1" / "assets.extra" / "model_card.md"
    card.parent.mkdir(parents=True)
    card.write_text("# Model card\n", encoding="utf-8")
    (tmp / "card_dir").mkdir()


def _fake_saved_model(tmp: Path, request) -> None:
    version = tmp / "exports" / "translate" / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"not a SavedModel protobuf")


def _failing_report(tmp: Path, request) -> None:
    """verify_export reports problems (as for an export with a py_function op)."""
    _fake_saved_model(tmp, request)
    from aiayn.export import verify

    def fake_verify(path, *args, **kwargs):
        return verify.VerifyReport(
            export_dir=str(path), ops={"EagerPyFunc": "unknown"}, signatures={},
            problems=["op EagerPyFunc is a Python callback; the model server cannot run it"],
            signature_text="", outputs={}, texts=[])

    request.getfixturevalue("monkeypatch").setattr(verify, "verify_export", fake_verify)


def _child_process_crash(tmp: Path, request) -> None:
    """verify_export's child process died: its stderr (with a traceback) is in the message."""
    _fake_saved_model(tmp, request)
    from aiayn.export import verify

    def fake_verify(path, *args, **kwargs):
        raise verify.VerificationError(
            f"The fresh process could not load/run {path} (exit 1):\n"
            "Traceback (most recent call last):\n  File \"<string>\", line 21, in <module>\n"
            "google.protobuf.message.DecodeError: Error parsing message with type "
            "'tensorflow.SavedModel': Wire format was corrupt\n")

    request.getfixturevalue("monkeypatch").setattr(verify, "verify_export", fake_verify)


def _no_model_server(tmp: Path, request) -> None:
    if shutil.which("tensorflow_model_server"):
        pytest.skip("tensorflow_model_server is installed here")
    (tmp / "exports" / "translate").mkdir(parents=True)


def _no_tfx(tmp: Path, request) -> None:
    if importlib.util.find_spec("tfx") is not None:
        pytest.skip("TFX is importable in this Python")


def _bad_yaml(tmp: Path, request) -> None:
    (tmp / "preset.yaml").write_text("model:\n  num_layers: [1, 2\n", encoding="utf-8")


class Case(NamedTuple):
    command: str
    args: list[str]           # after the command and the path settings; `{tmp}`, `{data}` expand
    expect: str               # a substring of the error line that names the thing
    setup: Callable | None = None
    slow: bool = False


def _mkdir(*parts: str) -> Callable:
    return lambda tmp, request: (tmp.joinpath(*parts)).mkdir(parents=True)


def _write(text: str, *parts: str) -> Callable:
    def setup(tmp, request):
        tmp.joinpath(*parts).parent.mkdir(parents=True, exist_ok=True)
        tmp.joinpath(*parts).write_text(text, encoding="utf-8")
    return setup


def _all(*setups: Callable) -> Callable:
    return lambda tmp, request: [s(tmp, request) for s in setups]


_TOY = lambda tmp, request: _toy_data(tmp, request)  # noqa: E731
_TOY_NO_VOCAB = lambda tmp, request: _toy_data(tmp, request, vocab=False)  # noqa: E731

CASES: dict[str, Case] = {
    # data
    "data-missing-corpus": Case("data", ["--set", "data.corpus={tmp}/nonexistent.tsv"],
                                "nonexistent.tsv"),
    "data-directory-as-tsv": Case("data", ["--set", "data.format=tsv"], "corpus.tsv",
                                  _mkdir("corpus.tsv")),
    "data-line-without-tab": Case("data", ["--set", "data.format=tsv"], "corpus.tsv",
                                  _write("no tab on this line\n", "corpus.tsv")),
    # vocab
    "vocab-no-train-split": Case("vocab", [], "train.tsv", _mkdir("data")),
    "vocab-malformed-train-split": Case("vocab", [], "train.tsv:1",
                                        _write("no tab here\n", "data", "train.tsv")),
    # train
    "train-without-prepared-data": Case("train", [], "spm.model"),
    # average
    "average-no-checkpoints": Case("average", VOCAB_SETTINGS, "checkpoints", _TOY),
    "average-damaged-checkpoint": Case(
        "average", VOCAB_SETTINGS, "ckpt-00000010.weights.h5",
        _all(_TOY, lambda tmp, r: _not_hdf5(tmp / "run/checkpoints/ckpt-00000010.weights.h5"))),
    # evaluate
    "evaluate-no-weights": Case("evaluate", VOCAB_SETTINGS, "final.weights.h5", _TOY),
    "evaluate-no-data": Case("evaluate", ["--split", "test"], "test.tsv"),
    "evaluate-weights-not-hdf5": Case(
        "evaluate", [*VOCAB_SETTINGS, "--weights", "{tmp}/bad.weights.h5"], "bad.weights.h5",
        _all(_TOY, lambda tmp, r: _not_hdf5(tmp / "bad.weights.h5"))),
    "evaluate-weights-not-a-weights-file": Case(  # Keras reads by suffix; it would fail inside
        "evaluate", [*VOCAB_SETTINGS, "--weights", "{tmp}/run/averaging.json"],
        "averaging.json is not a .weights.h5 file",
        _all(_TOY, _write("{}\n", "run", "averaging.json"))),
    "evaluate-weights-of-another-config": Case(
        "evaluate", [*VOCAB_SETTINGS, "--weights", "{tmp}/other.weights.h5"],
        "other.weights.h5 does not fit the model", _weights_of_another_config),
    # export
    "export-no-weights": Case("export", VOCAB_SETTINGS, "final.weights.h5", _TOY),
    "export-weights-not-hdf5": Case(
        "export", VOCAB_SETTINGS, "final.weights.h5",
        _all(_TOY, lambda tmp, r: _not_hdf5(tmp / "run" / "final.weights.h5"))),
    # serve
    "serve-no-export": Case("serve", [], "exports/translate"),
    "serve-tfs-not-installed": Case("serve", ["--backend", "tfs"], "tensorflow_model_server",
                                    _no_model_server),
    # translate
    "translate-missing-export-dir": Case("translate", ["--export", "{tmp}/nope", "Hello."],
                                         "nope"),
    "translate-no-export-yet": Case("translate", ["Hello."], "exports/translate"),
    "translate-export-without-savedmodel": Case(
        "translate", ["--export", "{tmp}/exports/translate/1", "Hello."], "No SavedModel",
        _mkdir("exports", "translate", "1")),
    "translate-explain-without-weights": Case(
        "translate", ["--explain", "{tmp}/attention.png", "Hello."], "final.weights.h5"),
    "translate-explain-weights-directory": Case(
        "translate", ["--explain", "{tmp}/attention.png", "--weights", "{tmp}/run", "Hello."],
        "run is a directory", _mkdir("run")),
    # verify
    "verify-no-savedmodel": Case("verify", ["--export", "{tmp}/empty"], "holds no SavedModel",
                                 _mkdir("empty")),
    "verify-report-with-problems": Case("verify", [], "EagerPyFunc", _failing_report),
    "verify-child-process-crash": Case("verify", [], "Wire format was corrupt",
                                       _child_process_crash),
    # model-card
    "model-card-missing-export": Case("model-card", ["--export", "{tmp}/nope"], "nope"),
    "model-card-output-is-a-directory": Case(
        "model-card", ["--export", "{tmp}/exports/translate", "--output", "{tmp}/card_dir"],
        "card_dir", _export_card),
    # plot-curves
    "plot-curves-empty-run-dir": Case("plot-curves", ["--run-dir", "{tmp}/empty"],
                                      "No training history", _mkdir("empty")),
    # plot-positional-encoding
    "plot-positional-encoding-odd-dim": Case("plot-positional-encoding",
                                             ["{tmp}/pe.png", "--dim", "7"], "dim=7"),
    "plot-positional-encoding-no-positions": Case("plot-positional-encoding",
                                                  ["{tmp}/pe.png", "--length", "0"], "length=0"),
    # tfx
    "tfx-data-missing-corpus": Case("tfx-data", ["--set", "data.corpus={tmp}/nonexistent.tsv"],
                                    "nonexistent.tsv"),
    "tfx-run-without-tfx": Case("tfx-run", ["--tfx-dir", "{tmp}/tfx"], "TFX is not importable",
                                _no_tfx),
    "tfx-compile-without-tfx": Case(
        "tfx-compile", ["--output", "{tmp}/pipeline.json", "--pipeline-root", "gs://b/tfx",
                        "--examples", "gs://b/examples", "--push-dir", "gs://b/serving",
                        "--image", "example.com/aiayn:1"], "TFX is not importable", _no_tfx),
    # run
    "run-unknown-stage": Case("run", ["--stages", "data,bogus"], "bogus"),
    "run-stage-error": Case("run", ["--stages", "data", "--set",
                                    "data.corpus={tmp}/nonexistent.tsv"], "nonexistent.tsv"),
}

# Bad settings every command shares: (extra arguments, substring naming the field or value).
CONFIG_CASES = {
    "num_heads-zero": (["--set", "model.num_heads=0"], "model.num_heads"),
    "unknown-key": (["--set", "model.nope=1"], "model.nope"),
    "steps-not-an-integer": (["--set", "train.steps=abc"], "train.steps"),
    "unknown-preset": (["--preset", "nosuch"], "nosuch"),
    "steps_per_epoch-zero": (["--set", "train.steps_per_epoch=0"], "train.steps_per_epoch"),
    "preset-invalid-yaml": (["--preset", "{tmp}/preset.yaml"], "preset.yaml: invalid YAML"),
}

# Arguments a command cannot parse without (the config error comes before they are used).
REQUIRED_ARGS = {
    "plot-positional-encoding": ["{tmp}/pe.png"],
    "tfx-compile": ["--pipeline-root", "gs://b/tfx", "--examples", "gs://b/examples",
                    "--push-dir", "gs://b/serving", "--image", "example.com/aiayn:1"],
}


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices)


def _expand(args: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in args]


def _check_one_line(command: str, rc: int, err: str, expect: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, f"exit status {rc}, not 2; stderr:\n{err}"
    assert "Traceback" not in err, f"a traceback reached stderr:\n{err}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr, not one:\n{err}"
    assert lines[0].startswith(f"aiayn {command}: "), lines[0]
    assert expect in lines[0], f"{expect!r} not named in: {lines[0]}"
    return lines[0]


def _params():
    for name, case in CASES.items():
        marks = [pytest.mark.slow] if case.slow else []
        yield pytest.param(case, id=name, marks=marks)


def test_every_command_has_a_case():
    covered = {case.command for case in CASES.values()}
    missing = [c for c in _commands() if c not in covered]
    assert not missing, f"commands without a bad-input case in CASES: {missing}"


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_one_line_and_exit_status_2(case, tmp_path, request, capsys):
    if case.setup:
        case.setup(tmp_path, request)
    argv = [case.command, *_path_settings(tmp_path), *_expand(case.args, tmp_path)]
    rc = main(argv)
    _check_one_line(case.command, rc, capsys.readouterr().err, case.expect)


@pytest.mark.parametrize("command", _commands())
@pytest.mark.parametrize("setting", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_bad_config_is_one_line_for_every_command(command, setting, tmp_path, capsys):
    extra, expect = setting
    _bad_yaml(tmp_path, None)
    argv = [command, *_path_settings(tmp_path), *_expand(extra, tmp_path),
            *_expand(REQUIRED_ARGS.get(command, []), tmp_path)]
    rc = main(argv)
    line = _check_one_line(command, rc, capsys.readouterr().err, expect)
    assert line.startswith(f"aiayn {command}: configuration error: "), line


# --------------------------------------------------------------------------------------------
# As the user sees it: a real process, stderr as the terminal gets it.
# --------------------------------------------------------------------------------------------

def _run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "aiayn.pipeline.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _check_process(command: str, proc: subprocess.CompletedProcess, expect: str) -> None:
    # TensorFlow's C++ logging may still write a line or two of its own; ours start "aiayn ".
    ours = [line for line in proc.stderr.splitlines() if line.startswith("aiayn ")]
    assert proc.returncode == 2, f"exit status {proc.returncode}; stderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, f"a traceback reached the terminal:\n{proc.stderr}"
    assert len(ours) == 1, f"expected one `aiayn` line on stderr:\n{proc.stderr}"
    assert ours[0].startswith(f"aiayn {command}: ") and expect in ours[0], ours[0]


@pytest.mark.parametrize("extra, expect", [
    (["--set", "model.num_heads=0"], "model.num_heads"),  # was a ZeroDivisionError traceback
    (["--preset", "{tmp}/preset.yaml"], "invalid YAML at line"),  # was a 7-line YAML dump
], ids=["num_heads-zero", "invalid-yaml-preset"])
def test_config_errors_in_a_real_process(extra, expect, tmp_path):
    _bad_yaml(tmp_path, None)
    proc = _run_cli(["data", *_path_settings(tmp_path), *_expand(extra, tmp_path)], tmp_path)
    _check_process("data", proc, expect)


@pytest.mark.slow  # two TensorFlow start-ups (this process and verify's fresh child)
def test_failed_verification_in_a_real_process(tmp_path):
    """The child's traceback (a corrupt saved_model.pb) becomes one line naming the export."""
    _fake_saved_model(tmp_path, None)
    proc = _run_cli(["verify", *_path_settings(tmp_path)], tmp_path)
    _check_process("verify", proc, "exports/translate/1 failed verification")
