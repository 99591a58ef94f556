"""The whole job's deadline: the time budget is what it leaves (pipeline/training/deadline.py)."""

import dataclasses
import io

import pytest

from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.training import callbacks as cb
from aiayn.pipeline.training import deadline as dl

NOW = 1_000_000.0


class _Clock(cb.TrainingClock):
    """A training clock whose elapsed seconds the test sets."""

    def __init__(self, elapsed=0.0, budget_minutes=0.0):
        super().__init__(budget_minutes)
        self.now = float(elapsed)

    def elapsed(self):
        return self.now


@pytest.fixture
def wall(monkeypatch):
    """The wall clock the deadline reads, set by the test (``wall[0]``)."""
    now = [NOW]
    monkeypatch.setattr(dl.time, "time", lambda: now[0])
    return now


def _deadline(clock, minutes_left, timings, cap_minutes=0.0, after=3500, sample=200):
    stream = io.StringIO()
    deadline = dl.Deadline(clock, NOW + 60.0 * minutes_left, after, sample, lambda: timings,
                           cap_minutes=cap_minutes, stream=stream)
    return deadline, stream


def test_the_reserve_is_the_decoders_time_for_what_follows_training_with_a_margin():
    # 1.5 x 10 ms x (3,000 sentences + the export's 2,000) + 30 s.
    assert dl.reserve_seconds(0.01, 3000) == pytest.approx(105.0)
    assert dl.reserve_seconds(0.0, 0) == dl.SLACK_S


def test_the_budget_starts_with_the_slowest_machines_reserve_then_the_timed_one(wall):
    clock, timings = _Clock(), []
    deadline, stream = _deadline(clock, 40.0, timings)
    deadline.on_train_begin()
    assert clock.budget_seconds == 40 * 60.0 - dl.FIRST_RESERVE_S  # 34 min
    assert stream.getvalue() == ("time budget 34.0 min: until the decoder is timed, a reserve "
                                 "of 6.0 min for the stages after training.\n")

    # Two minutes later the first dev evaluation (200 sentences, 8 s: it traced the decoder):
    # not a timing of the decoder, so nothing moves.
    wall[0], clock.now = NOW + 120.0, 110.0
    timings.append({"step": 500, "seconds": 8.0})
    deadline.on_train_batch_end(0)
    assert clock.budget_seconds == 40 * 60.0 - dl.FIRST_RESERVE_S

    # The second one: 10 ms a sentence x (3 x 200 for the selection + 2,900 dev and test
    # + 2,000 for the export) x 1.5 + 30 s = 112.5 s.
    timings.append({"step": 1000, "seconds": 2.0})
    deadline.on_train_batch_end(1)
    reserve = 1.5 * 0.01 * 5500 + 30.0
    assert deadline.reserve_s == pytest.approx(reserve)
    assert clock.budget_seconds == pytest.approx(110.0 + 38 * 60.0 - reserve)
    assert stream.getvalue().splitlines()[-1] == (
        "time budget 38.0 min: 10 ms a dev sentence: a reserve of 1.9 min for the stages "
        "after training.")


def test_one_slow_evaluation_moves_nothing_and_nothing_moves_without_one(wall):
    clock = _Clock()
    timings = [{"step": 500, "seconds": 8.0}, {"step": 1000, "seconds": 2.0},
               {"step": 1500, "seconds": 2.0}]
    deadline, _ = _deadline(clock, 40.0, timings)
    deadline.on_train_begin()
    budget = clock.budget_seconds
    deadline.on_train_batch_end(0)  # no evaluation since the start: no change
    assert clock.budget_seconds == budget
    timings.append({"step": 2000, "seconds": 9.0})  # the host was busy for this one
    deadline.on_train_batch_end(1)
    assert deadline.reserve_s == pytest.approx(1.5 * 0.01 * 5500 + 30.0)  # the median, 2 s


def test_the_budget_is_capped_by_max_minutes_and_fixed_once_half_is_spent(wall):
    clock, timings = _Clock(), []
    deadline, stream = _deadline(clock, 44.0, timings, cap_minutes=37.0)
    deadline.on_train_begin()
    assert clock.budget_seconds == 37 * 60.0
    assert stream.getvalue().startswith("time budget 37.0 min (train.max_minutes): ")

    clock.now, wall[0] = 19 * 60.0, NOW + 19 * 60.0  # past half of the 37 minutes
    timings += [{"step": 500, "seconds": 100.0}, {"step": 1000, "seconds": 100.0}]
    deadline.on_train_batch_end(0)
    assert clock.budget_seconds == 37 * 60.0, "the cool-down reads this share: not moved"


