"""Imports go one way (docs/ARCHITECTURE.md): pipeline -> export -> models; inside pipeline/, a
stage imports only earlier stages; Keras 3 only.

Every import form counts: ``import aiayn.x``, ``from aiayn.x import y``, ``from aiayn import x``,
``from aiayn.pipeline import stage``, imports inside functions, and ``importlib.import_module`` /
``__import__`` (which the code may not use with our modules at all: a string hides an import from
this test).
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "export", "pipeline")
# What each package may import of ours.
ALLOWED = {
    "models": {"models"},
    "export": {"models", "export"},
    "pipeline": {"models", "export", "pipeline"},
}
# Only the text modules of models/ (the tokenizer wrapper, the protected-span split) touch
# TensorFlow directly; layers, losses and decoding use keras.ops (the same code traces under
# tf.function and XLA).
TF_ALLOWED_IN_MODELS = {"tokenizer.py", "protect.py"}

# pipeline/, bottom to top: a module may import modules of its own rank or below.
FOUNDATION = {"errors", "fileio", "config", "tf_runtime"}
STAGES = ("data", "training", "evaluation", "release", "tfx")
TOP = {"cli", "run", "tfx_module"}


def _rank(module: str) -> int:
    """Rank of an ``aiayn.pipeline...`` module (or package) in the stage order."""
    parts = module.split(".")[2:]  # after aiayn.pipeline
    if not parts:
        return len(STAGES) + 1  # `aiayn.pipeline` itself: everything (top only)
    head = parts[0]
    if head in FOUNDATION:
        return 0
    if head in STAGES:
        return 1 + STAGES.index(head)
    if head in TOP:
        return len(STAGES) + 1
    raise AssertionError(f"{module}: not in the stage map of tests/test_layering.py; add it to "
                         "FOUNDATION, STAGES or TOP")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["aiayn", *parts])


def _imports(path: Path):
    """``(line, imported module, imported names)`` for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, [alias.name.split(".")[-1]]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: use absolute `aiayn.` imports")
            module = node.module or ""
            for alias in node.names:
                # `from aiayn.pipeline import data` imports the module aiayn.pipeline.data.
                yield node.lineno, f"{module}.{alias.name}", [alias.name]
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith(("import_module", "__import__")):
                yield node.lineno, "<dynamic>", [name]


def _sources(package):
    return sorted((ROOT / package).rglob("*.py"))


def _ours(module: str) -> bool:
    return module.startswith("aiayn.") or module.split(".")[0] in PACKAGES


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package):
    problems = []
    for path in _sources(package):
        where = path.relative_to(ROOT)
        for line, module, names in _imports(path):
            if module == "<dynamic>":
                problems.append(f"{where}:{line} calls {names[0]}: import our modules by name "
                                "(a string hides the import from the layering check)")
                continue
            if not _ours(module):
                continue
            if not module.startswith("aiayn."):
                problems.append(f"{where}:{line} imports {module!r}: use the aiayn. namespace")
                continue
            target = module.split(".")[1] if module.count(".") else ""
            if target not in ALLOWED[package]:
                problems.append(f"{where}:{line} imports {module}")
            if target != package and any(n.startswith("_") for n in names):
                problems.append(f"{where}:{line} imports a private name of {module}: {names}")
    assert not problems, "\n".join(problems)


def test_pipeline_stages_import_only_earlier_stages():
    problems = []
    for path in _sources("pipeline"):
        own = _module_name(path)
        if own == "aiayn.pipeline":
            continue
        for line, module, _ in _imports(path):
            if not module.startswith("aiayn.pipeline"):
                continue
            if module.rsplit(".", 1)[0] == "aiayn.pipeline" and module.rsplit(".", 1)[1] in (
                    "__init__",):
                continue
            if _rank(module) > _rank(own):
                problems.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {module}, a "
                                "later stage")
    assert not problems, ("stages import only earlier stages (data -> training -> evaluation -> "
                          "release -> tfx; cli/run on top):\n" + "\n".join(problems))


def test_stage_map_covers_every_module():
    for path in _sources("pipeline"):
        name = _module_name(path)
        if name != "aiayn.pipeline":
            _rank(name)  # raises for a module the map does not place


def test_layering_check_catches_the_forms_it_claims(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from aiayn import pipeline\nfrom aiayn.pipeline import release\n"
                     "import importlib\nm = importlib.import_module('aiayn.pipeline.cli')\n"
                     "def f():\n    from aiayn.pipeline.tfx.runners import run_local\n")
    found = [(line, module) for line, module, _ in _imports(probe)]
    assert (1, "aiayn.pipeline") in found and (2, "aiayn.pipeline.release") in found
    assert (4, "<dynamic>") in found and (6, "aiayn.pipeline.tfx.runners.run_local") in found
    assert _rank("aiayn.pipeline.release") > _rank("aiayn.pipeline.data.corpus")
    assert _rank("aiayn.pipeline") > _rank("aiayn.pipeline.tfx.trainer")


@pytest.mark.parametrize("package", PACKAGES)
def test_keras_3_only(package):
    pattern = re.compile(r"\btf\.keras\b|\btensorflow\.keras\b|\btf_keras\b")
    problems = []
    for path in _sources(package):
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = text.split("#", 1)[0]
            if pattern.search(code):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()}")
        for line, module, _ in _imports(path):
            if module.startswith(("tensorflow.keras", "tf_keras")):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not problems, "use `import keras` (Keras 3), never tf.keras:\n" + "\n".join(problems)


def test_models_layers_use_keras_ops_not_tensorflow():
    problems = []
    for path in _sources("models"):
        if path.name in TF_ALLOWED_IN_MODELS:
            continue
        for line, module, _ in _imports(path):
            if module.split(".")[0] in ("tensorflow", "tensorflow_text"):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not problems, "\n".join(problems)
