"""Imports go one way (ARCHITECTURE.md): pipeline -> export -> models; Keras 3 only."""

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
# Only the tokenizer wrapper in models/ touches TensorFlow directly; layers, losses and decoding
# use keras.ops (the same code traces under tf.function and XLA).
TF_ALLOWED_IN_MODELS = {"tokenizer.py"}


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, [alias.name.split(".")[-1]]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}:{node.lineno}: use absolute `aiayn.` imports")
            yield node.lineno, node.module or "", [a.name for a in node.names]


def _sources(package):
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package):
    problems = []
    for path in _sources(package):
        for line, module, names in _imports(path):
            if module.startswith("aiayn."):
                target = module.split(".")[1]
                if target not in ALLOWED[package]:
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
                if target != package and any(n.startswith("_") for n in names):
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports a private name "
                                    f"of {module}: {names}")
            elif module.split(".")[0] in PACKAGES:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module!r}: "
                                "use the aiayn. namespace")
    assert not problems, "\n".join(problems)


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
