"""The rule that decides whether a new model may be pushed: pure Python, no TFX, no TensorFlow.

A model is **blessed** (TFX's word: the Pusher may push it) when its sacreBLEU BLEU on
ExampleGen's eval split

1. clears an absolute floor, ``score >= floor`` (``tfx.bleu_floor``; catches a diverged or empty
   model even on the first run, when there is nothing to compare with), and
2. does not fall more than a margin below the last blessed model, ``score >= baseline - margin``
   (``tfx.bleu_margin``, in BLEU points; the baseline is re-scored on the same sentences, so a
   changed eval split does not favour either model). Without a baseline (the pipeline's first
   blessed model) only the floor applies.

A score that is not a finite number is never blessed. :func:`decide` returns the decision with a
one-line reason, which the evaluation component stores on its ``ModelBlessing`` artifact and
``aiayn tfx-run`` prints.

Example::

    decide(23.4, floor=1.0, margin=1.0, baseline=24.0).blessed   # True: within 1.0 of 24.0
    decide(3.1, floor=1.0, margin=1.0, baseline=24.0).reason
    # 'not blessed: BLEU 3.10 is 20.90 below the last blessed model's 24.00 (allowed: ...)'

The names TFX gives blessing artifacts' properties and marker files are here too, so the
components (pipeline/tfx/components.py) and the runner read and write the same ones.
"""

from __future__ import annotations

import dataclasses
import math

from aiayn.pipeline.errors import UserInputError

# Custom properties of ModelBlessing / InfraBlessing that TFX itself reads: the Pusher pushes
# only when `blessed` is 1 on both (tfx.components.util.model_utils); LatestBlessedModelStrategy
# pairs a blessing with its model through `current_model_id`.
BLESSED_KEY = "blessed"
CURRENT_MODEL_KEY, CURRENT_MODEL_ID_KEY = "current_model", "current_model_id"
BASELINE_MODEL_KEY, BASELINE_MODEL_ID_KEY = "baseline_model", "baseline_model_id"
REASON_KEY = "reason"
# Marker files in the artifact's directory, as TFX's Evaluator and InfraValidator write them.
MODEL_BLESSING_FILES = {True: "BLESSED", False: "NOT_BLESSED"}
INFRA_BLESSING_FILES = {True: "INFRA_BLESSED", False: "INFRA_NOT_BLESSED"}
# The metrics file written next to the marker (JSON).
EVALUATION_FILE = "evaluation.json"
INFRA_FILE = "infra_check.json"

METRIC = "BLEU"


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of :func:`decide`.

    Attributes:
      blessed: whether the model may be pushed.
      reason: one line saying why (names the setting that decided it when not blessed).
      score: the new model's BLEU (NaN when it was not a number).
      floor: the absolute floor applied.
      margin: the margin applied below the baseline.
      baseline: the last blessed model's BLEU on the same sentences, or None (first model).
    """

    blessed: bool
    reason: str
    score: float
    floor: float
    margin: float
    baseline: float | None = None


def check_thresholds(floor: float, margin: float) -> None:
    """Raises a :class:`UserInputError` naming the setting when a threshold is out of range.

    Both are BLEU points on sacreBLEU's 0-100 scale: ``0 <= floor <= 100``, ``0 <= margin <= 100``.
    """
    for name, value in (("tfx.bleu_floor", floor), ("tfx.bleu_margin", margin)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not 0 <= value <= 100:
            raise UserInputError(f"`{name}` must be a number of BLEU points in [0, 100]; got "
                                 f"{value!r}. Set it with --set {name}=VALUE.")


def decide(score: float, floor: float, margin: float, baseline: float | None = None
           ) -> Decision:
    """Applies the floor and the margin below the last blessed model's score.

    Args:
      score: the new model's sacreBLEU BLEU (0-100) on the eval sentences.
      floor: the least BLEU any pushed model must reach (``tfx.bleu_floor``).
      margin: how many BLEU points the new model may lose against the baseline
        (``tfx.bleu_margin``).
      baseline: the last blessed model's BLEU on the same sentences; None when there is none.

    Returns:
      A :class:`Decision`.

    Raises:
      UserInputError: ``floor`` or ``margin`` outside [0, 100].
    """
    check_thresholds(floor, margin)
    floor, margin = float(floor), float(margin)
    base = None if baseline is None else float(baseline)

    def result(blessed: bool, reason: str) -> Decision:
        number = float(score) if isinstance(score, (int, float)) else math.nan
        return Decision(blessed=blessed, reason=reason, score=number, floor=floor,
                        margin=margin, baseline=base)

    if not isinstance(score, (int, float)) or not math.isfinite(score):
        return result(False, f"not blessed: {METRIC} is {score!r}, not a finite number (the "
                             "model's output could not be scored)")
    if score < floor:
        return result(False, f"not blessed: {METRIC} {score:.2f} is below the floor "
                             f"tfx.bleu_floor={floor:g}")
    if base is None:
        return result(True, f"blessed: {METRIC} {score:.2f} >= the floor tfx.bleu_floor="
                            f"{floor:g}; no blessed model to compare with yet")
    if not math.isfinite(base):
        return result(True, f"blessed: {METRIC} {score:.2f} >= the floor tfx.bleu_floor="
                             f"{floor:g}; the last blessed model could not be scored "
                             f"({base!r})")
    if score < base - margin:
        return result(False, f"not blessed: {METRIC} {score:.2f} is {base - score:.2f} below the "
                             f"last blessed model's {base:.2f} (allowed: tfx.bleu_margin="
                             f"{margin:g})")
    return result(True, f"blessed: {METRIC} {score:.2f} >= the floor tfx.bleu_floor={floor:g} "
                        f"and within tfx.bleu_margin={margin:g} of the last blessed model's "
                        f"{base:.2f}")
