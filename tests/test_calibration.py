"""Calibrated risk: the map fitted on validation, carried in the signed artifact, applied the same way at the edge and
in the cloud, measured by ``precursor evaluate``; and an artifact made before calibration still scores as it did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from models.edge.calibration import (
    IDENTITY,
    MIN_POSITIVES,
    Calibration,
    ReliabilityBin,
    brier_score,
    calibration_of,
    expected_calibration_error,
    fit_platt,
    reliability_bins,
)
from models.edge.outcome import pack_sequences, risks_from_logits
from models.edge.registry import ArtifactError, ModelRegistry, TamperedArtifactError, sign_artifact
from models.edge.runtime import LMScorer
from models.edge.scoring import Window
from models.edge.signing import generate_keypair, load_private_key, load_public_keys
from models.edge.tokenizer import TelemetryTokenizer
from models.training.calibration_report import registry_calibrations
from models.training.dataset import Fleet, TimeSplit, WindowSpec, parse_time, split_windows
from models.training.model import TorchScorer, read_meta
from models.training.train import TrainSettings, train
from precursor.contracts.outcomes import ANY_FAILURE
from precursor.models_cli import evaluate_command
from tests.test_lm_training import TINY, write_tiny_fleet

UNTIL = "2026-01-12"


def over_confident(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rare failures (1-30 %) whose scores stretch the true logit three-fold and shift it up: what an LM trained to
    separate a few failures tends to say."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.01, 0.3, n)
    failed = rng.random(n) < truth
    logit = np.log(truth / (1 - truth))
    return failed, 1 / (1 + np.exp(-(3 * logit + 2)))


def test_platt_fit_on_over_confident_scores_reduces_ece_on_fresh_windows() -> None:
    failed, scores = over_confident(3000, seed=1)
    calibration = fit_platt(failed, scores)
    assert calibration.method == "platt" and calibration.positives == int(failed.sum())
    # judged on windows it was not fitted on
    test_failed, test_scores = over_confident(3000, seed=2)
    before = expected_calibration_error(test_failed, test_scores)
    after = expected_calibration_error(test_failed, calibration.probabilities(test_scores))
    assert before > 0.05 and after < 0.02 and after < before / 4
    assert brier_score(test_failed, calibration.probabilities(test_scores)) < brier_score(test_failed, test_scores)
    assert calibration.a == pytest.approx(1 / 3, abs=0.05)  # it undid the stretch


def test_too_few_failures_leave_the_identity_and_say_why() -> None:
    failed = np.array([True] * (MIN_POSITIVES - 1) + [False] * 500)
    scores = np.where(failed, 0.99, 0.5)
    calibration = fit_platt(failed, scores)
    assert calibration.is_identity and "fewer than" in calibration.reason
    assert calibration.apply({"failure": 0.7, "bearing": 0.2}) == {"failure": 0.7, "bearing": 0.2}
    assert fit_platt(~failed, scores).is_identity  # and too few ok windows


def test_perfectly_separated_validation_still_gives_a_finite_increasing_map() -> None:
    failed = np.array([True] * 12 + [False] * 200)
    scores = np.where(failed, 0.9, 0.2)
    calibration = fit_platt(failed, scores)
    assert calibration.method == "platt" and np.isfinite(calibration.a) and 0 < calibration.a < 50
    low, high = calibration.probabilities([0.2, 0.9])
    assert 0 < low < high < 1


@settings(max_examples=100, deadline=None)
@given(
    a=st.floats(0.01, 20),
    b=st.floats(-10, 10),
    risks=st.lists(st.floats(0, 1), min_size=2, max_size=30),
    threshold=st.floats(0.001, 0.999),
)
def test_the_map_keeps_every_alert_decision_at_the_mapped_threshold(
    a: float, b: float, risks: list[float], threshold: float
) -> None:
    calibration = Calibration(method="platt", a=a, b=b)
    raw = np.array(risks)
    mapped = calibration.probabilities(raw)
    assert np.all((mapped >= 0) & (mapped <= 1))
    # Away from float rounding of the threshold (training puts it halfway between two distinct validation risks), and
    # where the two calibrated values are still two floats: a steep map saturates, e.g. a = 14 sends both 0.9375 and
    # 0.96875 to 1.0 in float64, and the edge can only compare what it holds (hypothesis found that one).
    threshold_mapped = calibration.probability(threshold)
    clear = (np.abs(raw - threshold) > 1e-9) & (mapped != threshold_mapped)
    assert np.array_equal((raw >= threshold)[clear], (mapped >= threshold_mapped)[clear])
    order = np.argsort(raw, kind="stable")
    assert np.all(np.diff(mapped[order]) >= 0)


def test_kinds_keep_their_share_of_the_whole_failure_risk() -> None:
    calibration = Calibration(method="platt", a=0.5, b=-1.0)
    risk = calibration.apply({"failure": 0.6, "bearing": 0.3, "seal": 0.2})
    assert risk["failure"] == pytest.approx(calibration.probability(0.6))
    assert risk["bearing"] / risk["failure"] == pytest.approx(0.5)
    assert risk["seal"] / risk["failure"] == pytest.approx(0.2 / 0.6)


def test_reliability_bins_and_ece_by_hand() -> None:
    failed = [True, False, False, False, True]
    risks = [0.95, 0.05, 0.05, 0.15, 0.15]
    table = reliability_bins(failed, risks, bins=10)
    assert [b.count for b in table] == [2, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    assert table[1].observed_rate == 0.5 and table[1].mean_predicted == pytest.approx(0.15)
    assert table[2].mean_predicted is None
    # |0.05 - 0| * 2 + |0.15 - 0.5| * 2 + |0.95 - 1| * 1, over 5
    assert expected_calibration_error(failed, risks) == pytest.approx((0.1 + 0.7 + 0.05) / 5)
    assert reliability_bins([True], [1.0], bins=10)[-1].count == 1  # 1.0 falls in the last bin


def test_a_malformed_calibration_is_refused_by_name() -> None:
    assert calibration_of({"threshold": 0.3}) is IDENTITY
    with pytest.raises(ValueError, match="calibration"):
        calibration_of({"calibration": {"method": "platt", "a": -1.0, "b": 0.0}})


# --- a trained tiny model, end to end -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("calibrated")
    data = write_tiny_fleet(root / "data", machines=5, hours=360, seed=11)
    keys = generate_keypair(root / "keys")
    train(
        data["telemetry"],
        data["events"],
        root / "artifact",
        TrainSettings(**TINY, min_int8_agreement=0.95),  # see test_evaluate: ~200 validation windows
        until=UNTIL,
        signing_key=keys.private_key_path,
        version="1.0.0",
    )
    return {
        **data,
        "root": root,
        "artifact": root / "artifact",
        "checkpoint": root / "artifact.checkpoint",
        "private_key": keys.private_key_path,
        "public_key": keys.public_key_path,
    }


def validation_windows(paths: dict[str, Path]) -> tuple[list[Window], np.ndarray]:
    """The validation period's windows, cut as training cut them."""
    meta = read_meta(paths["checkpoint"])
    split = TimeSplit(
        validation_from_s=parse_time(meta.data["split"]["validation_from"]),
        until_s=parse_time(meta.data["split"]["until"]),
    )
    spec = WindowSpec(horizon_h=meta.horizon_h, **meta.window)
    _, validation = split_windows(Fleet.load(paths["telemetry"], paths["events"]), spec, split)
    return [w.window for w in validation], np.array([w.failed for w in validation])


