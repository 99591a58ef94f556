"""`make train` / `aiayn run`: the whole job, stage by stage, with a closing summary.

    data -> vocab -> train (+ checkpoint averaging) -> evaluate (dev, test) -> export

Each stage is the same library call as its own subcommand; a re-run skips what is already done
(the data stage keeps unchanged outputs, training resumes from its backup).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.pipeline import config as config_lib
from aiayn.pipeline.errors import UserInputError
from aiayn.pipeline.fileio import atomic_write
from aiayn.pipeline.release.model_card import host_description

STAGES = ("data", "vocab", "train", "evaluate", "export")


def _banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def _parse_stages(stages: str | Sequence[str]) -> list[str]:
    names = [s.strip() for s in stages.split(",")] if isinstance(stages, str) else list(stages)
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise UserInputError(
            f"Unknown stage(s) {unknown or names}: valid stages are {', '.join(STAGES)} "
            "(comma-separated, e.g. --stages data,vocab).")
    return names


def run_all(cfg: config_lib.Config, stages: str | Sequence[str] = STAGES,
            started_at: float | None = None) -> dict[str, Any]:
    """Runs the selected stages in order and writes `<run_dir>/summary.json`.

    Args:
      cfg: the resolved configuration.
      stages: names from `STAGES`, in the order to run (a comma-separated string or a list).
      started_at: ``time.time()`` at which the job began (default: now), from which
        ``train.deadline_minutes`` counts; ``make train`` passes the start of its set-up.

    Returns:
      The summary dict (also printed as a table and written to the run directory).

    Raises:
      UserInputError: an unknown stage name, or a stage's own input error.
    """
    names = _parse_stages(stages)
    start = time.time()
    job_start = start if started_at is None else min(started_at, start)
    summary: dict[str, Any] = {"preset": cfg.preset, "stages": names,
                               "host": f"{platform.node()}: {host_description()}"}
    run_dir = Path(cfg.train.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_lib.write_config(cfg, run_dir / "config.yaml")

    for name in names:
        stage_start = time.time()
        _banner(f"{name} ({cfg.preset or 'default'} preset)")
        if name == "data":
            from aiayn.pipeline.data.corpus import prepare_data
            summary["data"] = prepare_data(cfg)
        elif name == "vocab":
            from aiayn.pipeline.data.vocab import train_vocab
            summary["vocab"] = str(train_vocab(cfg))
        elif name == "train":
            from aiayn.pipeline.training.train import train
            summary["train"] = train(cfg, started_at=job_start)
            summary["curves"] = _plot_curves(run_dir)
        elif name == "evaluate":
            from aiayn.pipeline.evaluation.evaluate import evaluate_run
            summary["dev"] = _dev_evaluation_of_training(summary) or evaluate_run(cfg, "dev")
            summary["test"] = evaluate_run(cfg, split="test")
        elif name == "export":
            from aiayn.pipeline.release.export_run import export_run
            summary["export"] = str(export_run(cfg))
        summary.setdefault("stage_seconds", {})[name] = round(time.time() - stage_start, 1)
        print(f"--- {name} done in {time.time() - stage_start:.0f} s", flush=True)

    summary["wall_seconds"] = round(time.time() - start, 1)
    if job_start < start:
        summary["job_seconds"] = round(time.time() - job_start, 1)
    _write_json(run_dir / "summary.json", summary)
    print_summary(summary)
    return {"summary": str(run_dir / "summary.json")}


def _dev_evaluation_of_training(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The final weights' dev evaluation, when this job's train stage wrote it: choosing them,
    it translated the whole dev split with them (``averaging.select_final_weights``), so the
    evaluate stage would translate it again to the same output. None: translate it."""
    report = (summary.get("train") or {}).pop("dev_evaluation", None)
    if not report:
        return None
    from aiayn.pipeline.training.split_report import report_line

    print(report_line(report) + "\n  (the final weights' translations from the train stage's "
          "choice of them: eval/dev.hyp.txt)", flush=True)
    return report


def _plot_curves(run_dir: Path) -> str | None:
    """`<run_dir>/curves.png` from the run's own logs; a missing plotting extra is reported."""
    try:
        from aiayn.pipeline.evaluation.plots import plot_training_curves
        return str(plot_training_curves(run_dir))
    except ImportError as err:  # matplotlib is in the `plot`/`dev` extras, not a hard dependency
        print(f"(curves.png skipped: {err}; install the `plot` extra)")
    except UserInputError as err:
        print(f"(curves.png skipped: {err})")
    return None


def _write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _score_line(report: dict[str, Any] | None) -> str:
    if not report:
        return "-"
    nan = float("nan")
    return (f"BLEU {report.get('bleu', nan):.2f}  chrF {report.get('chrf', nan):.2f}"
            f"   [{report.get('bleu_signature', '')}]")


def print_summary(summary: dict[str, Any]) -> None:
    """Prints the closing summary of a run as a readable block."""
    _banner("summary")
    train = summary.get("train") or {}
    rows = [
        ("preset", summary.get("preset")),
        ("wall time", f"{summary.get('wall_seconds', 0) / 60:.1f} min "
                      f"(stages: {summary.get('stage_seconds')})"
                      + (f"; {summary['job_seconds'] / 60:.1f} min since the job began"
                         if "job_seconds" in summary else "")),
        ("host", summary.get("host")),
    ]
    if train:
        rows += [("steps", f"{train.get('steps')} ({train.get('end_state', 'complete')}, "
                           f"stopped by {train.get('stop_reason', '?')})"),
                 ("target tokens/s", train.get("tokens_per_second")),
                 ("final weights", train.get("final_weights"))]
    if "dev" in summary:
        rows.append(("dev", _score_line(summary.get("dev"))))
    if "test" in summary:
        rows.append(("test", _score_line(summary.get("test"))))
    if "export" in summary:
        rows.append(("export", summary["export"]))
    if summary.get("curves"):
        rows.append(("curves", summary["curves"]))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    samples = (summary.get("test") or {}).get("samples") or []
    for sample in samples[:3]:
        print(f"\n  source:     {sample.get('source')}\n  reference:  {sample.get('reference')}"
              f"\n  hypothesis: {sample.get('hypothesis')}")
