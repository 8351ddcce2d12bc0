"""The flows' settings: one nested variable changes only what it names, the rest keep their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.settings import DriftCheckSettings, RetrainSettings
from models.training.train import TrainSettings


def test_one_training_variable_keeps_the_other_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_RETRAIN_TRAINING__MAX_MINUTES", "2")
    monkeypatch.setenv("PRECURSOR_RETRAIN_HORIZON_H", "12")
    training = RetrainSettings().training
    assert training == TrainSettings(horizon_h=12.0, max_minutes=2.0)


def test_a_variable_two_levels_down_keeps_the_other_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_DRIFT_RETRAIN__TRAINING__MAX_STEPS", "7")
    monkeypatch.setenv("PRECURSOR_DRIFT_RETRAIN__PROMOTION_MARGIN", "0.1")
    retrain = DriftCheckSettings().retrain
    assert retrain.training == TrainSettings(horizon_h=24.0, max_steps=7)
    assert (retrain.promotion_margin, retrain.promotion_metric) == (0.1, "pr_auc")


def test_one_kafka_variable_keeps_the_kafka_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_KAFKA_BOOTSTRAP_SERVERS", "broker-1:9093")
    monkeypatch.setenv("PRECURSOR_RETRAIN_KAFKA__TOPIC_PREFIX", "plant-7")
    kafka = RetrainSettings().kafka
    assert (kafka.bootstrap_servers, kafka.topic_prefix) == ("broker-1:9093", "plant-7")


def test_a_nested_value_that_is_wrong_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_RETRAIN_TRAINING__MAX_MINUTES", "-1")
    with pytest.raises(ValueError, match=r"training\.max_minutes"):
        RetrainSettings()


def test_lists_are_read_as_people_write_them_in_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README names TRUSTED_KEYS and CANARY_EDGES: one path, or a comma-separated list, not only JSON."""
    monkeypatch.setenv("PRECURSOR_RETRAIN_TRUSTED_KEYS", "/etc/precursor/keys")
    monkeypatch.setenv("PRECURSOR_RETRAIN_CANARY_EDGES", "edge-1, edge-2")
    settings = RetrainSettings()
    assert settings.trusted_keys == [Path("/etc/precursor/keys")]
    assert settings.canary_edges == ["edge-1", "edge-2"]
    monkeypatch.setenv("PRECURSOR_RETRAIN_TRUSTED_KEYS", '["/a.pub", "/b.pub"]')
    monkeypatch.setenv("PRECURSOR_RETRAIN_CANARY_EDGES", "")
    settings = RetrainSettings()
    assert (settings.trusted_keys, settings.canary_edges) == ([Path("/a.pub"), Path("/b.pub")], [])
    monkeypatch.setenv("PRECURSOR_DRIFT_RETRAIN__CANARY_EDGES", "edge-3")
    assert DriftCheckSettings().retrain.canary_edges == ["edge-3"]


def test_a_list_that_is_wrong_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRECURSOR_RETRAIN_CANARY_EDGES", "edge 1")
    with pytest.raises(ValueError, match=r"canary_edges\.0"):
        RetrainSettings()


@pytest.mark.parametrize(("command", "variable"), [("retrain", "PRECURSOR_RETRAIN_TRAINING"),
                                                   ("drift-check", "PRECURSOR_DRIFT_RETRAIN")])  # fmt: skip
def test_a_variable_whose_json_does_not_parse_is_named_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: str, variable: str
) -> None:
    from typer.testing import CliRunner

    from precursor.flows_cli import flows_app

    monkeypatch.setenv(variable, "{max_steps: 3")
    monkeypatch.setenv("PRECURSOR_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(flows_app, ["run", command])
    assert result.exit_code == 2, result.output
    assert "well formed" in result.output and "Traceback" not in result.output