def onnx_raw_risks(artifact: Path, windows: list[Window]) -> np.ndarray:
    """The artifact's whole-failure risks read straight from its ONNX graph, with no calibration."""
    config = json.loads((artifact / "precursor.json").read_text())
    tokenizer = TelemetryTokenizer.load(artifact)
    session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
    length = int(config["onnx"]["context_length"])
    if "values" in {i.name for i in session.get_inputs()}:  # a model with a value channel (the default)
        encoded = tokenizer.encode_with_values(windows)
        packed = pack_sequences(encoded.ids, pad_id=0, max_length=length, values=encoded.values)
        feeds = {"input_ids": packed.input_ids, "last_index": packed.last_index, "values": packed.values}
    else:
        packed = pack_sequences(tokenizer.encode_many(windows), pad_id=0, max_length=length)
        feeds = {"input_ids": packed.input_ids, "last_index": packed.last_index}
    logits = session.run(["last_logits"], feeds)[0]
    return np.array([r[ANY_FAILURE] for r in risks_from_logits(logits, config["onnx"]["outcome_tokens"])])


def test_the_signed_artifact_carries_the_calibration_and_the_edge_applies_it(trained: dict[str, Path]) -> None:
    config = json.loads((trained["artifact"] / "precursor.json").read_text())
    calibration = Calibration.model_validate(config["calibration"])
    assert calibration.method == "platt" and calibration.positives >= MIN_POSITIVES
    assert not calibration.is_identity
    validation = config["validation"]
    # the threshold is on the calibrated scale: the raw one, mapped
    assert config["threshold"] == pytest.approx(calibration.probability(validation["raw_threshold"]), abs=1e-12)
    assert validation["ece_calibrated"] <= validation["ece_raw"] + 1e-9

    windows, _ = validation_windows(trained)
    # One batch, as onnx_raw_risks runs them: dynamic int8 quantizes activations with one scale per batch.
    edge = LMScorer.load(trained["artifact"], load_public_keys(trained["public_key"]), max_batch_size=len(windows))
    assert edge.calibration == calibration and edge.threshold == config["threshold"]
    at_edge = np.array([r[ANY_FAILURE] for r in edge.score_many(windows)])
    raw = onnx_raw_risks(trained["artifact"], windows)
    np.testing.assert_allclose(at_edge, calibration.probabilities(raw), atol=1e-5)  # the edge applied the map
    assert np.abs(at_edge - raw).max() > 1e-3  # and the map does move risks
    # the operating point is the one training chose: the same windows alert on either scale
    assert np.array_equal(at_edge >= edge.threshold, raw >= validation["raw_threshold"])

    cloud = TorchScorer.load(trained["checkpoint"])
    assert cloud.calibration == calibration
    in_cloud = np.array([r[ANY_FAILURE] for r in cloud.score_many(windows)])
    assert np.abs(at_edge - in_cloud).max() < 0.02  # int8 against fp32, both calibrated
    assert np.mean((at_edge >= edge.threshold) == (in_cloud >= edge.threshold)) >= 0.95


