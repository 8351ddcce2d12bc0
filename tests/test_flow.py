"""The dataflow stage by stage: edge flow in signed heartbeats, RAPL and the power model, the bottleneck rule on
made-up figures, and, against the real broker, an edge that keeps producing while the pipeline stands: the flow
answer, the dashboard's flow page (headless Chromium, screenshot kept) and ``precursor status`` all mark the
pipeline, and once it has caught up none is marked."""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon
from edge_agent.flow_meter import FlowMeter
from edge_agent.identity import EdgeIdentity, enroll
from infra.energy import CostMeter, EnergySettings, Rapl
from infra.kafka_admin import TopicBacklog
from pipelines.edge_trust import HeartbeatJudge
from pipelines.flow import (
    EdgeFigures,
    FlowReport,
    FlowSettings,
    Observations,
    assess,
    flow_report,
    newest_training,
)
from pipelines.run import run_once
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.cli import app as cli
from precursor.contracts.messages import ContractError, EdgeFlow, Heartbeat, decode, encode
from precursor.contracts.settings import KafkaSettings
from tests.fixtures_api import TOKEN, serving
from tests.fixtures_browser import (
    browser,  # noqa: F401 (a fixture)
    open_fleet_page,
    read,
    screenshot,
    wait_for,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


# -- the edge's figures ----------------------------------------------------------------------------------------------


def beat(**flow: Any) -> Heartbeat:
    return Heartbeat(
        edge_id="edge-1",
        seq=9,
        timestamp="2026-03-01T12:00:00Z",
        model_name="drift-zscore",
        model_version="1",
        flow=EdgeFlow(interval_s=30, **flow) if flow else None,
    )


def test_the_flow_is_signed_with_the_heartbeat_bounded_and_absent_from_older_ones(tmp_path: Path) -> None:
    enrolled = tmp_path / "enrolled-edges"
    enrolled.write_text(enroll(tmp_path / "state", "edge-1").line + "\n")
    judge = HeartbeatJudge.from_files(enrolled, None)
    identity = EdgeIdentity.load(tmp_path / "state", "edge-1")
    assert identity is not None
    signed = identity.sign(beat(readings_per_s=120.0, scoring_ms_p50=1.5, predictions=40))
    assert judge.judge(decode(Heartbeat, encode(signed))).trust == "verified"
    raised = signed.model_copy(update={"flow": signed.flow.model_copy(update={"readings_per_s": 9e5})})  # type: ignore[union-attr]
    assert judge.judge(raised).trust == "forged"  # the figures are covered by the signature
    assert b'"flow"' not in beat().statement()  # a heartbeat without them signs what it signed before
    too_big = encode(signed).replace(b'"readings_per_s":120.0', b'"readings_per_s":1e300')
    with pytest.raises(ContractError, match=r"flow\.readings_per_s"):
        decode(Heartbeat, too_big)
    with pytest.raises(ContractError, match="schema_version 2"):
        decode(Heartbeat, encode(beat(readings_per_s=1.0)).replace(b'"schema_version":2', b'"schema_version":1'))


def test_the_flow_meter_reports_rates_scoring_percentiles_and_cpu() -> None:
    clock = iter([100.0, 110.0, 130.0])
    cpu = iter([5.0, 7.5, 8.0])
    meter = FlowMeter(clock=lambda: next(clock), cpu=lambda: next(cpu))
    for ms in (1, 1, 1, 1, 1, 1, 1, 1, 1, 20):  # one slow batch in ten
        meter.scored(windows=2, wall_s=2 * ms / 1000, cpu_s=0.001)
    first = meter.report(readings=1000, windows=20, predictions=19)
    assert (first.interval_s, first.readings_per_s, first.windows_per_s, first.predictions_per_s) == (10, 100, 2, 1.9)
    assert first.scoring_ms_p50 == pytest.approx(1.0) and first.scoring_ms_p95 == pytest.approx(20.0)
    assert first.scoring_busy == pytest.approx(0.058 / 10)
    assert first.cpu_s == pytest.approx(2.5) and first.scoring_cpu_s == pytest.approx(0.01) and first.predictions == 19
    second = meter.report(readings=1400, windows=20, predictions=19)  # rates are per interval, totals run on
    assert (second.readings_per_s, second.windows_per_s, second.scoring_ms_p50, second.cpu_s) == (20, 0, None, 3)


def test_rapl_counters_are_summed_over_packages_and_unwrapped(tmp_path: Path) -> None:
    for zone, start in (("intel-rapl:0", 900_000), ("intel-rapl:1", 10), ("intel-rapl:0:0", 5)):
        (tmp_path / zone).mkdir()
        (tmp_path / zone / "energy_uj").write_text(f"{start}\n")
        (tmp_path / zone / "max_energy_range_uj").write_text("1000000\n")
    rapl = Rapl.open(tmp_path)
    assert rapl is not None
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("100000\n")  # wrapped: 200,000 µJ later
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500010\n")
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("999999\n")  # a part of package 0: not counted twice
    assert rapl.joules() == pytest.approx(0.7)
    with CostMeter(EnergySettings(powercap=tmp_path / "none", watts_per_core=4)) as meter:
        sum(i * i for i in range(200_000))
    cost = meter.cost(500)
    assert cost.energy_source == "model" and cost.cpu_s > 0 and cost.energy_j == pytest.approx(4 * cost.cpu_s)
    assert "4 W per busy core" in cost.basis and cost.cpu_s_per_1000 == pytest.approx(2 * cost.cpu_s)


# -- the rule --------------------------------------------------------------------------------------------------------


def edge(busy: float = 0.1, outbox: int = 0, oldest_s: float = 0.0, energy_j: float | None = None) -> EdgeFigures:
    return EdgeFigures(
        edge_id="edge-1",
        heartbeat_at=NOW,
        health="ok",
        outbox_depth=outbox,
        outbox_lag_s=oldest_s,
        flow=EdgeFlow(
            interval_s=30,
            readings_per_s=400,
            windows_per_s=20,
            predictions_per_s=20,
            scoring_busy=busy,
            cpu_s=12,
            scoring_cpu_s=3,
            predictions=6000,
            energy_j=energy_j,
        ),
    )


def topic(lag: int, produced_per_s: float = 20.0) -> TopicBacklog:
    return TopicBacklog("p.predictions", 6, 10_000, 10_000 - lag, lag, int(produced_per_s * 60), 60, NOW)


def run(read: int, seconds: float = 4.0, write_s: float = 0.4, cpu_s: float = 3.0) -> dict[str, Any]:
    return {
        "read": read,
        "predictions_read": read,
        "parsed": read,
        "duplicates": 0,
        "stored_rows": read,
        "already_stored": 0,
        "store_writes": 4,
        "store_write_s": write_s,
        "store_write_max_ms": 250.0,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "energy_j": None,
        "finished_at": NOW,
    }


def seen(edges: list[EdgeFigures], lag: int, runs: list[dict[str, Any]]) -> Observations:
    return Observations(
        at=NOW, window_s=60, edges=edges, topics=[topic(lag)], runs=runs, cost_runs=runs, last_run_at=NOW
    )


RULE = FlowSettings(min_backlog=100)


@pytest.mark.parametrize(
    ("observed", "bottleneck"),
    [
        (seen([edge()], lag=40, runs=[run(1200)]), None),  # keeps up: a little lag between runs
        (seen([edge()], lag=5000, runs=[]), "pipeline"),  # stands: nothing drained
        (seen([edge()], lag=5000, runs=[run(600)]), "pipeline"),  # drains 10/s of 20/s arriving
        (seen([edge()], lag=5000, runs=[run(600, seconds=50, write_s=40)]), "store"),  # ... waiting on writes
        (seen([edge(outbox=800, oldest_s=95)], lag=0, runs=[]), "kafka"),  # the edges cannot deliver
        (seen([edge(busy=0.97)], lag=5000, runs=[]), "edge"),  # upstream first
    ],
)
def test_the_bottleneck_is_the_first_stage_behind(observed: Observations, bottleneck: str | None) -> None:
    report = assess(observed, RULE, EnergySettings(watts_per_core=10, use_rapl=False))
    assert report.bottleneck == bottleneck
    assert [s.name for s in report.stages if s.bottleneck] == ([bottleneck] if bottleneck else [])
    if bottleneck is None:
        assert report.verdict == "The flow keeps up: no stage is behind."
    else:
        assert report.verdict.startswith(f"The {dict(edge='edge agents').get(bottleneck, bottleneck)} is the")


def test_the_report_carries_the_store_and_topic_figures_of_the_window() -> None:
    slow = {**run(800, seconds=6.0, write_s=1.6), "store_write_max_ms": 900.0}
    report = assess(seen([edge()], 40, [run(1200), slow]), RULE, EnergySettings(watts_per_core=10, use_rapl=False))
    assert report.store.writes == 8
    assert report.store.write_ms_mean == pytest.approx(250.0)  # 2 s of writes over 8
    assert report.store.write_ms_max == 900.0
    assert report.store.write_share == pytest.approx(0.2)  # 2 s of the runs' 10 s
    assert report.store.last_run_at == NOW
    (figures,) = report.topics
    assert (figures.topic, figures.lag, figures.committed) == ("p.predictions", 40, 9960)
    assert figures.produced_per_s == pytest.approx(20.0)


def test_cost_per_thousand_predictions_names_its_energy_basis() -> None:
    report = assess(seen([edge(energy_j=900.0)], 0, [run(1200), run(800)]), RULE, EnergySettings(watts_per_core=5))
    costs = {c.part: c for c in report.costs}
    assert costs["edge scoring"].cpu_s_per_1000 == pytest.approx(0.5)  # 3 CPU-s over 6000 predictions
    assert costs["edge scoring"].energy_source == "model" and costs["edge scoring"].energy_j_per_1000 == 2.5
    assert costs["edge agent"].energy_source == "rapl" and costs["edge agent"].energy_j_per_1000 == 150
    assert costs["pipeline ingest"].cpu_s_per_1000 == pytest.approx(3.0)  # 6 CPU-s over 2000
    assert "5 W per busy core" in report.energy_model


def test_retraining_cost_comes_from_the_newest_registered_version(tmp_path: Path) -> None:
    windows = {"ok": 900, "failure": 100}
    for version, cpu_s, written in (("2", 40.0, 2_000_000_000), ("1", 80.0, 1_000_000_000)):
        meta = tmp_path / "precursor-lm" / version / "precursor.json"
        meta.parent.mkdir(parents=True)
        training = {"cpu_s": cpu_s, "seconds": 60.0}
        meta.write_text(json.dumps({"training": training, "data": {"training_windows": windows}}))
        os.utime(meta, (written, written))  # the newest is the one written last
    observed = seen([], 0, [])
    observed.retraining = newest_training(tmp_path)
    assert observed.retraining is not None and observed.retraining.version == "2"
    (row,) = [c for c in assess(observed, RULE).costs if c.part == "retraining"]
    assert (row.cpu_s_per_1000, row.per, row.predictions) == (40.0, "training windows", 1000)
    assert newest_training(tmp_path / "empty") is None


# -- end to end: a stopped pipeline ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_stopped_pipeline_is_marked_by_the_api_the_page_and_precursor_status(
    kafka_settings: KafkaSettings,
    tmp_path: Path,
    browser: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = tmp_path / "store.duckdb"
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-flow",
            "kafka": {
                "bootstrap_servers": kafka_settings.bootstrap_servers,
                "topic_prefix": kafka_settings.topic_prefix,
            },
            "sources": [{"type": "simulator", "machines": 4, "interval": "10m", "seed": 3, "speedup": 7200}],
            "window": {"length": "2h", "every": "1h", "min_points": 3},
            "heartbeat": {"interval": "1s"},
            "health": {"enabled": False},
            "log": {"format": "text", "level": "WARNING"},
            "exit_when_sources_end": False,
            "drain_timeout": "2s",
            "state_dir": "edge",
        },
        base=tmp_path,
    )
    daemon = AgentDaemon(config)
    edge_thread = threading.Thread(target=daemon.run, name="edge-flow", daemon=True)
    edge_thread.start()
    settings = FlowSettings(window_s=10, min_backlog=20)
    try:
        wait_for("predictions from the edge", lambda: daemon.sender.sent >= 50, timeout_s=60.0, interval_s=0.5)  # type: ignore[union-attr]
        first = run_once(kafka_settings, store)  # the pipeline runs once, then stands
        assert first.stored > 0

        def standing() -> FlowReport | None:
            report = flow_report(kafka_settings, store, settings=settings)
            return report if report.stages[2].output_per_s == 0 else None  # its one run left the window

        report = wait_for("the pipeline's run to leave the window", standing, timeout_s=60.0, interval_s=0.5)
        assert report.bottleneck == "pipeline", report.verdict
        stages = {s.name: s for s in report.stages}
        assert stages["edge"].state == "ok" and stages["edge"].input_per_s > 0  # the edge keeps producing
        assert stages["kafka"].state == "ok" and stages["pipeline"].backlog >= 20
        assert stages["pipeline"].output_per_s == 0 and stages["pipeline"].input_per_s > 0
        assert [e.edge_id for e in report.edges] == ["edge-flow"] and report.edges[0].flow.scoring_ms_p50 is not None
        assert {c.part for c in report.costs} >= {"edge scoring", "edge agent", "pipeline ingest"}
        assert {t.topic for t in report.topics if t.lag} >= {kafka_settings.topics.predictions}

        # The API and its page say the same.
        app = create_app(ApiSettings(tokens=TOKEN, store=store), kafka_settings)
        app.state.flow_settings = settings
        with serving(app) as base:
            answer = httpx.get(f"{base}/api/v1/flow", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).json()
            assert answer["bottleneck"] == "pipeline"
            open_fleet_page(browser, base)
            browser.get(f"{base}/dashboard/#/flow")
            wait_for("the flow page", lambda: browser.execute_script("return document.body.dataset.ready") == "flow")
            marked = wait_for(
                "the marked stage", lambda: read(browser, "#flow-stages [data-bottleneck='true']", "data-stage")
            )
            assert marked == [["pipeline"]]
            assert read(browser, "#flow-verdict", "data-bottleneck") == [["pipeline"]]
            assert read(browser, "#flow-stages [data-stage]", "data-stage") == [
                ["edge"],
                ["kafka"],
                ["pipeline"],
                ["store"],
            ]
            parts = [p for (p,) in read(browser, "#flow-cost-table tbody tr", "data-part")]
            assert {"edge scoring", "pipeline ingest"} <= set(parts)
            assert read(browser, "[data-nav='flow']", "class") == [["active"]]
            screenshot(browser, "dashboard-flow.png")
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], errors

        # precursor status, from Kafka and the store directly.
        monkeypatch.setenv("PRECURSOR_KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
        monkeypatch.setenv("PRECURSOR_KAFKA_TOPIC_PREFIX", kafka_settings.topic_prefix)
        monkeypatch.setenv("PRECURSOR_FLOW_MIN_BACKLOG", "20")
        result = CliRunner().invoke(cli, ["status", "--store", str(store), "--window", "10s", "--check"])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("The pipeline is the bottleneck")
        marked = [line for line in result.output.splitlines() if "◀ bottleneck" in line]
        assert len(marked) == 1 and marked[0].startswith("│ Pipeline"), result.output
        shown = json.loads(
            CliRunner().invoke(cli, ["status", "--store", str(store), "--window", "10s", "--json"]).output
        )
        assert shown["bottleneck"] == "pipeline"
    finally:
        daemon.request_stop()
        edge_thread.join(30)
    assert not edge_thread.is_alive()

    # With the edge stopped, one run catches up: nothing is behind.
    run_once(kafka_settings, store)
    caught_up = flow_report(kafka_settings, store, settings=settings)
    assert caught_up.bottleneck is None, caught_up.verdict
    assert {s.name: s.backlog for s in caught_up.stages}["pipeline"] == 0
