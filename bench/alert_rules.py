"""Alert rules on finished quality-suite runs: each rule picks every scorer's threshold on its own validation risks,
and the test figures that issue #17 compares besides PR-AUC (F1, median lead time, false alarms per machine-week)
follow, with nothing trained again.

    .venv/bin/python bench/quality_suite.py --keep-scores --out RUN      # once: writes RUN/scores/DATASET/seed-N.npz
    .venv/bin/python bench/alert_rules.py RUN [RUN ...] --rules f1,f2,f1~0.02

A rule is ``f1`` (the best F1: what training and the suite use), ``fB`` (the best F-beta, beta B: recall weighs B times
precision), and either with ``~T`` (the lowest threshold whose F-beta is within T of the best: the earliest alerts that
validation cannot tell from the best). Every scorer gets the same rule, so a rule changes where each one alerts and
not which one ranks windows better (PR-AUC does not move). ``matched`` is a comparison, not a rule to deploy: gradient
boosting alerts at its best F1, and every other scorer at the lowest threshold that raises no more false alarms per
machine-week on validation than the trees do there, so lead times compare at about the same alarm rate.

Per rule: a row per dataset with the LM's and gradient boosting's F1, median lead time and false alarms per
machine-week (means over seeds), and the suite's verdict line.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from quality_suite import _fmt, summarize  # noqa: E402
from quality_suite import against as verdict  # noqa: E402

from models.training.evaluate import alert_threshold, false_alarms, window_metrics  # noqa: E402
from models.training.scored_window import ScoredWindow  # noqa: E402

SHOWN = ("lm", "gradient-boosting")
MATCHED = "matched"
REFERENCE = "gradient-boosting"


@dataclass(frozen=True)
class Rule:
    """Where a scorer alerts: the best F-beta on validation, or the lowest threshold within ``tolerance`` of it."""

    name: str
    beta: float = 1.0
    tolerance: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Rule:
        if text.strip() == MATCHED:
            return cls(MATCHED)
        match = re.fullmatch(r"f(\d+(?:\.\d+)?)(?:~(\d*\.?\d+))?", text.strip())
        if match is None:
            raise argparse.ArgumentTypeError(f"rule {text!r}: expected fB or fB~T (f1, f2, f1~0.02)")
        return cls(text.strip(), float(match.group(1)), float(match.group(2) or 0.0))

    def threshold(self, failed: np.ndarray, scores: np.ndarray) -> float:
        return alert_threshold(failed, scores, beta=self.beta, tolerance=self.tolerance)


def alarm_rate(windows: list[ScoredWindow], threshold: float, every_h: float) -> float:
    """False alarms per machine-week at ``threshold``, as the suite's metrics count them."""
    raised, weeks = false_alarms(windows, threshold, every_h)
    return raised / weeks if weeks else 0.0


def matched_threshold(validation: list[ScoredWindow], every_h: float, alarms: float) -> float:
    """The lowest threshold (halfway between two risks, as :func:`alert_threshold` places it) whose false alarms per
    machine-week on ``validation`` are at most ``alarms``."""
    risks = np.unique([w.score for w in validation])[::-1]  # high to low
    cuts = np.r_[np.nextafter(risks[0], np.inf), (risks[:-1] + risks[1:]) / 2, np.nextafter(risks[-1], -np.inf)]

    low, high = 0, len(cuts) - 1  # alarms grow (nearly) monotonically as the threshold falls: bisect on it
    if alarm_rate(validation, cuts[high], every_h) <= alarms:
        return float(cuts[high])
    while high - low > 1:
        middle = (low + high) // 2
        if alarm_rate(validation, cuts[middle], every_h) <= alarms:
            low = middle
        else:
            high = middle
    return float(cuts[low])


