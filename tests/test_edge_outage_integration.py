"""Kafka stopped for 30 s in the middle of a stream, then started again: the agent keeps predicting into its outbox,
and every prediction, those made during the outage included, reaches the prediction store exactly once.

The slowest test of the suite (about a minute): it stops and restarts the session's real broker.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon
from infra.kafka_broker import LocalKafka
from pipelines.run import run_once
from precursor.contracts.messages import Prediction, decode
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.fixtures_edge import TelemetryWriter, expected_windows, wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = 30.0
EDGE = "edge-outage"


def stored_predictions(store: Path, edge_id: str) -> list[tuple[str, int, int]]:
    if not store.exists():
        return []
    with connect(store, read_only=True) as con:
        return con.execute(
            "SELECT machine_id, CAST(epoch(window_end) AS BIGINT), seq FROM predictions WHERE edge_id = ?", [edge_id]
        ).fetchall()


def test_kafka_down_for_30_seconds_every_prediction_reaches_the_store_exactly_once(
    tmp_path: Path, kafka_broker: LocalKafka, kafka_settings: KafkaSettings
) -> None:
    writer = TelemetryWriter(tmp_path / "telemetry.csv", [f"t-{i}" for i in range(6)], step_s=10, tick_s=0.05)
    config = EdgeConfig.from_dict(
        {
            "edge_id": EDGE,
            "kafka": kafka_settings.model_dump(),
            "sources": [{"type": "tail", "path": "telemetry.csv", "poll": "0.05s"}],
            "window": {"length": "2m", "every": "1m", "min_points": 3},
            "heartbeat": {"interval": "2s"},
            "health": {"port": 0},
            "updates": {"enabled": False},
            "exit_when_sources_end": False,
            "state_dir": "state",
        },
        base=tmp_path,
    )
    daemon = AgentDaemon(config)
    assert daemon.sender is not None
    runner = threading.Thread(target=daemon.run, name="agent", daemon=True)
    runner.start()
    writer.start()
    try:
        wait_for(lambda: daemon.sender.sent > 20, 30, what="predictions reaching Kafka")  # type: ignore[union-attr]

        predicted_before = daemon.agent.stats.predictions
        try:
            kafka_broker.down()
            down_at = time.monotonic()
            wait_for(lambda: daemon.sender.broker_reachable is False, 20, what="the sender noticing")  # type: ignore[union-attr]
            assert daemon.status()["status"] == "degraded"
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            # Meanwhile the agent kept predicting, and everything it made waits in the outbox.
            made_during_outage = daemon.agent.stats.predictions - predicted_before
            assert made_during_outage > 100
            assert daemon.outbox.depth >= made_during_outage
            waiting = daemon.outbox.reader().pending(10**6)
            outage_seqs = {decode(Prediction, r.value).seq for r in waiting if r.kind == "prediction"}
            assert len(outage_seqs) >= made_during_outage
        finally:
            kafka_broker.up(timeout_s=120)

        wait_for(lambda: daemon.sender.broker_reachable is True, 60, what="the sender reconnecting")  # type: ignore[union-attr]
        time.sleep(1.0)
    finally:
        writer.finish()
    wait_for(lambda: daemon.agent.stats.readings == len(writer.written), 30, what="every line read")
    wait_for(lambda: daemon.outbox.depth == 0 and daemon.outbox.staged == 0, 60, what="the outbox draining")
    daemon.request_stop()
    runner.join(30)
    assert not runner.is_alive()

    store = tmp_path / "store.duckdb"
    run_once(kafka_settings, store)
    rows = stored_predictions(store, EDGE)
    windows = {(m, end) for m, end, _ in rows}
    expected = expected_windows(writer.written, every_s=60, length_s=120, min_points=3)
    assert len(rows) == len(windows) == daemon.agent.stats.predictions  # no window stored twice
    assert windows == expected  # and none missing
    assert outage_seqs <= {seq for _, _, seq in rows}
    assert daemon.outbox.dropped == {"telemetry": 0, "heartbeat": 0, "prediction": 0, "event": 0}
