"""The wheel holds the whole project and works when installed on its own (not editable).

One test, in steps (about a minute; most of it is importing TensorFlow):

1. Builds a wheel from a copy of the build inputs (pyproject.toml, README.md, the three package
   folders) in tmp_path, so a stale ``build/`` of the working tree cannot leak into it, and checks
   that setuptools printed no warning (no "Package would be ignored", no deprecated license).
2. Compares the wheel with the source folders: every ``.py`` file of ``pipeline/``, ``models/``
   and ``export/`` (sub-packages added later included) is in it, nothing else is, and the presets
   and scripts are there as package data.
3. Installs the wheel (``--no-deps``) into a fresh venv in tmp_path. The heavy dependencies
   (TensorFlow, ...) are not downloaded again: a ``.pth`` file adds the running environment's
   site-packages as plain ``sys.path`` entries. ``.pth`` files are only executed in site
   directories, so the dev venv's ``__editable__*aiayn*`` finder stays inactive and ``aiayn``
   resolves to the wheel only; the child process checks that too.
4. In that venv, with tmp_path as the working directory: imports every module of the installed
   ``aiayn`` tree, loads a preset from the installed package data, and runs the ``aiayn --help``
   console script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {"pipeline": "aiayn.pipeline", "models": "aiayn.models", "export": "aiayn.export"}
# Package data: source folder glob -> where it must land in the wheel.
DATA_GLOBS = ("pipeline/presets/*.yaml", "pipeline/scripts/*.sh")
# Modules allowed to fail at import time in a default (no extras) install, with the reason.
# Keep it empty unless a module really needs an optional extra when imported; the TFX stage
# (aiayn.pipeline.tfx.*, aiayn.pipeline.tfx_module) imports `tfx` lazily and must import here.
EXPECTED_IMPORT_FAILURES: dict[str, str] = {}
# What setuptools prints when the packaging config is off ("BuildBackendWarning",
# "SetuptoolsDeprecationWarning", "Package would be ignored"). pip's own "WARNING: ..."
# lines (about this machine's pip config) do not match.
SETUPTOOLS_WARNING = re.compile(r"\w+Warning\b|would be ignored")

_CHECK_INSTALLED = r"""
import importlib, json, sys, traceback
from pathlib import Path

purelib = Path(sys.argv[1]).resolve()
report = {"editable_hooks": [repr(f) for f in [*sys.meta_path, *sys.path_hooks]
                             if "editable" in repr(f).lower()],
          "modules": [], "failures": {}, "outside": {}}
root = purelib / "aiayn"
names = set()
for path in root.rglob("*.py"):
    parts = list(path.relative_to(purelib).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    names.add(".".join(parts))
for name in sorted(names):
    try:
        module = importlib.import_module(name)
    except BaseException:
        report["failures"][name] = traceback.format_exc(limit=3)
        continue
    report["modules"].append(name)
    origin = Path(module.__file__).resolve()
    if purelib not in origin.parents:
        report["outside"][name] = str(origin)
for package in ("aiayn", "aiayn.pipeline", "aiayn.models", "aiayn.export"):
    for entry in importlib.import_module(package).__path__:
        if Path(entry).resolve() != purelib.joinpath(*package.split(".")):
            report["outside"][package + " (__path__)"] = entry
if "aiayn.pipeline.config" in report["modules"]:
    config = importlib.import_module("aiayn.pipeline.config")
    report["presets"] = config.available_presets()
    config.load_config("tiny")
print("REPORT " + json.dumps(report))
"""


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def _run(cmd: list[str], *, cwd: Path, timeout: int = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return proc.stdout


def _build_isolation_args() -> list[str]:
    """``--no-build-isolation`` when this environment satisfies [build-system] requires
    (offline, faster); otherwise pip's default isolated build, which fetches them."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        import tomllib  # Python 3.11+
        from packaging.requirements import Requirement
    except ImportError:
        return []
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for spec in pyproject["build-system"]["requires"]:
        requirement = Requirement(spec)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            return []
        if not requirement.specifier.contains(installed, prereleases=True):
            return []
    return ["--no-build-isolation"]


def _source_files(root: Path, pattern: str) -> set[str]:
    """Wheel paths (aiayn/...) of the files matching `pattern` in the package folders."""
    files = set()
    for folder in PACKAGE_DIRS:
        for path in (root / folder).rglob(pattern):
            if "__pycache__" not in path.parts and path.is_file():
                files.add("aiayn/" + path.relative_to(root).as_posix())
    return files


def _copy_build_inputs(src: Path) -> Path:
    """pyproject.toml, README.md, the license and the package folders, without build debris."""
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for path in REPO.glob("LICEN[CS]E*"):
        shutil.copy2(path, src / path.name)
    for folder in PACKAGE_DIRS:
        shutil.copytree(REPO / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return src


def _build_wheel(src: Path, dist: Path) -> Path:
    """`pip wheel` of `src` into `dist`; fails on any setuptools warning."""
    log = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation_args(),
                "-w", dist, src], cwd=dist.parent)
    warnings = [line for line in log.splitlines() if SETUPTOOLS_WARNING.search(line)]
    assert not warnings, "setuptools warned while building the wheel:\n" + log
    (wheel,) = dist.glob("aiayn-*.whl")
    return wheel