def test_a_late_reserve_never_moves_the_spent_share_past_half(wall):
    # 10 minutes in, decoding turns out so slow that the deadline would leave 12 minutes of
    # training: the budget stops at 20 minutes (half spent), not at a share the schedule
    # would jump to.
    clock = _Clock(elapsed=600.0)
    timings = [{"step": 500, "seconds": 8.0}]
    deadline, _ = _deadline(clock, 30.0, timings)
    deadline.on_train_begin()
    wall[0] = NOW + 600.0
    timings.append({"step": 1000, "seconds": 60.0})  # 0.3 s a sentence: a 29-minute reserve
    deadline.on_train_batch_end(0)
    assert clock.budget_seconds == pytest.approx(1200.0)


def test_a_deadline_that_leaves_no_training_is_refused_with_the_fix(wall):
    clock = _Clock()
    deadline, _ = _deadline(clock, 6.5, [])
    with pytest.raises(UserInputError, match=r"train\.deadline_minutes leaves 6\.5 min for "
                       r"training and the stages after it, which need about 6\.0 min here: less "
                       r"than a minute of training\. Raise train\.deadline_minutes"):
        deadline.on_train_begin()


def test_a_resumed_run_keeps_the_minutes_it_trained_before(wall):
    # The budget counts all attempts: 20 minutes trained before, 30 left to the deadline.
    clock = _Clock(elapsed=1200.0)
    deadline, _ = _deadline(clock, 30.0, [])
    deadline.on_train_begin()
    assert clock.budget_seconds == 1200.0 + 30 * 60.0 - dl.FIRST_RESERVE_S


def test_the_callbacks_read_the_budget_the_deadline_moves():
    clock = _Clock(elapsed=90.0, budget_minutes=2.0)
    assert clock.share() == 0.75
    clock.budget_seconds = 180.0
    assert clock.share() == 0.5
    assert _Clock(elapsed=90.0).share() == 0.0  # no budget


def test_a_run_with_a_deadline_sets_its_budget_from_its_dev_evaluations(
        toy_config, spm_model_path, tmp_path, monkeypatch):
    from aiayn.pipeline.config import load_config
    from aiayn.pipeline.training import artifacts
    from aiayn.pipeline.training import train as train_lib

    made = []

    class Recorded(dl.Deadline):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(train_lib, "Deadline", Recorded)

    cfg = load_config(["tiny"], [f"data.data_dir={toy_config.data.data_dir}",
                                 "data.vocab_size=200", f"train.run_dir={tmp_path / 'run'}",
                                 "train.steps=12", "train.steps_per_epoch=4",
                                 "train.checkpoint_every=4", "train.eval_every=4",
                                 "train.eval_max_sentences=4", "train.dev_loss_every=0",
                                 "train.deadline_minutes=30", "train.lr_schedule=budget",
                                 "train.late_dropout=0.5"])
    stream = io.StringIO()
    summary = train_lib.train(cfg, stream=stream)
    log = stream.getvalue()
    assert summary["steps"] == 12 and summary["stop_reason"] == "steps"
    # Set at the start with the first reserve, then from the second evaluation's timing
    # (step 8): milliseconds a sentence here, so more than the first 24 minutes.
    assert "time budget 2" in log and "a reserve of 6.0 min" in log
    assert " ms a dev sentence: a reserve of " in log
    assert 30 * 60 - dl.FIRST_RESERVE_S < summary["time_budget_seconds"] < 30 * 60
    assert "time budget what ends the job 30 min after it started" in log
    # The reserve counts what follows training: three candidates on every dev pair (the
    # selection, whose kept translations are the dev evaluation), then test.
    dev, test = (len(artifacts.read_split(cfg, split)) for split in ("dev", "test"))
    assert [d.sentences_after for d in made] == [3 * dev + test]
    assert summary["averaging"]["dev_sentences"] == dev
    # Chosen on fewer dev pairs, the dev split is translated again after them.
    fewer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                               selection_max_sentences=5))
    assert train_lib.sentences_after_training(fewer) == 3 * 5 + dev + test
