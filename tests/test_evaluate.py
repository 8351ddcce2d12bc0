"""Evaluation metrics on hand-checkable cases, and ``precursor train`` / ``precursor evaluate`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from sklearn.metrics import average_precision_score
from typer.testing import CliRunner

from models.training.dataset import DatasetError
from models.training.evaluate import (
    ScoredWindow,
    alert_threshold,
    average_precision,
    best_f1_threshold,
    evaluate,
    false_alarms,
    lead_times_h,
    precision_recall_f1,
    window_metrics,
)
from precursor.models_cli import evaluate_command, train_command
from tests.test_lm_training import write_tiny_fleet

H = 3600


def test_pr_auc_by_hand() -> None:
    # ranked: T F T F -> precision 1 at recall 1/2, 2/3 at recall 1
    assert average_precision([True, False, True, False], [0.9, 0.8, 0.7, 0.1]) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # a perfect ranking and a reversed one
    assert average_precision([False, False, True], [0.1, 0.2, 0.3]) == 1.0
    assert average_precision([True, False, False], [0.1, 0.2, 0.3]) == pytest.approx(1 / 3)
    # tied scores count as one step: all tied is the positive rate
    assert average_precision([True, False, False, False], [0.5] * 4) == pytest.approx(0.25)
    assert average_precision([False, False], [0.3, 0.4]) is None  # undefined without failures


def test_pr_auc_matches_scikit_learn_on_random_data() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.random(300) < 0.1
        s = np.round(rng.random(300) + y * 0.3, 2)  # rounded: plenty of ties
        assert average_precision(y, s) == pytest.approx(average_precision_score(y, s))


def test_threshold_and_f1_by_hand() -> None:
    failed, scores = [False, True, False, True, True], [0.1, 0.4, 0.5, 0.8, 0.9]
    # alerting from 0.4 up: 3 TP, 1 FP -> F1 6/7; from 0.8 up: 2 TP -> F1 0.8; 0.9 only: F1 0.5
    assert best_f1_threshold(failed, scores) == pytest.approx(0.25)  # between 0.4 (alerts) and 0.1 (does not)
    assert precision_recall_f1(failed, scores, 0.8) == pytest.approx((1.0, 2 / 3, 0.8))
    assert precision_recall_f1(failed, scores, 0.95) == (0.0, 0.0, 0.0)
    assert best_f1_threshold([False, False], [0.2, 0.3]) > 0.3  # nothing failed: alert on nothing


def _f_beta(failed: np.ndarray, scores: np.ndarray, threshold: float, beta: float) -> float:
    alert = scores >= threshold
    tp = float((alert & failed).sum())
    precision, recall = tp / max(alert.sum(), 1), tp / failed.sum()
    b2 = beta * beta
    return (1 + b2) * precision * recall / (b2 * precision + recall) if precision + recall else 0.0


@pytest.mark.parametrize("seed", range(6))
def test_an_alert_rule_alerts_where_its_f_beta_is_best_or_within_its_tolerance(seed: int) -> None:
    rng = np.random.default_rng(seed)
    failed = rng.random(400) < 0.15
    scores = np.round(rng.random(400) + failed * rng.uniform(0.1, 0.6), 2)  # rounded: plenty of ties
    candidates = np.r_[np.unique(scores), np.inf]  # every set of windows a threshold can alert on
    for beta in (1.0, 2.0, 0.5):
        best = max(_f_beta(failed, scores, t, beta) for t in candidates)
        threshold = alert_threshold(failed, scores, beta=beta)
        assert _f_beta(failed, scores, threshold, beta) == pytest.approx(best)
        early = alert_threshold(failed, scores, beta=beta, tolerance=0.03)
        assert early <= threshold
        assert _f_beta(failed, scores, early, beta) >= best - 0.03 - 1e-12
        # nothing lower is still within reach: the earliest alerts validation cannot tell from the best
        assert all(_f_beta(failed, scores, t, beta) < best - 0.03 for t in candidates if t < early)
    assert alert_threshold(failed, scores) == best_f1_threshold(failed, scores)


def _windows(
    machine: str, scores: list[float], failure_at_h: float | None, horizon_h: float = 3.0
) -> list[ScoredWindow]:
    out = []
    for h, score in enumerate(scores):
        to_failure = None if failure_at_h is None or failure_at_h < h else failure_at_h - h
        failed = to_failure is not None and to_failure < horizon_h
        out.append(ScoredWindow(machine, h * H, failed, to_failure, score))
    return out


def test_lead_time_is_from_the_first_alert_in_the_warning_period() -> None:
    # failure at hour 10, horizon 3 h: warning windows end at hours 8, 9, 10 (2, 1, 0 h before)
    a = _windows("a", [0.1] * 8 + [0.2, 0.9, 0.9, 0.1], failure_at_h=10)
    b = _windows("b", [0.1] * 7 + [0.9, 0.9, 0.1, 0.1], failure_at_h=10)  # alerts at 7 (too early) and 8
    c = _windows("c", [0.1] * 11, failure_at_h=10)  # never alerted
    leads, failures = lead_times_h(a + b + c, threshold=0.5)
    assert sorted(leads) == [1.0, 2.0]
    assert failures == 3
    m = window_metrics(a + b + c, threshold=0.5, every_h=1.0)
    assert m.median_lead_time_h == 1.5
    assert (m.failures, m.failures_alerted) == (3, 2)


def test_false_alarms_count_raised_alerts_on_ok_windows_per_machine_week() -> None:
    # 168 hourly windows = one machine-week each; no failures
    quiet = _windows("q", [0.1] * 168, failure_at_h=None)
    noisy_scores = [0.1] * 168
    for h in (10, 11, 12, 50, 100):  # one episode of 3 windows, two single ones: 3 alerts raised
        noisy_scores[h] = 0.9
    noisy = _windows("n", noisy_scores, failure_at_h=None)
    raised, machine_weeks = false_alarms(quiet + noisy, threshold=0.5, every_h=1.0)
    assert (raised, machine_weeks) == (3, 2.0)
    assert window_metrics(quiet + noisy, 0.5, 1.0).false_alarms_per_machine_week == 1.5
    # an alert that continues into a failure's warning period was raised early: it still counts as false
    early = _windows("e", [0.1] * 5 + [0.9] * 6, failure_at_h=10)
    assert false_alarms(early, 0.5, 1.0)[0] == 1


@pytest.fixture(scope="module")
def fleet_and_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    from models.training.train import TrainSettings, train
    from tests.test_lm_training import TINY

    data = write_tiny_fleet(tmp_path_factory.mktemp("eval-fleet"), machines=6, hours=400, seed=3)
    out = tmp_path_factory.mktemp("eval-model") / "model"
    train(
        data["telemetry"],
        data["events"],
        out,
        TrainSettings(**{**TINY, "max_steps": 40}),
        machines=data["machines"],
        until="2026-01-13T00:00:00Z",
    )
    return data, out


def test_evaluate_scores_the_model_and_both_baselines_on_the_same_windows(
    fleet_and_model: tuple[dict[str, Path], Path],
) -> None:
    data, model_dir = fleet_and_model
    report = evaluate(model_dir, data["telemetry"], data["events"], data["machines"], since="2026-01-13T00:00:00Z")
    assert {"zscore", "gradient-boosting"} <= set(report.baselines)
    windows = {report.model.windows} | {m.windows for m in report.baselines.values()}
    assert len(windows) == 1 and windows.pop() > 0
    meta = json.loads((model_dir / "precursor.json").read_text())
    assert report.model.threshold == meta["threshold"]  # chosen on validation at training time, not on test
    payload = json.loads(report.to_json())
    keys = {"precision", "recall", "f1", "pr_auc", "median_lead_time_h", "false_alarms_per_machine_week"}
    assert keys <= set(payload["model"])
    assert all(keys <= set(v) for v in payload["baselines"].values())
    assert "gradient-boosting" in report.table()
    assert "alerts as the pipeline raises them" in report.table()
    assert report.alerts["model"].threshold == report.model.threshold


def test_evaluate_refuses_a_test_period_that_overlaps_training(fleet_and_model: tuple[dict[str, Path], Path]) -> None:
    data, model_dir = fleet_and_model
    with pytest.raises(DatasetError, match="before the end of the model's training data"):
        evaluate(model_dir, data["telemetry"], data["events"], since="2026-01-05T00:00:00Z")
    with pytest.raises(DatasetError, match="differs from the model's horizon"):
        evaluate(model_dir, data["telemetry"], data["events"], horizon_h=48)


def test_command_line_train_then_evaluate_json(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("train")(train_command)
    app.command("evaluate")(evaluate_command)
    data = write_tiny_fleet(tmp_path / "data", machines=5, hours=360, seed=5)
    runner = CliRunner()
    common = ["--telemetry", str(data["telemetry"]), "--events", str(data["events"]), "--horizon", "12h"]
    trained = runner.invoke(
        app,
        [
            "train",
            *common,
            "--until",
            "2026-01-12",
            "--out",
            str(tmp_path / "m"),
            "--max-steps",
            "10",
            "--n-layer",
            "1",
            "--n-embd",
            "16",
            "--n-head",
            "2",
            "--max-length",
            "64",
            "--set",
            "dropout=0.2",
            "--set",
            "ordinal-init=true",
            "--set",
            "residual=true",
            "--set",
            'search=[{"blocks": 2}]',
        ],
    )
    assert trained.exit_code == 0, trained.output
    assert "validation PR-AUC" in trained.output and "search on validation PR-AUC: as given " in trained.output
    written = json.loads((tmp_path / "m" / "precursor.json").read_text())["training"]
    assert (written["dropout"], written["ordinal_init"], written["tokenizer"]["residual"]) == (0.2, True, True)
    assert written["search"] == [{"blocks": 2}] and [r["overrides"] for r in written["search_results"]] == [
        {},
        {"blocks": 2},
    ]
    evaluated = runner.invoke(app, ["evaluate", *common, "--model", str(tmp_path / "m"), "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert set(report) == {"model", "baselines", "alerts", "alert_rule"}
    assert 0.0 <= report["model"]["precision"] <= 1.0
    # Alert-level figures for every scorer, each at the scorer's own threshold, under the pipeline's hysteresis.
    assert set(report["alerts"]) == {"model", *report["baselines"]}
    assert report["alerts"]["model"]["threshold"] == report["model"]["threshold"]
    assert report["alerts"]["model"]["failures"] == report["model"]["failures"]
    assert report["alert_rule"]["raise_after"] == 2

    bad = runner.invoke(app, ["train", *common[:4], "--horizon", "soon", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "soon" in bad.output
    for wrong in ("dropuot=0.2", "dropout=lots", "dropout", 'search=[{"blocks": 2}', 'search=[{"blokcs": 2}]'):
        refused = runner.invoke(app, ["train", *common, "--out", str(tmp_path / "x"), "--set", wrong])
        assert refused.exit_code != 0 and wrong.split("=")[0] in refused.output, refused.output
    missing = runner.invoke(app, ["evaluate", *common, "--model", str(tmp_path / "nothing")])
    assert missing.exit_code == 1 and "precursor.json" in missing.output


def test_train_with_a_signing_key_writes_a_signed_artifact_that_evaluate_verifies(tmp_path: Path) -> None:
    from models.edge.registry import verify_artifact
    from models.edge.signing import generate_keypair, load_public_keys
    from models.training.train import TrainSettings, train
    from tests.test_lm_training import TINY

    data = write_tiny_fleet(tmp_path / "data", machines=5, hours=360, seed=11)
    keys = generate_keypair(tmp_path / "keys")
    result = train(
        data["telemetry"],
        data["events"],
        tmp_path / "artifact",
        # A 1-layer model on 5 machines has ~200 validation windows, so two flips already fall below the 99 %
        # int8 gate; the gate itself is tested in test_export.py. This test is about signing and verifying.
        TrainSettings(**TINY, min_int8_agreement=0.95),
        until="2026-01-12",
        signing_key=keys.private_key_path,
        version="1.0.0",
    )
    assert result.artifact_dir == tmp_path / "artifact"
    assert (tmp_path / "artifact.checkpoint" / "model.safetensors").is_file()
    manifest = verify_artifact(tmp_path / "artifact", load_public_keys(keys.public_key_path))
    assert manifest.version == "1.0.0" and "tokenizer.json" in manifest.files

    with pytest.raises(DatasetError, match="trusted-keys"):
        evaluate(tmp_path / "artifact", data["telemetry"], data["events"])
    on_artifact = evaluate(tmp_path / "artifact", data["telemetry"], data["events"], trusted_keys=keys.public_key_path)
    on_checkpoint = evaluate(tmp_path / "artifact.checkpoint", data["telemetry"], data["events"])
    assert on_artifact.model.windows == on_checkpoint.model.windows
    # int8 ONNX and torch rank the windows almost the same way
    assert on_artifact.model.pr_auc == pytest.approx(on_checkpoint.model.pr_auc, abs=0.05)


def test_the_train_commands_defaults_are_the_training_settings_defaults() -> None:
    """The command line keeps its own literal defaults (it imports torch only once it trains); they must say what
    TrainSettings says, or `precursor train` and the flows train different models from the same "defaults"."""
    import inspect

    from models.training.train import TrainSettings

    settings = TrainSettings(horizon_h=24)
    compared = []
    for name, parameter in inspect.signature(train_command).parameters.items():
        if name in TrainSettings.model_fields:
            expected = getattr(settings, name)
        elif name in type(settings.tokenizer).model_fields:
            expected = getattr(settings.tokenizer, name)
        else:
            continue
        given = parameter.default
        if name == "threads":  # where it runs, not what it learns: alone, the command takes the cores it may use
            assert given is None, "--threads defaults to available_threads()"
            continue
        if name == "scaling":  # the split's: fleet for machines held out (--test-machines), else TrainSettings'
            assert given is None and expected == "machine", "--scaling defaults to the split's"
            continue
        if name in ("blocks", "block_stats", "window_stats"):  # not passed unless given: TrainSettings' own, which
            assert given is None, f"--{name.replace('_', '-')} is left to TrainSettings"  # a wide fleet may shorten
            continue
        if isinstance(expected, tuple):  # comma-separated on the command line
            given = tuple(part for part in given.split(",") if part)
        assert given == expected, f"--{name.replace('_', '-')} defaults to {given!r}, TrainSettings to {expected!r}"
        compared.append(name)
    assert {"max_minutes", "max_steps", "max_length", "n_embd"} <= set(compared)
