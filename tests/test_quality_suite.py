"""The quality suite end to end on a tiny simulated fleet: train, export, sign, score through the artifact."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from models.edge.registry import VERSION_PATTERN

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "bench" / "quality_suite.py"


def _bench(name: str) -> ModuleType:
    """A script under ``bench/`` as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _suite() -> ModuleType:
    return _bench("quality_suite")


def _run_smoke(out: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SUITE), "--smoke", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The smoke suite with its dataset in a worker process (``--jobs 2``), as the whole suite runs on two cores."""
    out = tmp_path_factory.mktemp("quality")
    return out, _run_smoke(out, "--keep-artifacts", "--keep-scores", "--jobs", "2")


def test_the_table_has_every_column_and_a_row_per_scorer(smoke: tuple[Path, str]) -> None:
    out, stdout = smoke
    table = (out / "quality.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    # The suite's own column list is the one spec of the table; the checks below find each column by its name.
    columns = _suite().COLUMNS
    assert header == list(columns)
    column = {name: header.index(name) for name in columns}
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[:2] for r in rows] == [["sim_smoke", "lm"], ["sim_smoke", "gradient-boosting"], ["sim_smoke", "zscore"]]
    for row in rows:
        assert len(row) == len(header)
        pr_auc = float(row[column["PR-AUC mean"]])
        assert 0.0 <= pr_auc <= 1.0
        low, high = (float(v) for v in row[column["PR-AUC min-max"]].split("-"))
        assert low <= pr_auc <= high
        assert 0.0 <= float(row[column["F1"]]) <= 1.0
        for figure in ("Brier", "ECE"):  # probabilities' errors, in [0, 1]
            low, high = (float(v) for v in row[column[f"{figure} min-max"]].split("-"))
            assert 0.0 <= low <= float(row[column[f"{figure} mean"]]) <= high <= 1.0
        assert row[column["seeds"]] == "1"
    assert lines[0] in stdout  # printed as well as written


def test_the_json_holds_every_per_seed_figure(smoke: tuple[Path, str]) -> None:
    out, _ = smoke
    results = json.loads((out / "quality.json").read_text())
    assert results["seeds"] == [0]
    assert results["machine"]["cpus"] >= 1
    entry = results["datasets"]["sim_smoke"]
    assert entry["facts"]["horizon"] == "12h" and entry["facts"]["split"] == "time"
    assert entry["facts"]["scaling"] == "machine"  # a time split tests the machines it trained on
    assert entry["windows"]["test_failures"] > 0
    (run,) = entry["runs"]
    assert run["seed"] == 0
    assert set(run["scorers"]) == {"lm", "gradient-boosting", "zscore"}
    for name, m in run["scorers"].items():
        for key in (
            "pr_auc",
            "f1",
            "precision",
            "recall",
            "median_lead_time_h",
            "false_alarms_per_machine_week",
            "brier",
            "ece",
            "validation_pr_auc",
        ):
            assert key in m, (name, key)
        # every scorer's validation PR-AUC, so the suite shows how each ranks there against test
        assert 0.0 < m["validation_pr_auc"] <= 1.0
        assert 0.0 <= m["pr_auc"] <= 1.0
        assert 0.0 <= m["precision"] <= 1.0 and 0.0 <= m["recall"] <= 1.0
        assert m["false_alarms_per_machine_week"] >= 0.0
        assert 0.0 <= m["brier"] <= 1.0 and 0.0 <= m["ece"] <= 1.0
        assert m["median_lead_time_h"] is None or 0.0 <= m["median_lead_time_h"] <= 12.0
        assert m["train_minutes"] >= 0.0 and math.isfinite(m["train_minutes"])
        assert m["windows"] == sum(entry["windows"]["test"].values())
    lm = run["scorers"]["lm"]
    assert lm["train_minutes"] > 0
    # scored through the signed int8 artifact, the edge's path
    artifact = Path(lm["artifact"])
    assert (artifact / "manifest.json").is_file() and any(artifact.glob("*.onnx"))
    summary = {(r["dataset"], r["scorer"]): r for r in results["summary"]}
    for scorer, m in run["scorers"].items():
        row = summary["sim_smoke", scorer]
        assert row["pr_auc_mean"] == pytest.approx(m["pr_auc"])
        # one seed: the mean, the min and the max are that seed's figure
        for metric in ("brier", "ece"):
            assert row[f"{metric}_mean"] == row[f"{metric}_min"] == row[f"{metric}_max"] == pytest.approx(m[metric])


def test_a_worker_process_gives_the_figures_of_a_run_in_the_suites_own_process(
    smoke: tuple[Path, str], tmp_path: Path
) -> None:
    parallel, _ = smoke
    _run_smoke(tmp_path, "--jobs", "1")
    figures = ("pr_auc", "f1", "brier", "ece", "median_lead_time_h", "false_alarms_per_machine_week")

    def per_seed(folder: Path) -> dict[tuple[int, str], dict[str, float]]:
        results = json.loads((folder / "quality.json").read_text())
        return {
            (run["seed"], name): {f: m[f] for f in figures}
            for run in results["datasets"]["sim_smoke"]["runs"]
            for name, m in run["scorers"].items()
        }

    serial = per_seed(tmp_path)
    assert set(serial) == {(0, "lm"), (0, "gradient-boosting"), (0, "zscore")}
    assert per_seed(parallel) == serial
    assert json.loads((parallel / "quality.json").read_text())["jobs"] == 2


def test_each_seed_in_a_worker_of_its_own_gives_the_figures_of_one_process_running_them_all(tmp_path: Path) -> None:
    figures = ("pr_auc", "f1", "brier", "median_lead_time_h", "false_alarms_per_machine_week")

    def runs(folder: Path) -> list[tuple[int, dict[str, dict[str, float]]]]:
        entry = json.loads((folder / "quality.json").read_text())["datasets"]["sim_smoke"]
        assert entry["windows"]["train"] and "error" not in entry
        return [
            (run["seed"], {name: {f: m[f] for f in figures} for name, m in run["scorers"].items()})
            for run in entry["runs"]
        ]

    _run_smoke(tmp_path / "serial", "--seeds", "0,1", "--jobs", "1")
    _run_smoke(tmp_path / "parallel", "--seeds", "0,1", "--jobs", "2")
    serial, parallel = runs(tmp_path / "serial"), runs(tmp_path / "parallel")
    assert [seed for seed, _ in parallel] == [0, 1]
    assert parallel == serial
    assert serial[0][1]["lm"] != serial[1][1]["lm"]  # two seeds, two trainings: not one run counted twice
    # each worker's folder is gone with its artifacts, and its dataset's folder with the last of them
    assert sorted(p.name for p in (tmp_path / "parallel").iterdir()) == ["quality.json", "quality.md"]


def test_a_seed_whose_worker_died_is_a_run_with_its_error_beside_the_others() -> None:
    suite = _suite()
    dataset = suite.SMOKE
    ran = {
        "facts": dataset.facts(),
        "windows": {"train": {"ok": 3}},
        "source": {},
        "runs": [{"seed": 0, "scorers": {}}],
    }
    died = suite.failed_entry(dataset, MemoryError("killed"))
    merged = suite.merge_seeds(dataset, {1: died, 0: ran})
    assert merged["windows"] == ran["windows"] and "error" not in merged
    assert merged["runs"] == [{"seed": 0, "scorers": {}}, {"seed": 1, "error": "MemoryError: killed"}]
    assert suite.merge_seeds(dataset, {0: died, 1: died})["error"] == "MemoryError: killed"


def test_the_whole_suite_measures_the_lms_own_budget_and_hands_out_the_longest_first() -> None:
    suite = _suite()
    from models.training.train import TrainSettings

    whole = suite.parse_args(["--jobs", "2"])
    (fd001,) = [d for d in suite.DATASETS if d.name == "cmapss_fd001"]
    assert whole.max_minutes is None and whole.seeds == [0, 1, 2]
    assert suite.training_settings(fd001, 0, whole).max_minutes == TrainSettings.model_fields["max_minutes"].default
    assert suite.training_settings(fd001, 0, suite.parse_args(["--quick"])).max_minutes == 4.0
    assert suite.parse_args(["--threads", "2"]).jobs == max(1, (os.cpu_count() or 1) // 2)
    order = [d.name for d in suite.longest_first(suite.DATASETS)]
    assert order[0] == "cmapss_fd004" and set(order) == {d.name for d in suite.DATASETS}
    with pytest.raises(SystemExit):
        suite.parse_args(["--jobs", "0"])


def test_an_unknown_dataset_is_named_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"unknown dataset.*'fd009'.*cmapss_fd001"):
        _suite().main(["--only", "fd009", "--out", str(tmp_path)])
    assert not (tmp_path / "quality.json").exists()


def test_every_dataset_folder_has_its_row_of_facts() -> None:
    suite = _suite()
    names = {d.name for d in suite.DATASETS}
    real = {p.name for p in (REPO.parent / "shared" / "datasets").iterdir() if p.is_dir()}
    assert real <= names
    profiles = {d.simulated.profile for d in suite.DATASETS if d.simulated is not None}
    assert profiles == {"slow-degradation", "error-codes", "server-metrics", "daily"}
    assert set(suite.QUICK) <= names


def test_a_fleet_seed_draws_other_simulated_fleets_and_leaves_the_real_data_alone() -> None:
    suite = _suite()
    names = "cmapss_fd001,sim_daily,sim_slow_degradation"
    own = {d.name: d for d in suite.selected(suite.parse_args(["--only", names]))}
    other = {d.name: d for d in suite.selected(suite.parse_args(["--only", names, "--fleet-seed", "7"]))}
    assert own["sim_daily"].simulated.seed == 1 and other["sim_daily"].simulated.seed == 7
    assert other["sim_slow_degradation"].facts()["fleet"]["seed"] == 7
    assert other["sim_slow_degradation"].simulated.fields == own["sim_slow_degradation"].simulated.fields
    assert other["cmapss_fd001"] == own["cmapss_fd001"]


def test_several_fleet_seeds_draw_each_simulated_profile_once_per_seed() -> None:
    suite = _suite()
    chosen = suite.selected(suite.parse_args(["--only", "cmapss_fd001,sim_daily", "--fleet-seeds", "2,3"]))
    assert [d.name for d in chosen] == ["cmapss_fd001", "sim_daily@2", "sim_daily@3"]
    assert [d.simulated.seed for d in chosen[1:]] == [2, 3]
    assert chosen[0] == suite.selected(suite.parse_args(["--only", "cmapss_fd001"]))[0]
    with pytest.raises(SystemExit):
        suite.parse_args(["--fleet-seeds", "2,2"])  # a draw twice would count one fleet's luck twice
    for d in chosen:  # a draw's artifact is signed under a version the registry takes
        assert re.fullmatch(VERSION_PATTERN, suite.artifact_version(d.name, 0)), d.name


def _seed_figures(pr_auc: float, lead: float = 10.0, alarms: float = 1.0) -> dict[str, float]:
    return {
        "pr_auc": pr_auc,
        "brier": 0.1,
        "ece": 0.02,
        "f1": pr_auc / 2,
        "median_lead_time_h": lead,
        "false_alarms_per_machine_week": alarms,
        "train_minutes": 1.0,
    }


def _results(datasets: dict[str, list[dict[str, dict[str, float]]] | str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, runs in datasets.items():
        if isinstance(runs, str):
            out[name] = {"runs": [], "error": runs}
        else:
            out[name] = {"runs": [{"seed": i, "scorers": scorers} for i, scorers in enumerate(runs)]}
    return {"datasets": out}


def test_the_table_averages_a_profile_over_its_draws_and_every_scorer_over_the_datasets() -> None:
    suite = _suite()
    results = _results(
        {
            "cmapss_fd001": [
                {"lm": _seed_figures(0.90), "gradient-boosting": _seed_figures(0.80)},
                {"lm": _seed_figures(0.94), "gradient-boosting": _seed_figures(0.80)},
            ],
            "sim_daily@2": [{"lm": _seed_figures(0.40, lead=5.0), "gradient-boosting": _seed_figures(0.50)}],
            "sim_daily@3": [{"lm": _seed_figures(0.50, alarms=0.5), "gradient-boosting": _seed_figures(0.54)}],
            "sim_slow_degradation": "RuntimeError: the simulator failed",
        }
    )
    rows = suite.summarize(results)
    by = {(r["dataset"], r.get("scorer")): r for r in rows}

    daily = by[("sim_daily (2 draws)", "lm")]
    assert daily["pr_auc_mean"] == pytest.approx(0.45)
    assert (daily["pr_auc_min"], daily["pr_auc_max"]) == (pytest.approx(0.40), pytest.approx(0.50))
    assert daily["over"] == ["sim_daily@2", "sim_daily@3"] and daily["seeds"] == 2

    # each dataset counts once (the daily profile through its draws' mean); the failed one not at all
    mean = by[("mean of 2 datasets", "lm")]
    assert mean["pr_auc_mean"] == pytest.approx((0.92 + 0.45) / 2)
    assert mean["pr_auc_min"] is None
    assert by[("mean of 2 datasets", "gradient-boosting")]["pr_auc_mean"] == pytest.approx((0.80 + 0.52) / 2)

    verdict = suite.against(rows)
    assert "over 2 datasets: mean PR-AUC +0.025" in verdict
    assert "level or ahead on 1 of 2 (behind: sim_daily (2 draws) -0.070)" in verdict
    # daily: lead 7.5 h against 10, false alarms 0.75 against 1.0
    assert "median lead time no shorter on 1, false alarms per machine-week no higher on 2" in verdict

    table = suite.markdown(rows)
    assert "| sim_daily (2 draws) | lm | 0.450 | 0.400-0.500 |" in table
    assert "| mean of 2 datasets | lm | 0.685 | - |" in table
    assert "| sim_slow_degradation | error |" in table


def test_one_dataset_has_no_mean_row_and_no_verdict_without_both_scorers() -> None:
    suite = _suite()
    rows = suite.summarize(_results({"cmapss_fd001": [{"lm": _seed_figures(0.9)}]}))
    assert [r["dataset"] for r in rows] == ["cmapss_fd001"]
    assert suite.against(rows) == ""


def _table_from(*paths: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SUITE), "--table-from", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_table_of_finished_runs_puts_their_datasets_together(tmp_path: Path) -> None:
    whole = _results(
        {
            "cmapss_fd001": [{"lm": _seed_figures(0.9), "gradient-boosting": _seed_figures(0.8)}],
            "sim_daily": [{"lm": _seed_figures(0.5), "gradient-boosting": _seed_figures(0.6)}],  # its own draw
        }
    )
    draws = _results({"sim_daily@2": [{"lm": _seed_figures(0.7), "gradient-boosting": _seed_figures(0.4)}]})
    for name, results in (("whole", {**whole, "command": "whole"}), ("draws", {**draws, "command": "draws"})):
        (tmp_path / f"{name}.json").write_text(json.dumps(results), encoding="utf-8")
    done = _table_from(tmp_path / "whole.json", tmp_path / "draws.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| sim_daily (2 draws) | lm | 0.600 | 0.500-0.700 |" in done.stdout
    assert "over 2 datasets: mean PR-AUC +0.100; level or ahead on 2 of 2" in done.stdout
    assert "from: `whole`; `draws`" in done.stdout

    again = _table_from(tmp_path / "whole.json", tmp_path / "whole.json")
    assert again.returncode != 0 and "cmapss_fd001 is in more than one" in again.stderr


def test_kept_scores_give_the_suites_figures_again_under_its_own_alert_rule(smoke: tuple[Path, str]) -> None:
    """``--keep-scores`` writes what ``bench/alert_rules.py`` needs: under the rule training uses (the best F1 on
    validation) every scorer alerts on the same validation windows as in the suite, and gradient boosting's test
    figures come out as the suite's."""
    import numpy as np

    out, _ = smoke
    results = json.loads((out / "quality.json").read_text())
    figures = results["datasets"]["sim_smoke"]["runs"][0]["scorers"]
    kept = np.load(out / "scores" / "sim_smoke" / "seed-0.npz")
    assert {k for k in kept.files if ":" in k} == {f"{split}:{s}" for split in ("validation", "test") for s in figures}
    assert len(kept["test:lm"]) == len(kept["test.failed"]) == figures["lm"]["windows"]

    rules = _bench("alert_rules")
    f1 = rules.Rule.parse("f1")
    again = rules.results_under(f1, [out])["datasets"]["sim_smoke"]["runs"][0]["scorers"]
    for scorer, suite in figures.items():
        validation = kept[f"validation:{scorer}"]
        assert np.array_equal(
            validation >= suite["threshold"], validation >= f1.threshold(kept["validation.failed"], validation)
        ), scorer
    for figure in ("f1", "median_lead_time_h", "false_alarms_per_machine_week", "failures_alerted"):
        assert again["gradient-boosting"][figure] == figures["gradient-boosting"][figure], figure

    # matched: the trees at their own threshold, the LM at the lowest that raises no more false alarms on validation
    matched = rules.results_under(rules.Rule.parse("matched"), [out])["datasets"]["sim_smoke"]["runs"][0]["scorers"]
    assert matched["gradient-boosting"] == again["gradient-boosting"]
    validation = rules.scored(kept, "validation", kept["validation:lm"])
    every_h = float(kept["every_h"])
    for budget in (0.0, 1.0, 5.0):
        threshold = rules.matched_threshold(validation, every_h, budget)
        raised, weeks = rules.false_alarms(validation, threshold, every_h)
        assert raised / weeks <= budget
        lower = [w.score for w in validation if w.score < threshold]
        if lower:  # one risk lower alerts on more windows and raises more than the budget
            raised, weeks = rules.false_alarms(validation, max(lower), every_h)
            assert raised / weeks > budget

    with pytest.raises(Exception, match="expected fB"):
        rules.Rule.parse("recall")