def test_the_signature_covers_the_calibration(trained: dict[str, Path], tmp_path: Path) -> None:
    forged = tmp_path / "forged"
    shutil.copytree(trained["artifact"], forged)
    config = json.loads((forged / "precursor.json").read_text())
    config["calibration"]["b"] += 3.0  # every risk inflated
    (forged / "precursor.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with pytest.raises(TamperedArtifactError):
        LMScorer.load(forged, load_public_keys(trained["public_key"]))


def resigned(trained: dict[str, Path], destination: Path, edit: dict[str, object]) -> Path:
    shutil.copytree(trained["artifact"], destination)
    config = json.loads((destination / "precursor.json").read_text())
    for key, value in edit.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (destination / "precursor.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    sign_artifact(
        destination, model_name="precursor-lm", version="1.0.0", private_key=load_private_key(trained["private_key"])
    )
    return destination


def test_an_artifact_without_calibration_scores_as_before(trained: dict[str, Path], tmp_path: Path) -> None:
    raw_threshold = json.loads((trained["artifact"] / "precursor.json").read_text())["validation"]["raw_threshold"]
    old = resigned(trained, tmp_path / "old", {"calibration": None, "threshold": raw_threshold})
    windows, _ = validation_windows(trained)
    edge = LMScorer.load(old, load_public_keys(trained["public_key"]), max_batch_size=len(windows))
    assert edge.calibration.is_identity and edge.threshold == raw_threshold
    risks = edge.score_many(windows)
    np.testing.assert_array_equal(np.array([r[ANY_FAILURE] for r in risks]), onnx_raw_risks(old, windows))
    assert all(set(r) == {"failure", "bearing"} for r in risks)


def test_a_signed_but_malformed_calibration_is_an_artifact_error(trained: dict[str, Path], tmp_path: Path) -> None:
    bad = resigned(trained, tmp_path / "bad", {"calibration": {"method": "isotonic", "a": 1.0, "b": 0.0}})
    with pytest.raises(ArtifactError, match="calibration"):
        LMScorer.load(bad, load_public_keys(trained["public_key"]))


def test_evaluate_reports_brier_and_ece_and_writes_the_reliability_diagram(
    trained: dict[str, Path], tmp_path: Path
) -> None:
    app = typer.Typer()
    app.command("evaluate")(evaluate_command)
    app.command("noop")(lambda: None)  # more than one command, so "evaluate" is a subcommand as in the real CLI
    diagram = tmp_path / "reliability.svg"
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--model",
            str(trained["artifact"]),
            "--trusted-keys",
            str(trained["public_key"]),
            "--telemetry",
            str(trained["telemetry"]),
            "--events",
            str(trained["events"]),
            "--json",
            "--diagram",
            str(diagram),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for scorer in [report["model"], *report["baselines"].values()]:
        assert 0.0 <= scorer["brier"] <= 1.0 and 0.0 <= scorer["ece"] <= 1.0
        bins = scorer["reliability"]
        assert len(bins) == 10 and sum(b["count"] for b in bins) == report["model"]["windows"]
    svg = diagram.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert all(name in svg for name in ["model", *report["baselines"]])
    assert svg.count("<polyline") == 1 + len(report["baselines"])


def test_the_artifact_carries_its_validation_reliability_bins_and_the_registry_report_reads_them(
    trained: dict[str, Path], tmp_path: Path
) -> None:
    config = json.loads((trained["artifact"] / "precursor.json").read_text())
    validation = config["validation"]
    bins = [ReliabilityBin.model_validate(b) for b in validation["reliability_calibrated"]]
    assert len(bins) == 10 and sum(b.count for b in bins) == validation["windows"]
    # the bins are the calibrated risks': their ECE is the one training reports
    ece = sum(b.count * abs(b.mean_predicted - b.observed_rate) for b in bins if b.count) / validation["windows"]
    assert ece == pytest.approx(validation["ece_calibrated"], abs=1e-9)

    registry = ModelRegistry(tmp_path / "registry", load_public_keys(trained["public_key"]))
    registry.publish(trained["artifact"])
    (report,) = registry_calibrations(tmp_path / "registry")
    assert report.error is None and report.version == "1.0.0"
    assert report.calibration == Calibration.model_validate(config["calibration"])
    assert report.validation is not None and report.validation.reliability == bins
    assert report.validation.ece_raw == validation["ece_raw"]