def _wheel_contents(wheel: Path) -> tuple[list[str], str]:
    """The wheel's file names and its METADATA text."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(archive.read(n).decode() for n in names
                        if n.endswith(".dist-info/METADATA"))
    return names, metadata


def _package_data(src: Path) -> set[str]:
    """Wheel paths of the DATA_GLOBS files; each glob must match something."""
    expected_data = set()
    for pattern in DATA_GLOBS:
        matches = {"aiayn/" + p.relative_to(src).as_posix() for p in src.glob(pattern)}
        assert matches, f"no source files match {pattern}"
        expected_data |= matches
    return expected_data


def _install_into_fresh_venv(wheel: Path, venv: Path) -> tuple[Path, Path]:
    """A venv holding only the wheel, its dependencies reached through a .pth to this
    environment's site-packages; returns its scripts folder and its purelib."""
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = _python_in(bindir)
    get_purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(_run([python, "-I", "-c", get_purelib], cwd=venv.parent).strip())
    # Installed before the .pth exists, so pip sees no other aiayn to uninstall.
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--no-compile", wheel], cwd=venv.parent)
    dependency_dirs = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (purelib / "_aiayn_test_dependencies.pth").write_text("\n".join(dependency_dirs) + "\n")
    return bindir, purelib


def _python_in(bindir: Path) -> Path:
    return bindir / ("python.exe" if os.name == "nt" else "python")


def _import_report(bindir: Path, purelib: Path, cwd: Path) -> dict:
    """_CHECK_INSTALLED's report, from the venv's Python run in isolated mode in `cwd`."""
    out = _run([_python_in(bindir), "-I", "-c", _CHECK_INSTALLED, purelib], cwd=cwd)
    return json.loads(out.rsplit("REPORT ", 1)[1])


def _module_names(wheel_py_files: set[str]) -> set[str]:
    """aiayn/x/__init__.py -> aiayn.x, aiayn/x/y.py -> aiayn.x.y."""
    return {re.sub(r"(/__init__)?\.py$", "", n).replace("/", ".") for n in wheel_py_files}


def test_wheel_installs_and_imports_on_its_own(tmp_path):
    # 1. Build from a copy of the build inputs.
    src = _copy_build_inputs(tmp_path / "src")
    wheel = _build_wheel(src, tmp_path / "dist")

    # 2. The wheel against the source folders.
    names, metadata = _wheel_contents(wheel)
    payload = {n for n in names if n.startswith("aiayn/") and not n.endswith("/")}
    expected_py = _source_files(src, "*.py")
    assert {n for n in payload if n.endswith(".py")} == expected_py
    assert payload == expected_py | _package_data(src), "unexpected files in the wheel"
    assert "License-Expression: Apache-2.0" in metadata
    outside = [n for n in names if not n.startswith("aiayn/") and ".dist-info/" not in n]
    assert not outside, f"files outside aiayn/ in the wheel: {outside}"

    # 3. A fresh venv holding only the wheel; dependencies via a .pth to this environment.
    bindir, purelib = _install_into_fresh_venv(wheel, tmp_path / "venv")

    # 4. Import everything from the installed tree, outside the repository.
    report = _import_report(bindir, purelib, cwd=tmp_path)
    assert not report["editable_hooks"], report["editable_hooks"]
    unexpected = {k: v for k, v in report["failures"].items() if k not in EXPECTED_IMPORT_FAILURES}
    assert not unexpected, "modules that do not import from the wheel:\n" + "\n".join(
        f"--- {name}\n{tb}" for name, tb in unexpected.items())
    assert not report["outside"], f"imported from outside the wheel: {report['outside']}"
    assert set(report["modules"]) | set(report["failures"]) == _module_names(expected_py)
    assert set(report["presets"]) == {p.stem for p in src.glob("pipeline/presets/*.yaml")}

    help_text = _run([bindir / "aiayn", "--help"], cwd=tmp_path)
    assert "usage: aiayn" in help_text
