"""The same pipelines on other engines: Beam's portable Prism runner and Flink give the local runner's results."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from contracts.settings import KafkaSettings
from pipelines.engines import (
    FLINK,
    LOCAL,
    PRISM,
    EngineError,
    EngineSettings,
    engine,
    install_flink,
    install_prism,
)
from pipelines.labeling import read_dataset, run_labeling
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from tests.test_pipeline_alerts import produce, second_topics, stored_alerts, wavy  # noqa: F401 (a fixture)
from tests.test_pipeline_labeling import FleetHistory, store_history

REPO_ROOT = Path(__file__).resolve().parents[1]
SETTINGS = PipelineSettings(allowed_lateness="30m")


@pytest.fixture(scope="session")
def engine_settings() -> EngineSettings:
    """The developer's installed engines (``precursor pipeline engines --install prism``); built here if missing."""
    state_dir = Path(os.environ.get("PRECURSOR_STATE_DIR", REPO_ROOT / ".state"))
    settings = EngineSettings(root=state_dir / "engines")
    install_prism(settings)
    return settings


@pytest.fixture(scope="session")
def flink_settings(engine_settings: EngineSettings) -> EngineSettings:
    """Beam's Flink job server, resolved from Maven Central here if missing; an embedded Flink cluster per run."""
    install_flink(engine_settings)
    return engine_settings.model_copy(update={"parallelism": 2})


@pytest.mark.parametrize("runner", [PRISM, pytest.param(FLINK, marks=pytest.mark.integration)])
def test_labeling_on_a_portable_engine_gives_the_same_dataset_as_the_local_runner(
    runner: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    settings: EngineSettings = request.getfixturevalue("flink_settings" if runner == FLINK else "engine_settings")
    history = FleetHistory(
        machines=5, hours=96, failures=[("pump-01", 30.5, "failure:bearing"), ("pump-03", 60, "failure")]
    )
    store = store_history(tmp_path / "store.duckdb", history.messages(wavy))

    local = run_labeling(store, tmp_path / "local", settings=SETTINGS, runner=LOCAL)
    portable = run_labeling(store, tmp_path / "portable", settings=SETTINGS, runner=runner, engine_settings=settings)

    assert local.outcomes == portable.outcomes and local.outcomes["bearing"] == 24 and local.outcomes["failure"] == 24
    assert (local.examples, local.pending) == (portable.examples, portable.pending)
    assert local.pending > 0
    assert read_dataset(tmp_path / "local").equals(read_dataset(tmp_path / "portable"))


@pytest.mark.integration
@pytest.mark.parametrize("runner", [PRISM, FLINK])
def test_ingest_with_alert_state_and_timers_on_a_portable_engine_matches_the_local_runner(
    runner: str,
    tmp_path: Path,
    kafka_settings: KafkaSettings,
    second_topics: KafkaSettings,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    settings: EngineSettings = request.getfixturevalue("flink_settings" if runner == FLINK else "engine_settings")
    messages = FleetHistory(machines=3, hours=40).messages(wavy)
    produce(kafka_settings, messages)
    produce(second_topics, messages)

    local = run_once(kafka_settings, tmp_path / "local.duckdb", pipeline_settings=SETTINGS)
    portable = run_once(
        second_topics, tmp_path / "portable.duckdb", pipeline_settings=SETTINGS, runner=runner,
        engine_settings=settings,
    )  # fmt: skip

    assert (portable.read, portable.stored, portable.alerts_raised) == (local.read, local.stored, local.alerts_raised)
    assert local.alerts_raised > 0
    assert stored_alerts(tmp_path / "local.duckdb") == stored_alerts(tmp_path / "portable.duckdb")


def test_flink_runs_on_the_resolved_job_server_jar_with_an_embedded_cluster_by_default(tmp_path: Path) -> None:
    jar = tmp_path / "beam-runners-flink-1.20-job-server-2.77.0.jar"
    jar.write_bytes(b"PK")
    flink = engine(FLINK, ["--max_parallelism=4"], EngineSettings(root=tmp_path, flink_job_server_jar=jar))
    options = flink.options.get_all_options(drop_default=True)
    assert flink.runner == "FlinkRunner"
    assert flink.bundle_per_key and not engine(LOCAL).bundle_per_key  # so ingest regroups before its store writes
    assert options["flink_master"] == "[local]" and options["flink_job_server_jar"] == str(jar)
    assert options["environment_type"] == "LOOPBACK" and options["parallelism"] == 2
    assert options["max_parallelism"] == 4
    remote = engine(FLINK, [], EngineSettings(root=tmp_path, flink_job_server_jar=jar, flink_master="flink:8081"))
    assert remote.options.get_all_options()["flink_master"] == "flink:8081"


def test_an_engine_that_is_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="precursor pipeline engines --install flink"):
        engine(FLINK, [], EngineSettings(root=tmp_path))
    with pytest.raises(EngineError, match="precursor pipeline engines --install prism"):
        engine(PRISM, [], EngineSettings(root=tmp_path))
    with pytest.raises(EngineError, match=re.escape("flink_job_server_jar='/nowhere.jar': no such file")):
        engine(FLINK, [], EngineSettings(root=tmp_path, flink_job_server_jar=Path("/nowhere.jar")))
