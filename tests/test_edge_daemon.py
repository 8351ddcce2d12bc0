"""The agent as an operator runs it: /healthz and /metrics, structured logs, SIGTERM draining, config errors at
start, and an edge process that never loads the cloud stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon, main
from edge_agent.outbox import Outbox
from infra.processes import free_ports
from precursor.contracts.messages import Heartbeat, Prediction, decode
from tests.fixtures_edge import wait_for

REPO = Path(__file__).resolve().parents[1]
NO_KAFKA = {"bootstrap_servers": "127.0.0.1:1"}  # nothing listens there: the outbox keeps everything


def write_telemetry(path: Path, minutes: int = 60) -> int:
    rows = ["timestamp,machine_id,temp,vib"]
    for minute in range(minutes):
        for m in ("m1", "m2"):
            rows.append(f"2026-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z,{m},{20 + minute % 9},{minute % 4}")
    rows.append("2026-01-01T00:30:00Z,m1,hot,1")
    path.write_text("\n".join(rows) + "\n")
    return 2 * minutes


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_healthz_and_metrics_report_what_the_agent_does(tmp_path: Path) -> None:
    readings = write_telemetry(tmp_path / "telemetry.csv")
    config = EdgeConfig.from_dict(
        {
            "edge_id": "edge-h",
            "kafka": NO_KAFKA,
            "sources": [{"type": "replay", "telemetry": "telemetry.csv"}],
            "window": {"length": "10m", "every": "5m"},
            "health": {"port": 0},
            "exit_when_sources_end": False,
            "drain_timeout": "0s",
            "state_dir": "state",
        },
        base=tmp_path,
    )
    daemon = AgentDaemon(config)
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: daemon.agent.stats.readings == readings and daemon.outbox.staged == 0, 10, what="replay")
        wait_for(lambda: daemon.sender.broker_reachable is False, 10, what="the sender giving up")  # type: ignore[union-attr]
        assert daemon.health is not None
        base = f"http://127.0.0.1:{daemon.health.port}"
        code, body = get(f"{base}/healthz")
        report = json.loads(body)
        assert code == 200 and report["status"] == "degraded"  # working, but Kafka is away
        assert report["kafka"]["reachable"] is False and "no Kafka broker reachable" in report["kafka"]["last_error"]
        assert report["model"]["name"] == "drift-zscore"
        assert report["stats"]["readings"] == readings and report["quarantined"] == {"wrong_type": 1}
        assert report["outbox"]["depth"] == daemon.outbox.depth > 0

        code, body = get(f"{base}/metrics")
        assert code == 200
        metrics = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }
        stats = daemon.agent.stats
        assert metrics[("precursor_edge_readings_total", ())] == readings
        assert metrics[("precursor_edge_predictions_total", ())] == stats.predictions > 0
        assert metrics[("precursor_edge_explained_total", ())] == 0  # the baseline has no explanation
        assert metrics[("precursor_edge_quarantined_total", (("kind", "wrong_type"),))] == 1
        assert metrics[("precursor_edge_outbox_depth", ())] == daemon.outbox.depth
        assert metrics[("precursor_edge_kafka_reachable", ())] == 0
        assert metrics[("precursor_edge_health", (("state", "degraded"),))] == 1
        assert metrics[("precursor_edge_reading_to_outbox_seconds_count", ())] == stats.predictions
        info = [k for k in metrics if k[0] == "precursor_edge_model_info"]
        assert info and ("name", "drift-zscore") in info[0][1]
        assert get(f"{base}/nope")[0] == 404
    finally:
        daemon.request_stop()
        runner.join(20)


def test_sigterm_drains_flushes_and_a_restart_resumes(tmp_path: Path) -> None:
    readings = write_telemetry(tmp_path / "telemetry.csv")
    port = free_ports(1)[0]
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "edge_id": "edge-term",
                "kafka": NO_KAFKA,
                "sources": [{"type": "tail", "path": "telemetry.csv", "poll": "0.05s"}],
                "window": {"length": "10m", "every": "5m"},
                "health": {"port": port},
                "drain_timeout": "1s",
                "state_dir": "state",
            }
        )
    )

    def run_until_read(count: int) -> tuple[int, list[dict[str, object]]]:
        env = os.environ | {"PYTHONPATH": str(REPO)}
        process = subprocess.Popen(
            [sys.executable, "-m", "edge_agent.daemon", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

        def read() -> int:
            code, body = get(f"http://127.0.0.1:{port}/healthz")
            return int(json.loads(body)["stats"]["readings"]) if code == 200 else -1

        def settled() -> bool:
            try:
                return read() == count
            except OSError:
                return False

        wait_for(settled, 30, what=f"{count} readings")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        return process.returncode, [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]

    code, logs = run_until_read(readings)
    assert code == 0
    messages = [entry["msg"] for entry in logs]
    assert any("SIGTERM" in m for m in messages) and "stopped" in messages
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in logs)
    assert any(entry.get("kind") == "wrong_type" for entry in logs)  # the bad row, logged with its kind
    box = Outbox(tmp_path / "state" / "outbox.sqlite", max_bytes=10**8)
    rows = box.reader().pending(10**6)
    predictions = [decode(Prediction, r.value) for r in rows if r.kind == "prediction"]
    heartbeats = [decode(Heartbeat, r.value) for r in rows if r.kind == "heartbeat"]
    assert len(predictions) == 2 * 11  # windows end every 5 minutes from 00:05 to 00:55, for two machines
    assert heartbeats and heartbeats[-1].outbox_depth >= len(predictions)
    box.db.close()

    with (tmp_path / "telemetry.csv").open("a") as fh:  # two more readings while it was down
        fh.write("2026-01-01T01:00:00Z,m1,1,1\n2026-01-01T01:00:00Z,m2,1,1\n")
    code, _ = run_until_read(2)  # the restart reads only what is new
    assert code == 0
    box = Outbox(tmp_path / "state" / "outbox.sqlite", max_bytes=10**8)
    again = [decode(Prediction, r.value) for r in box.reader().pending(10**6) if r.kind == "prediction"]
    assert len(again) == len(predictions) + 2  # the windows ending at 01:00
    assert len({p.seq for p in again}) == len(again)


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "edge_id: e\nsources: [{type: tail}]\noutbox: {max_bytes: lots}\nhealth: {port: 70000}\n",
            ["sources.0.tail.path: Field required", "outbox.max_bytes", "health.port"],
        ),
        ("edge_id: e\nsources: [{type: carrier-pigeon}]\n", ["sources.0", "carrier-pigeon"]),
        ("edge_id: e\nsources: [{type: mqtt, topics: []}]\n", ["sources.0.mqtt.topics"]),
        (
            "edge_id: e\nsources: [{telemetry: t.csv}]\nmodel: {type: lm, artifact: nowhere, trusted_keys: [k.pub]}\n",
            ["model: cannot load", "cannot read public key file", "k.pub"],
        ),
        ("edge_id: e\nsources: [{type: tail, path: t.txt}]\n", ["cannot tell the format from the suffix '.txt'"]),
        ("- just a list\n", ["expected a mapping"]),
    ],
)
def test_bad_configs_stop_the_start_with_errors_that_name_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, expected: list[str]
) -> None:
    config = tmp_path / "edge.yaml"
    config.write_text(yaml_text + f"state_dir: {tmp_path / 'state'}\n" if "edge_id" in yaml_text else yaml_text)
    assert main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err


def test_the_edge_agent_never_imports_the_cloud_stack() -> None:
    code = (
        "import sys, edge_agent.daemon, edge_agent.updates, edge_agent.mqtt, edge_agent.tail, models.edge.runtime; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'apache_beam', 'prefect', "
        "'sklearn', 'duckdb'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "[]"


def test_the_example_config_and_systemd_unit_fit_together() -> None:
    import configparser

    example = EdgeConfig.load(REPO / "infra" / "systemd" / "edge.example.yaml")
    assert [s.type for s in example.sources] == ["tail", "mqtt"]
    assert example.updates_active and example.health.port == 9308
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(REPO / "infra" / "systemd" / "precursor-edge.service")
    service = unit["Service"]
    assert service["ExecStart"].endswith("precursor edge run --config /etc/precursor/edge.yaml")
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) > example.drain_timeout.total_seconds()
    assert str(example.state_dir) == "/var/lib/precursor-edge" == service["WorkingDirectory"]