def scored(seed: Any, split: str, scores: np.ndarray) -> list[ScoredWindow]:
    """One split's windows of a ``--keep-scores`` file, each with one scorer's risk."""
    return [
        ScoredWindow(str(m), int(e), bool(f), None if np.isnan(h) else float(h), float(s))
        for m, e, f, h, s in zip(
            seed[f"{split}.machine_id"],
            seed[f"{split}.end_s"],
            seed[f"{split}.failed"],
            seed[f"{split}.hours_to_failure"],
            scores,
            strict=True,
        )
    ]


def scorers_of(seed: Any) -> list[str]:
    return sorted(key.split(":", 1)[1] for key in seed.files if key.startswith("validation:"))


def thresholds(rule: Rule, seed: Any) -> dict[str, float]:
    """Each scorer's threshold under ``rule``, chosen on its validation risks in one ``--keep-scores`` file."""
    failed, every_h = seed["validation.failed"], float(seed["every_h"])
    if rule.name != MATCHED:
        return {scorer: rule.threshold(failed, seed[f"validation:{scorer}"]) for scorer in scorers_of(seed)}
    reference = seed[f"validation:{REFERENCE}"]
    at = Rule("f1").threshold(failed, reference)
    alarms = alarm_rate(scored(seed, "validation", reference), at, every_h)
    return {
        scorer: at
        if scorer == REFERENCE
        else matched_threshold(scored(seed, "validation", seed[f"validation:{scorer}"]), every_h, alarms)
        for scorer in scorers_of(seed)
    }


def results_under(rule: Rule, runs: list[Path]) -> dict[str, Any]:
    """The suite's results layout (``{"datasets": {NAME: {"runs": [...]}}}``) with every threshold from ``rule``."""
    datasets: dict[str, Any] = {}
    for run in runs:
        for folder in sorted(p for p in (run / "scores").iterdir() if p.is_dir()):
            entry = datasets.setdefault(folder.name, {"runs": []})
            for path in sorted(folder.glob("seed-*.npz")):
                seed = np.load(path)
                record: dict[str, Any] = {}
                for scorer, threshold in thresholds(rule, seed).items():
                    test = scored(seed, "test", seed[f"test:{scorer}"])
                    metrics = window_metrics(test, threshold, float(seed["every_h"]))
                    record[scorer] = {**metrics.model_dump(mode="json"), "train_minutes": 0.0}
                entry["runs"].append({"seed": int(path.stem.split("-")[1]), "scorers": record})
    return {"datasets": datasets}


def rule_table(rule: Rule, runs: list[Path]) -> str:
    rows = summarize(results_under(rule, runs))
    by = {(r["dataset"], r["scorer"]): r for r in rows}
    lines = [
        f"rule {rule.name}",
        "",
        "| dataset | F1 LM / GB | median lead h LM / GB | false alarms / machine-week LM / GB |",
        "|---|---|---|---|",
    ]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        lm, gb = (by.get((dataset, scorer), {}) for scorer in SHOWN)
        lines.append(
            f"| {dataset} | {_fmt(lm.get('f1_mean'), 3)} / {_fmt(gb.get('f1_mean'), 3)} "
            f"| {_fmt(lm.get('median_lead_time_h_mean'), 1)} / {_fmt(gb.get('median_lead_time_h_mean'), 1)} "
            f"| {_fmt(lm.get('false_alarms_per_machine_week_mean'), 3)} / "
            f"{_fmt(gb.get('false_alarms_per_machine_week_mean'), 3)} |"
        )
    return "\n".join([*lines, "", verdict(rows)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="quality-suite output folders run with --keep-scores")
    parser.add_argument("--rules", default="f1,f2,f1~0.02,matched", help="comma-separated rules (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = [str(run) for run in args.runs if not (run / "scores").is_dir()]
    if missing:
        parser.error(f"no scores/ under {', '.join(missing)}: run bench/quality_suite.py with --keep-scores")
    for rule in [Rule.parse(text) for text in args.rules.split(",")]:
        print(rule_table(rule, args.runs), end="\n\n")


if __name__ == "__main__":
    main()
