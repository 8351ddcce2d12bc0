"""Signed heartbeats end to end: edge agents -> the real Kafka broker -> the real Beam pipeline -> store -> HTTP API.

A verified, an unsigned and two forged heartbeats arrive (one forgery reuses a real heartbeat's (edge_id, seq) and
arrives before it); every one is stored, and the API flags the edges they concern.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from kafka import KafkaProducer

from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeConfig
from edge_agent.identity import EdgeIdentity, enroll
from edge_agent.publisher import KafkaPublisher
from edge_agent.scorers import RunningModel, ScorerSlot, load_scorer
from pipelines.run import run_once
from pipelines.settings import PipelineSettings
from precursor.api.app import create_app
from precursor.api.settings import ApiSettings
from precursor.contracts.messages import Heartbeat, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.fixtures_api import TOKEN
from tests.test_edge_agent import ListSink

pytestmark = pytest.mark.integration

MANIFEST = b'{"model_name": "precursor-lm", "version": "3"}'
RELEASED = hashlib.sha256(MANIFEST).hexdigest()
UNRELEASED = "e" * 64


def agent(tmp_path: Path, edge_id: str, sink: object, model_sha256: str, *, enrolled: bool) -> EdgeAgent:
    cfg = EdgeConfig.from_dict(
        {"edge_id": edge_id, "sources": [{"telemetry": "t.csv"}], "state_dir": f"state-{edge_id}"}, base=tmp_path
    )
    identity = EdgeIdentity.load(cfg.state_dir, edge_id) if enrolled else None
    slot = ScorerSlot(RunningModel(load_scorer(cfg.model), None, model_sha256))
    return EdgeAgent(cfg, slot, sink, identity=identity)  # type: ignore[arg-type]


def test_every_heartbeat_is_stored_and_the_unsigned_and_forged_ones_are_flagged(
    tmp_path: Path, kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    enrolled = tmp_path / "enrolled-edges"
    enrolled.write_text("".join(enroll(tmp_path / f"state-{edge}", edge).line + "\n" for edge in ("edge-a", "edge-c")))
    registry = tmp_path / "registry" / "precursor-lm" / "3"
    registry.mkdir(parents=True)
    (registry / "manifest.json").write_bytes(MANIFEST)
    monkeypatch.setenv("PRECURSOR_PIPELINE_ENROLLED_EDGES", str(enrolled))
    monkeypatch.setenv("PRECURSOR_PIPELINE_MODEL_REGISTRY", str(tmp_path / "registry"))

    # edge-a's real heartbeat, held back so that a forgery of it reaches the broker first.
    held = ListSink()
    genuine: Heartbeat = agent(tmp_path, "edge-a", held, RELEASED, enrolled=True).heartbeat(
        health="ok", outbox_depth=0, lag_s=0.5
    )
    assert genuine.signature is not None
    attacker = KafkaProducer(**kafka_settings.client_kwargs(), acks="all")
    topic = kafka_settings.topics.heartbeats
    swapped_model = genuine.model_copy(update={"model_sha256": UNRELEASED, "model_version": "6.6.6"})
    stranger = EdgeIdentity("edge-a", Ed25519PrivateKey.generate()).sign(
        genuine.model_copy(update={"seq": genuine.seq + 100, "health": "failing"})
    )
    for forged in (swapped_model, stranger):
        attacker.send(topic, key=b"edge-a", value=encode(forged))
    attacker.flush()
    attacker.close()

    publisher = KafkaPublisher(kafka_settings)
    publisher.send(genuine)
    agent(tmp_path, "edge-b", publisher, RELEASED, enrolled=False).heartbeat(health="ok", outbox_depth=2, lag_s=0.0)
    agent(tmp_path, "edge-c", publisher, UNRELEASED, enrolled=True).heartbeat(health="ok", outbox_depth=0, lag_s=0.0)
    publisher.close()

    store_path = tmp_path / "store.duckdb"
    report = run_once(kafka_settings, store_path, pipeline_settings=PipelineSettings())

    assert (report.heartbeats_read, report.heartbeats_stored) == (5, 5)  # nothing lost, nothing in place of another
    with connect(store_path, read_only=True) as con:
        rows = con.execute(
            "SELECT edge_id, seq, trust, model_version, model_known, key_id IS NOT NULL, trust_reason "
            "FROM heartbeats ORDER BY edge_id, seq, trust"
        ).fetchall()
    by_trust = {(r[0], r[2], r[1]): r for r in rows}
    assert by_trust[("edge-a", "verified", genuine.seq)][3:6] == (genuine.model_version, True, True)
    assert by_trust[("edge-a", "forged", genuine.seq)][3] == "6.6.6"
    assert "does not match the signed data" in by_trust[("edge-a", "forged", genuine.seq)][6]
    assert "is not enrolled for edge 'edge-a'" in by_trust[("edge-a", "forged", genuine.seq + 100)][6]
    assert [r[2] for r in rows if r[0] == "edge-b"] == ["unsigned"]
    assert [(r[2], r[4]) for r in rows if r[0] == "edge-c"] == [("verified", False)]

    app = create_app(ApiSettings(tokens=TOKEN, store=store_path), kafka_settings)
    with TestClient(app) as client:
        response = client.get("/api/v1/models/rollout", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    edges = {e["edge_id"]: e for e in response.json()}
    a, b, c = edges["edge-a"], edges["edge-b"], edges["edge-c"]
    assert a["identity"]["flags"] == ["forged"] and a["identity"]["forged"] == 2
    assert (
        a["heartbeat"]["trust"] == "verified" and a["heartbeat"]["model_version"] == genuine.model_version
    )  # not the forgery's
    assert a["heartbeat"]["health"] == "ok" and a["running_version"] == genuine.model_version
    assert b["identity"]["flags"] == ["unsigned"] and b["heartbeat"]["key_id"] is None
    assert c["identity"]["flags"] == ["unknown_model"] and c["heartbeat"]["model_known"] is False
    assert c["heartbeat"]["agent_sha256"] == genuine.agent.sha256  # type: ignore[union-attr]

    again = run_once(kafka_settings, store_path, pipeline_settings=PipelineSettings(), from_beginning=True)
    assert (again.heartbeats_read, again.heartbeats_stored) == (5, 0)  # a replay doubles nothing
