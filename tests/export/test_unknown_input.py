"""Unknown input is visible: `aiayn translate` warns when most of a sentence is unknown."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _translate(capsys, path, *args):
    from aiayn.pipeline.cli import main

    main(["translate", "--preset", "tiny", "--export", str(path), *args])
    captured = capsys.readouterr()
    return captured.out.splitlines(), captured.err


@pytest.mark.parametrize("n_best", [False, True])
def test_translate_warns_for_a_script_the_model_never_saw(exported, capsys, n_best):
    _, path = exported
    flags = ["--n-best"] if n_best else []
    out, err = _translate(capsys, path, *flags, "I love you.", "Привет мир", "我爱你",
                          "I love Привет")
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    # Input 2 is Cyrillic, unknown to the toy en->es vocabulary; 4 is 6 of 11 characters.
    assert warnings == [
        "warning: input 2: 100% of its characters are unknown to the model's vocabulary (a "
        "script or language it was not trained on; it translates en -> es): the output is a "
        "guess, not a translation.",
        "warning: input 4: 55% of its characters are unknown to the model's vocabulary (a "
        "script or language it was not trained on; it translates en -> es): the output is a "
        "guess, not a translation."]
    # Still translated (the warning goes to stderr, the output keeps one line per hypothesis).
    assert len(out) == 4 * (2 if n_best else 1)


def test_local_unknown_fractions_equal_the_n_best_signature(exported):
    from aiayn.export.client import LocalClient

    _, path = exported
    client = LocalClient(path)
    texts = ["I love you.", "Привет мир", "I love Привет", "", "我爱你"]
    served = [r.unknown_fraction for r in client.translate(texts, n_best=True)]
    assert client.unknown_fractions(texts) == pytest.approx(served)
    assert served == pytest.approx([0.0, 1.0, 6 / 11, 0.0, 0.0])
    assert [r.unknown_fraction for r in client.translate(texts)] == [None] * 5  # not said there
