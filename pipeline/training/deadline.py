"""A deadline for the whole job: training gets the time the deadline leaves.

``make train`` must end within its minutes on every machine, but the stages after training
(choosing the final weights on dev, scoring dev and test, exporting and verifying the
SavedModel) took 1.5 minutes on an AMX Xeon and 3.6 on an AVX2 EPYC. A fixed
``train.max_minutes`` must leave the slowest machine's time on every machine. With
``train.deadline_minutes`` the budget is instead what is left of the deadline after a reserve
for those stages, and the reserve is the machine's own: the dev evaluations during training
time the decoder, and the stages after training are mostly decoding (:func:`reserve_seconds`).

The budget is set when training starts (with a conservative reserve until the decoder has been
timed: the first dev evaluation also traces it, so the second is the first timing) and set
again after each dev evaluation while less than half of it is spent: the
learning rate's cool-down and late dropout read the budget's share later in the run, and a
budget that moved under them would jolt the one and retrace the other.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import keras

from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.training.callbacks import TrainingClock

# The stages after training, counted in dev sentences decoded at beam size: export and
# verification (tracing the serving graph, saving, loading and translating) cost about as
# much as decoding 2,000 sentences (20 s on the Xeon, 56 s on the AVX2 EPYC).
EXPORT_SENTENCES = 2000
# The reserve is the estimate times SAFETY plus SLACK_S: a run decodes longer hypotheses late
# than early, and the host's load moves every stage (estimate 57 s, measured 86 s on the Xeon).
SAFETY = 1.5
SLACK_S = 30.0
# Until the decoder has been timed: the slowest machine's stages after training (3.6 min).
FIRST_RESERVE_S = 360.0
# The budget is not moved once this share of it is spent (the cool-down starts at 0.8).
REPLAN_UNTIL = 0.5
# Less training than this is an error, not a run.
MIN_TRAINING_S = 60.0


def reserve_seconds(seconds_per_sentence: float, sentences_after: int) -> float:
    """The time to keep for the stages after training, from the decoder's measured speed.

    Args:
      seconds_per_sentence: one dev sentence's share of a timed dev evaluation.
      sentences_after: the sentences those stages decode (each candidate for the final weights
        on its dev pairs, then test, and dev unless the candidates covered it:
        ``train.sentences_after_training``).
    """
    return SAFETY * seconds_per_sentence * (sentences_after + EXPORT_SENTENCES) + SLACK_S


class Deadline(keras.callbacks.Callback):
    """Sets the clock's time budget to what ends the job by ``deadline_at`` (wall clock).

    Args:
      clock: the run's :class:`TrainingClock`; its ``budget_seconds`` is what this sets.
      deadline_at: ``time.time()`` by which the whole job should have ended.
      sentences_after: the sentences the stages after training decode (:func:`reserve_seconds`).
      sample_size: the dev evaluation's sentences, whose timings ``timings`` returns.
      timings: returns the dev evaluations so far, ``[{"step", "seconds"}, ...]``.
      cap_minutes: the budget's upper bound (``train.max_minutes``; 0 = none).
      stream: where the budget's changes are logged.

    Raises (at ``on_train_begin``):
      UserInputError: the deadline leaves less than a minute of training.
    """

    def __init__(self, clock: TrainingClock, deadline_at: float, sentences_after: int,
                 sample_size: int, timings: Callable[[], list[dict]],
                 cap_minutes: float = 0.0, stream=None):
        super().__init__()
        self.clock = clock
        self.deadline_at = float(deadline_at)
        self.sentences_after = int(sentences_after)
        self.sample_size = max(1, int(sample_size))
        self.timings = timings
        self.cap_seconds = float(cap_minutes) * 60.0
        self.stream = stream or sys.stdout
        self.reserve_s = FIRST_RESERVE_S
        self._timed = 0

    def budget_for(self, reserve_s: float) -> float:
        """The training budget (all attempts) that leaves ``reserve_s`` before the deadline."""
        budget = self.clock.elapsed() + self.deadline_at - time.time() - reserve_s
        return min(budget, self.cap_seconds) if self.cap_seconds else budget

    def on_train_begin(self, logs=None):
        self._timed = len(self.timings())
        budget = self.budget_for(self.reserve_s)
        if budget - self.clock.elapsed() < MIN_TRAINING_S:
            left = (self.deadline_at - time.time()) / 60.0
            raise UserInputError(
                f"train.deadline_minutes leaves {max(left, 0.0):.1f} min for training and the "
                f"stages after it, which need about {self.reserve_s / 60.0:.1f} min here: less "
                "than a minute of training. Raise train.deadline_minutes, or set it to 0 and "
                "bound the run with train.max_minutes or train.steps.")
        self._set(budget, "until the decoder is timed, a reserve of "
                  f"{self.reserve_s / 60.0:.1f} min for the stages after training")

    def on_train_batch_end(self, batch, logs=None):
        timings = self.timings()
        if len(timings) == self._timed:
            return
        self._timed = len(timings)
        if len(timings) < 2 or self.clock.share() >= REPLAN_UNTIL:
            return
        per_sentence = _recent_seconds(timings) / self.sample_size
        self.reserve_s = reserve_seconds(per_sentence, self.sentences_after)
        # Never so short that the spent share passes REPLAN_UNTIL: the schedule would jump.
        budget = max(self.budget_for(self.reserve_s), self.clock.elapsed() / REPLAN_UNTIL)
        self._set(budget, f"{per_sentence * 1000:.0f} ms a dev sentence: a reserve of "
                  f"{self.reserve_s / 60.0:.1f} min for the stages after training")

    def _set(self, budget_s: float, why: str) -> None:
        if abs(budget_s - self.clock.budget_seconds) < 1.0:
            return
        self.clock.budget_seconds = budget_s
        capped = " (train.max_minutes)" if budget_s == self.cap_seconds else ""
        self.stream.write(f"time budget {budget_s / 60.0:.1f} min{capped}: {why}.\n")
        self.stream.flush()


def _recent_seconds(timings: list[dict]) -> float:
    """The median of the last three dev evaluations' seconds, leaving out the first (it traces
    the decoder: 8 s against 2-3 s on the Xeon): one evaluation slowed by the host moves
    nothing."""
    recent = sorted(float(t["seconds"]) for t in timings[1:][-3:])
    return recent[len(recent) // 2]
