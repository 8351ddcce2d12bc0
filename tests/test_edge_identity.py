"""Edges that prove who they are: ``precursor edge enroll``, signed heartbeats, and how the pipeline judges them."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from edge_agent.agent import EdgeAgent
from edge_agent.config import EdgeConfig
from edge_agent.daemon import AgentDaemon
from edge_agent.daemon import main as daemon_main
from edge_agent.identity import EdgeIdentity, agent_build, enroll
from edge_agent.scorers import load_scorer
from models.edge.signing import load_public_key, public_key_text
from pipelines.edge_trust import HeartbeatJudge, release_hashes
from precursor.cli import app
from precursor.contracts.enrollment import EnrollmentError, parse_enrolled_edges
from precursor.contracts.messages import ContractError, Heartbeat, HeartbeatSignature, decode, encode
from precursor.store import PredictionStore, connect
from precursor.store.queries import reading
from tests.test_edge_agent import ListSink

runner = CliRunner()
RELEASED = "a" * 64


def beat(edge_id: str = "edge-1", seq: int = 7, **fields: object) -> Heartbeat:
    data: dict[str, object] = {
        "edge_id": edge_id,
        "seq": seq,
        "timestamp": datetime(2026, 3, 1, 0, 5, 0, 123456, tzinfo=UTC),
        "model_name": "precursor-lm",
        "model_version": "3",
        "model_sha256": RELEASED,
        "lag_s": 0.1 + 0.2,  # a float whose shortest repr is long: the statement must survive the wire
        "agent": agent_build(),
    }
    return Heartbeat.model_validate(data | fields)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[HeartbeatJudge, dict[str, EdgeIdentity]]:
    """Two enrolled edges, and the judge that knows them."""
    lines, identities = [], {}
    for edge in ("edge-1", "edge-2"):
        lines.append(enroll(tmp_path / edge, edge).line)
        identity = EdgeIdentity.load(tmp_path / edge, edge)
        assert identity is not None
        identities[edge] = identity
    enrolled = tmp_path / "enrolled-edges"
    enrolled.write_text("# the fleet\n" + "\n".join(lines) + "\n")
    return HeartbeatJudge.from_files(enrolled, None), identities


def _release(registry: Path) -> str:
    """A registry folder holding one release; returns the hash edges report for it."""
    version = registry / "precursor-lm" / "3"
    version.mkdir(parents=True)
    (version / "manifest.json").write_bytes(b'{"version": "3"}')
    return hashlib.sha256(b'{"version": "3"}').hexdigest()


# -- enroll ------------------------------------------------------------------------------------------------------


def test_enroll_makes_a_private_key_only_the_edge_reads_and_prints_the_line_that_enrolls_it(tmp_path: Path) -> None:
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump({"edge_id": "plant-7-gw-1", "sources": [{"telemetry": "t.csv"}], "state_dir": "state"})
    )
    result = runner.invoke(app, ["edge", "enroll", "--config", str(config)])
    assert result.exit_code == 0, result.output

    key_dir = tmp_path / "state" / "identity"
    private_key = key_dir / "edge.key"
    assert oct(private_key.stat().st_mode & 0o777) == "0o600"
    (line,) = [entry for entry in result.stdout.splitlines() if entry.strip()]
    (enrolled,) = parse_enrolled_edges(line, "stdout")
    assert enrolled.edge_id == "plant-7-gw-1"
    assert enrolled.public_key == public_key_text(load_public_key(key_dir / "edge.pub"))
    assert (key_dir / "enrollment.txt").read_text().strip() == line
    secret = private_key.read_bytes()
    body = b"".join(secret.splitlines()[1:-1]).decode()
    assert body not in result.output and body[:20] not in result.output

    again = runner.invoke(app, ["edge", "enroll", "--edge-id", "plant-7-gw-1", "--state-dir", str(tmp_path / "state")])
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == line and "kept it" in again.stderr
    assert private_key.read_bytes() == secret  # a key the fleet knows is never replaced


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "give --config FILE, or both --edge-id and --state-dir"),
        (["--edge-id", "e1"], "give --config FILE, or both --edge-id and --state-dir"),
        (["--edge-id", "bad id/..", "--state-dir", "s"], "edge_id 'bad id/..' must be"),
    ],
)
def test_enroll_refuses_what_it_cannot_enroll_and_says_why(tmp_path: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["edge", "enroll", *[a if a != "s" else str(tmp_path / "s") for a in args]])
    assert result.exit_code == 2
    assert expected in result.stderr
    assert not (tmp_path / "s").exists()


def test_an_enrolled_agent_signs_its_heartbeats_and_an_unenrolled_one_sends_them_unsigned(tmp_path: Path) -> None:
    cfg = EdgeConfig.from_dict(
        {"edge_id": "edge-t", "sources": [{"telemetry": "t.csv"}], "state_dir": "state"}, base=tmp_path
    )
    sink = ListSink()
    plain = EdgeAgent(cfg, load_scorer(cfg.model), sink).heartbeat(health="ok", outbox_depth=0, lag_s=0.0)
    assert plain.signature is None and plain.agent == agent_build()

    line = enroll(cfg.state_dir, cfg.edge_id).line
    enrolled = tmp_path / "enrolled-edges"
    enrolled.write_text(line + "\n")
    identity = EdgeIdentity.load(cfg.state_dir, cfg.edge_id)
    agent = EdgeAgent(cfg, load_scorer(cfg.model), sink, identity=identity)
    signed = agent.heartbeat(health="degraded", outbox_depth=3, lag_s=1.5)
    assert sink.messages[-1] is signed and signed.signature is not None
    on_the_wire = decode(Heartbeat, encode(signed))
    assert HeartbeatJudge.from_files(enrolled, None).judge(on_the_wire).trust == "verified"
    assert "edge.key" not in repr(identity) and identity.key_id in repr(identity)


def test_the_agent_build_hash_changes_with_the_agents_code() -> None:
    build = agent_build()
    assert build.version and len(build.sha256) == 64
    assert agent_build() == build  # computed once per process


# -- judging -----------------------------------------------------------------------------------------------------


def test_a_signed_heartbeat_is_verified_after_the_wire_and_a_timezone_change(
    fleet: tuple[HeartbeatJudge, dict[str, EdgeIdentity]],
) -> None:
    judge, ids = fleet
    signed = ids["edge-1"].sign(beat())
    assert judge.judge(decode(Heartbeat, encode(signed))).trust == "verified"
    # The same instant written at another offset is the same statement: canonical JSON is built from parsed values.
    data = json.loads(encode(signed))
    data["timestamp"] = signed.timestamp.astimezone(timezone(timedelta(hours=2))).isoformat()
    assert judge.judge(Heartbeat.model_validate(data)).trust == "verified"


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (lambda h, ids: h.model_copy(update={"model_sha256": "b" * 64}), "does not match the signed data"),
        (lambda h, ids: h.model_copy(update={"model_version": "4"}), "does not match the signed data"),
        (lambda h, ids: h.model_copy(update={"seq": h.seq + 1}), "does not match the signed data"),
        (
            lambda h, ids: h.model_copy(update={"agent": agent_build().model_copy(update={"sha256": "c" * 64})}),
            "does not match the signed data",
        ),
        (
            lambda h, ids: h.model_copy(
                update={
                    "signature": HeartbeatSignature(
                        key_id=h.signature.key_id, value=base64.b64encode(bytes(64)).decode()
                    )
                }
            ),
            "does not match the signed data",
        ),
        (
            lambda h, ids: h.model_copy(
                update={"signature": HeartbeatSignature(key_id=h.signature.key_id, value="!!")}
            ),
            "not valid base64",
        ),
        # Signed by edge-2's key but claiming to be edge-1: a key enrolled, but not for this edge.
        (
            lambda h, ids: EdgeIdentity(h.edge_id, ids["edge-2"]._private_key).sign(h),
            "is not enrolled for edge 'edge-1'",
        ),
        # Signed by edge-2's key, naming edge-1's key id: the signature does not hold under edge-1's key.
        (
            lambda h, ids: h.model_copy(
                update={
                    "signature": ids["edge-2"]
                    .sign(h.model_copy(update={"edge_id": "edge-2"}))
                    .signature.model_copy(update={"key_id": h.signature.key_id})
                }
            ),
            "does not match the signed data",
        ),
        (lambda h, ids: _unknown_edge(h), "edge 'edge-9' is not enrolled"),
    ],
    ids=[
        "model-hash",
        "model-version",
        "seq",
        "agent-build",
        "zero-signature",
        "not-base64",
        "other-edges-key",
        "other-key-claiming-this-key-id",
        "unknown-edge",
    ],
)
def test_a_tampered_or_foreign_heartbeat_is_forged_and_says_why(
    fleet: tuple[HeartbeatJudge, dict[str, EdgeIdentity]], tamper: object, reason: str
) -> None:
    judge, ids = fleet
    signed = ids["edge-1"].sign(beat())
    forged = tamper(signed, ids)  # type: ignore[operator]
    verdict = judge.judge(decode(Heartbeat, encode(forged)))
    assert verdict.trust == "forged"
    assert reason in (verdict.reason or "")


def _unknown_edge(h: Heartbeat) -> Heartbeat:
    stranger = EdgeIdentity("edge-9", Ed25519PrivateKey.generate())
    return stranger.sign(h.model_copy(update={"edge_id": "edge-9"}))


def test_unsigned_heartbeats_old_and_new_are_unsigned_and_a_signed_one_without_a_register_is_forged(
    fleet: tuple[HeartbeatJudge, dict[str, EdgeIdentity]],
) -> None:
    judge, ids = fleet
    old = b'{"schema_version":1,"edge_id":"edge-1","seq":1,"timestamp":"2026-03-01T00:00:00Z","model_name":"lm",'
    old += b'"model_version":"2","outbox_depth":0,"lag_s":0.0,"health":"ok","machines":4}'
    v1 = decode(Heartbeat, old)  # an agent from before schema 2 still parses
    assert (v1.schema_version, v1.signature) == (1, None)
    assert judge.judge(v1).trust == "unsigned"
    assert judge.judge(beat()).trust == "unsigned"
    with pytest.raises(ContractError, match="came with schema_version 2"):
        decode(Heartbeat, json.dumps(json.loads(encode(ids["edge-1"].sign(beat()))) | {"schema_version": 1}))
    no_register = HeartbeatJudge(None, None).judge(ids["edge-1"].sign(beat()))
    assert no_register.trust == "forged" and "no enrolled-edges file" in (no_register.reason or "")


def test_a_model_is_known_only_when_the_registry_holds_its_release(tmp_path: Path) -> None:
    known = _release(tmp_path / "registry")
    assert release_hashes(tmp_path / "registry") == {known}
    judge = HeartbeatJudge.from_files(None, tmp_path / "registry")
    assert judge.judge(beat(model_sha256=known)).model_known is True
    assert judge.judge(beat(model_sha256="d" * 64)).model_known is False
    assert judge.judge(beat(model_sha256=None)).model_known is None  # a built-in baseline: no artifact to know
    assert HeartbeatJudge(None, None).judge(beat()).model_known is None  # no registry configured
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        HeartbeatJudge.from_files(None, tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("edge-1\n", "line 1: expected 'EDGE_ID ed25519:BASE64'"),
        ("# fleet\nedge-1 ed25519:AAAA\n", "line 2: key 'ed25519:AAAA' must be ed25519:BASE64 (32 bytes)"),
        ("bad/edge ed25519:" + "A" * 43 + "=\n", "line 1: edge_id 'bad/edge' is not a valid edge id"),
        ("e1 ed25519:" + "A" * 43 + "=\ne2 ed25519:" + "A" * 43 + "=\n", "line 2: this key is already enrolled"),
    ],
)
def test_a_malformed_enrolled_edges_file_is_refused_naming_the_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "enrolled-edges"
    path.write_text(text)
    with pytest.raises(EnrollmentError, match="enrolled-edges line") as err:
        HeartbeatJudge.from_files(path, None)
    assert expected in str(err.value)
    with pytest.raises(EnrollmentError, match="cannot read the enrolled-edges file"):
        HeartbeatJudge.from_files(tmp_path / "missing", None)


# -- store -------------------------------------------------------------------------------------------------------


def test_a_store_from_before_judging_keeps_its_heartbeats_as_unsigned(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with connect(path):
        pass  # every table of today's store; heartbeats then as they were before judging
    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE heartbeats")
        con.execute("DROP TABLE store_schema")  # a store from before judging predates the schema digest too
        con.execute(
            "CREATE TABLE heartbeats (edge_id VARCHAR NOT NULL, seq BIGINT NOT NULL, ts TIMESTAMPTZ NOT NULL, "
            "model_name VARCHAR NOT NULL, model_version VARCHAR NOT NULL, model_sha256 VARCHAR, outbox_depth BIGINT "
            "NOT NULL, lag_s DOUBLE NOT NULL, health VARCHAR NOT NULL, machines BIGINT NOT NULL, ingested_at "
            "TIMESTAMPTZ NOT NULL, PRIMARY KEY (edge_id, seq))"
        )
        con.execute("INSERT INTO heartbeats VALUES ('e1', 1, now(), 'lm', '2', NULL, 0, 0.0, 'ok', 3, now())")
    with reading(path) as store:  # read before any writer migrated it
        (edge,) = store.rollout()
    assert edge["heartbeat"]["trust"] == "unsigned" and edge["identity"]["flags"] == ["unsigned"]

    forged = {"edge_id": "e1", "seq": 1, "ts": datetime.now(UTC), "model_name": "lm", "model_version": "9",
              "outbox_depth": 0, "lag_s": 0.0, "health": "ok", "machines": 3, "ingested_at": datetime.now(UTC),
              "trust": "forged", "trust_reason": "edge 'e1' is not enrolled"}  # fmt: skip
    assert PredictionStore(path).insert_table("heartbeats", pa.Table.from_pylist([forged])) == 1
    with connect(path, read_only=True) as con:
        rows = con.execute("SELECT seq, trust, model_version FROM heartbeats ORDER BY trust").fetchall()
    assert rows == [(1, "forged", "9"), (1, "unsigned", "2")]  # the forged one beside the old one, not instead
    with reading(path) as store:
        (edge,) = store.rollout()
    assert edge["running_version"] == "2" and edge["identity"]["forged"] == 1
    assert edge["identity"]["flags"] == ["forged", "unsigned"]
    table = runner.invoke(app, ["query", "rollout", "--store", str(path), "--format", "csv"])
    assert table.exit_code == 0, table.output
    (row,) = csv.DictReader(io.StringIO(table.stdout))
    assert row["flags"] == "forged unsigned" and row["trust"] == "unsigned"


def test_the_daemon_signs_with_the_enrolled_key_and_refuses_to_start_with_a_broken_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "t.csv").write_text("timestamp,machine_id,temp\n2026-01-01T00:00:00Z,m1,1\n")
    config = tmp_path / "edge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "edge_id": "edge-d",
                "kafka": {"bootstrap_servers": "127.0.0.1:1"},
                "sources": [{"telemetry": "t.csv"}],
                "health": {"enabled": False},
                "state_dir": "state",
            }
        )
    )
    enrollment = enroll(tmp_path / "state", "edge-d")
    daemon = AgentDaemon(EdgeConfig.load(config), send=False)
    try:
        beat = daemon.agent.heartbeat(health="ok", outbox_depth=0, lag_s=0.0)
    finally:
        daemon.outbox.close()
    assert beat.signature is not None and beat.signature.key_id == enrollment.key_id

    enrollment.private_key_path.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    assert daemon_main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "identity:" in err and str(enrollment.private_key_path) in err and "not a key" not in err
