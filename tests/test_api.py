"""The HTTP API over a store filled from the simulator: every endpoint, authentication, and the 4xx cases."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from precursor.api.app import DASHBOARD_DIR, create_app
from precursor.api.settings import ApiSettings
from tests.fixtures_api import AUTH, NO_BROKER, TOKEN, SimulatedStore, fill_store
from tests.fixtures_store import store_digest

if TYPE_CHECKING:
    from tests.fixtures_postgres import NewStore

pytest_plugins = ["tests.fixtures_postgres"]


@pytest.fixture(scope="module")
def sim(new_store: NewStore) -> SimulatedStore:
    return fill_store(new_store("api"))


@pytest.fixture(scope="module")
def client(sim: SimulatedStore) -> Iterator[TestClient]:
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path), NO_BROKER)
    with TestClient(app) as c:
        yield c


def get(client: TestClient, path: str, **params: object) -> dict | list:
    response = client.get(f"/api/v1{path}", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def data_paths(client: TestClient) -> list[tuple[str, str]]:
    """(method, concrete path) of every data endpoint in the OpenAPI document."""
    out = []
    for path, ops in client.get("/openapi.json").json()["paths"].items():
        for method in ops:
            if path.endswith("/health"):
                continue
            out.append((method.upper(), path.replace("{machine_id}", "m-001")))
    return out


def test_the_openapi_document_describes_every_endpoint_and_the_bearer_scheme(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = set(doc["paths"])
    for expected in (
        "/api/v1/machines/at-risk",
        "/api/v1/machines/{machine_id}",
        "/api/v1/machines/{machine_id}/predictions",
        "/api/v1/machines/{machine_id}/timeline",
        "/api/v1/alerts",
        "/api/v1/models/rollout",
        "/api/v1/models/quality",
        "/api/v1/sql",
        "/api/v1/live",
    ):
        assert expected in paths
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_no_token_no_data(client: TestClient) -> None:
    paths = data_paths(client)
    assert len(paths) >= 15
    for method, path in paths:
        for headers in ({}, {"Authorization": "Bearer not-the-token-at-all"}, {"Authorization": f"Basic {TOKEN}"}):
            response = client.request(method, path, headers=headers, json={"sql": "SELECT 1"})
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "items" not in response.text


def test_a_wrong_token_is_never_logged_or_echoed(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    guess = "guess-" + TOKEN[6:]
    with caplog.at_level(logging.DEBUG):
        response = client.get("/api/v1/machines/at-risk", headers={"Authorization": f"Bearer {guess}"})
    assert response.status_code == 401
    assert guess not in response.text and TOKEN not in response.text
    assert all(guess not in r.getMessage() and TOKEN not in r.getMessage() for r in caplog.records)


def test_health_needs_no_token(client: TestClient) -> None:
    assert client.get("/api/v1/health").json()["status"] == "ok"


def test_an_app_without_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="no API tokens"):
        create_app(ApiSettings(), NO_BROKER)


def test_at_risk_matches_the_store_and_pages(client: TestClient, sim: SimulatedStore) -> None:
    want = [p.machine_id for p in sorted(sim.latest().values(), key=lambda p: (-p.max_risk, p.machine_id))]
    first = get(client, "/machines/at-risk", limit=4)
    assert [m["machine_id"] for m in first["items"]] == want[:4]
    assert first["total"] == len(want) and first["next_offset"] == 4
    rest = get(client, "/machines/at-risk", limit=100, offset=4)
    assert [m["machine_id"] for m in rest["items"]] == want[4:] and rest["next_offset"] is None
    edge_a = get(client, "/machines/at-risk", edge_id="edge-a", limit=100)
    assert {m["machine_id"] for m in edge_a["items"]} == {m for m, e in sim.edge_of.items() if e == "edge-a"}
    risky = get(client, "/machines/at-risk", min_risk=0.7)
    assert all(m["max_risk"] >= 0.7 for m in risky["items"]) and risky["total"] == sum(
        p.max_risk >= 0.7 for p in sim.latest().values()
    )


def test_fleet_summary(client: TestClient, sim: SimulatedStore) -> None:
    summary = get(client, "/fleet/summary")
    assert summary["machines"] == len(sim.latest()) and summary["edges"] == 2
    assert summary["at_risk"] == sum(p.max_risk >= 0.7 for p in sim.latest().values())
    assert get(client, "/fleet/summary", threshold=0.0)["at_risk"] == len(sim.latest())


def test_machine_endpoints(client: TestClient, sim: SimulatedStore) -> None:
    machine = next(m for m in sim.machines if sim.failures(m))
    ps = sim.of(machine)
    summary = get(client, f"/machines/{machine}")
    assert summary["predictions"] == len(ps) and summary["latest"]["seq"] == sim.latest()[machine].seq
    history = get(client, f"/machines/{machine}/predictions", limit=10)
    assert history["total"] == len(ps) and len(history["items"]) == 10
    assert history["items"][0]["seq"] == max(ps, key=lambda p: (p.window_end, p.seq)).seq
    risk = get(client, f"/machines/{machine}/risk", points=25)
    assert 0 < len(risk) <= 26 and max(r["risk"] for r in risk) == max(p.max_risk for p in ps)
    events = get(client, f"/machines/{machine}/events", kind="failure", limit=100)
    assert events["total"] == len(sim.failures(machine))
    failures = get(client, f"/machines/{machine}/failures")
    assert {f["failed_at"] for f in failures["items"]} == {
        f.timestamp.isoformat().replace("+00:00", "Z") for f in sim.failures(machine)
    }
    telemetry = get(client, f"/machines/{machine}/telemetry", sensor=["flow", "rpm"], points=30)
    assert set(telemetry["sensors"]) == {"flow", "rpm"}
    timeline = get(client, f"/machines/{machine}/timeline", points=100)
    assert timeline["summary"]["machine_id"] == machine and len(timeline["failures"]) == len(sim.failures(machine))
    assert timeline["telemetry"] and timeline["risk"] and timeline["threshold"] == 0.7


def test_time_ranges_filter(client: TestClient, sim: SimulatedStore) -> None:
    machine = sim.machines[0]
    ends = sorted(p.window_end for p in sim.of(machine))
    since, until = ends[10].isoformat(), ends[20].isoformat()
    page = get(client, f"/machines/{machine}/predictions", since=since, until=until, limit=1000)
    assert page["total"] == 11
    # The simulated fleet lives in the past: nothing ended within the last 6 hours.
    assert get(client, "/machines/at-risk", since="6h")["total"] == 0


def test_fleet_wide_lists(client: TestClient, sim: SimulatedStore) -> None:
    assert get(client, "/alerts", limit=1000)["total"] == len(sim.alerts)
    raised = get(client, "/alerts", state="raised", limit=1000)
    assert raised["total"] == sum(a["state"] == "raised" for a in sim.alerts)
    assert get(client, "/failures", limit=1000)["total"] == len(sim.failures())
    versions = get(client, "/models/versions")
    assert {(v["edge_id"], v["model_version"]) for v in versions} == {
        (p.edge_id, p.model_version) for p in sim.predictions
    }
    rollout = {e["edge_id"]: e["status"] for e in get(client, "/models/rollout")}
    assert rollout == {"edge-a": "current", "edge-b": "behind"}
    quality = get(client, "/models/quality", bucket="12h")
    assert quality and all(q["source"] == "computed" for q in quality)
    edges = get(client, "/edges")
    assert sum(e["predictions"] for e in edges) == len(sim.predictions)


def test_sql_reads(client: TestClient, sim: SimulatedStore) -> None:
    response = client.post(
        "/api/v1/sql", headers=AUTH, json={"sql": "SELECT count(*) AS n FROM predictions", "limit": 5}
    )
    assert response.status_code == 200
    assert response.json()["rows"] == [[len(sim.predictions)]] and response.json()["columns"] == ["n"]


@pytest.mark.parametrize(
    ("method", "path", "params", "body", "status", "says"),
    [
        ("GET", "/machines/no-such-machine", {}, None, 404, "unknown machine 'no-such-machine'"),
        ("GET", "/machines/no-such-machine/predictions", {}, None, 404, "unknown machine"),
        ("GET", "/machines/no-such-machine/timeline", {}, None, 404, "unknown machine"),
        ("GET", "/machines/bad id!/predictions", {}, None, 422, "path parameter machine_id"),
        ("GET", "/machines/at-risk", {"since": "yesterday-ish"}, None, 422, "since='yesterday-ish'"),
        ("GET", "/machines/m-001/predictions", {"until": "2026-99-01"}, None, 422, "until='2026-99-01'"),
        ("GET", "/alerts", {"since": "2026-02-01", "until": "2026-01-01"}, None, 422, "after until"),
        ("GET", "/machines/at-risk", {"limit": 0}, None, 422, "query parameter limit='0'"),
        ("GET", "/machines/at-risk", {"limit": "lots"}, None, 422, "query parameter limit='lots'"),
        ("GET", "/machines/at-risk", {"min_risk": 1.5}, None, 422, "min_risk='1.5'"),
        ("GET", "/alerts", {"state": "open"}, None, 422, "state='open'"),
        ("GET", "/models/quality", {"bucket": "1 fortnight"}, None, 422, "bucket"),
        ("GET", "/models/quality", {"bucket": "5m"}, None, 422, "between 1h and 366d"),
        ("GET", "/live", {"from": "predictions@x:1"}, None, 422, "from='predictions@x:1'"),
        ("POST", "/sql", {}, {"sql": "DELETE FROM predictions"}, 400, "got DELETE"),
        ("POST", "/sql", {}, {"sql": "DROP TABLE events"}, 400, "got DROP"),
        ("POST", "/sql", {}, {"sql": "SELECT 1; DELETE FROM predictions"}, 400, "single statement"),
        ("POST", "/sql", {}, {"sql": "COPY predictions TO 'x.csv'"}, 400, "got COPY"),
        ("POST", "/sql", {}, {"sql": "SELECT * FROM read_csv('/etc/passwd')"}, 400, "disabled|does not exist"),
        ("POST", "/sql", {}, {"sql": "SELEKT 1"}, 400, "syntax error"),
        ("POST", "/sql", {}, {"sql": ""}, 422, "body sql=''"),
        ("POST", "/sql", {}, {"query": "SELECT 1"}, 422, "body sql: Field required"),
        ("POST", "/sql", {}, {"sql": "SELECT 1", "limit": 100000}, 422, "body limit=100000"),
        ("GET", "/machines/at-risk", {"since": "3000000d"}, None, 422, "since='3000000d'"),
        ("GET", "/alerts", {"since": "9" * 60 + "d"}, None, 422, "since="),
        ("GET", "/models/quality", {"bucket": "3000000d"}, None, 422, "bucket"),
        ("POST", "/sql", {}, {"sql": "SELECT repeat('x', 200000000) AS big"}, 400, "larger than"),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_nothing_changes(
    client: TestClient,
    sim: SimulatedStore,
    method: str,
    path: str,
    params: dict,
    body: dict | None,
    status: int,
    says: str,
) -> None:
    before = store_digest(sim.path)
    response = client.request(method, f"/api/v1{path}", params=params, json=body, headers=AUTH)
    assert response.status_code == status, response.text
    assert any(said in response.json()["detail"] for said in says.split("|"))  # a|b: either backend's words
    assert store_digest(sim.path) == before


def test_a_sql_answer_is_cut_at_the_byte_limit_not_served_whole(client: TestClient) -> None:
    response = client.post(
        "/api/v1/sql",
        headers=AUTH,
        json={"sql": "SELECT repeat('x', 1000000) AS wide FROM range(100)", "limit": 100},
    )
    assert response.status_code == 200
    answer = response.json()
    assert answer["truncated"] is True and 1 <= len(answer["rows"]) <= 8
    assert len(response.content) < 10 * 1024 * 1024


def test_a_missing_store_is_503_not_500(tmp_path: Path) -> None:
    app = create_app(ApiSettings(tokens=TOKEN, store=tmp_path / "none.duckdb"), NO_BROKER)
    with TestClient(app) as c:
        response = c.get("/api/v1/machines/at-risk", headers=AUTH)
    assert response.status_code == 503 and "no prediction store" in response.json()["detail"]


def test_the_live_tail_says_503_when_no_broker_answers(client: TestClient) -> None:
    response = client.get("/api/v1/live", headers=AUTH, params={"limit": 1})
    assert response.status_code == 503 and "cannot tail Kafka" in response.json()["detail"]


def test_the_dashboard_is_served_with_every_asset_local(client: TestClient) -> None:
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard/"
    page = client.get("/dashboard/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assets = set(re.findall(r'(?:src|href)="([^"#]+)"', page.text))
    assert {"app.js", "style.css"} <= assets
    scripts = {"chart.js", "live.js"} | {a for a in assets if a.endswith(".js")}
    for asset in assets | scripts:
        assert not asset.startswith(("http:", "https:", "//")), asset
        response = client.get(f"/dashboard/{asset}")
        assert response.status_code == 200, asset
        external = re.findall(r"https?://[^\s\"')]+", response.text)
        assert all(url.startswith("http://www.w3.org/") for url in external), (asset, external)


def test_every_dashboard_module_is_served_as_javascript_and_each_is_loaded(client: TestClient) -> None:
    """A browser runs a module only with a JavaScript type (the dashboard is served with nosniff): every module
    app.js reaches through its imports has one and loads nothing from elsewhere, and every module in the folder is
    reached (none is left over)."""
    imports = re.compile(r'^import .+ from "\./([\w-]+\.js)";$', re.MULTILINE)
    reached: set[str] = set()
    todo = ["app.js"]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        response = client.get(f"/dashboard/{name}")
        assert response.status_code == 200, name
        assert "javascript" in response.headers["content-type"], (name, response.headers["content-type"])
        assert "script-src 'self'" in response.headers["content-security-policy"], name
        external = re.findall(r"https?://[^\s\"')]+", response.text)
        assert all(url.startswith("http://www.w3.org/") for url in external), (name, external)
        todo += imports.findall(response.text)
    assert reached == {path.name for path in DASHBOARD_DIR.glob("*.js")}


def test_serve_creates_a_private_token_file_once_and_refuses_bad_settings(tmp_path: Path) -> None:
    import stat

    import typer
    from typer.testing import CliRunner

    from precursor.serve_cli import ensure_token_file, serve_command

    token_file = tmp_path / "state" / "api-token"
    assert ensure_token_file(token_file)
    first = token_file.read_text()
    assert not ensure_token_file(token_file) and token_file.read_text() == first
    assert len(first.strip()) >= 32 and stat.S_IMODE(token_file.stat().st_mode) == 0o600

    short = tmp_path / "short-token"
    short.write_text("tooshort\n")
    cli = typer.Typer()
    cli.command()(serve_command)
    result = CliRunner().invoke(cli, ["--token-file", str(short), "--store", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 2 and "at least 16 characters" in result.stderr
    assert "tooshort" not in result.stderr + result.stdout
