"""Live-tail delay: from a prediction sent to Kafka to the moment the dashboard in a browser has it.

Starts the API and dashboard (uvicorn in this process) over a small simulated store, opens the dashboard in headless
Chromium, then sends ``--messages`` predictions to Kafka ``--every`` seconds apart, each stamped (``emitted_at``) just
before it is sent. The dashboard records, for every prediction it receives, now minus ``emitted_at``; a plain SSE
client (httpx) listening at the same time gives the figure without the browser. Prints p50 / p95 / max.

Uses the broker that ``PRECURSOR_KAFKA_*`` points at when one answers; otherwise starts a local one on free ports.

    .venv/bin/python bench/live_tail_delay.py --messages 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from kafka import KafkaProducer

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_throughput import own_topics  # noqa: E402

from precursor.api.app import create_app  # noqa: E402
from precursor.api.settings import ApiSettings  # noqa: E402
from precursor.contracts.messages import Prediction, encode  # noqa: E402
from precursor.contracts.settings import KafkaSettings  # noqa: E402
from tests.fixtures_api import fill_store, serving  # noqa: E402
from tests.fixtures_browser import headless_chromium  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"


def listen(base: str, out: list[float], ready: threading.Event, stop: threading.Event) -> None:
    """A plain SSE client: for each prediction, the delay from its emitted_at to now, in milliseconds."""
    with (
        httpx.Client(base_url=base, timeout=None) as http,
        http.stream(
            "GET", "/api/v1/live", params={"topic": "predictions"}, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as stream,
    ):
        for line in stream.iter_lines():
            if line.startswith("id: ") and not ready.is_set():
                ready.set()
            if line.startswith("data: ") and '"emitted_at"' in line:
                payload = json.loads(line[6:])
                emitted = datetime.fromisoformat(payload["message"]["emitted_at"].replace("Z", "+00:00"))
                out.append((datetime.now(UTC) - emitted).total_seconds() * 1000)
            if stop.is_set():
                return


def figures(name: str, ms: list[float]) -> str:
    ordered = sorted(ms)
    if not ordered:
        return f"{name:<28} no events received"
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"{name:<28} n={len(ordered):<4} p50 {statistics.median(ordered):6.0f} ms   p95 {p95:6.0f} ms   "
        f"max {ordered[-1]:6.0f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--every", type=float, default=0.2, help="seconds between predictions")
    parser.add_argument("--poll-ms", type=int, default=200, help="the server's Kafka poll timeout")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="precursor-bench-") as scratch, own_topics() as kafka:
        browser_delays, sse_delays = measure(kafka, Path(scratch), args)
    load = os.getloadavg()[0]
    print(
        f"{args.messages} predictions, {args.every:g} s apart; server poll {args.poll_ms} ms; load average {load:.1f}"
    )
    print(figures("Kafka -> browser (dashboard)", browser_delays))
    print(figures("Kafka -> SSE client (httpx)", sse_delays))


def measure(kafka: KafkaSettings, scratch: Path, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Open the dashboard, send the predictions, and collect each delay the browser and an SSE client saw."""
    sim = fill_store(scratch / "store.duckdb", machines=20, days=3)
    app = create_app(ApiSettings(tokens=TOKEN, store=sim.path, live_poll_ms=args.poll_ms), kafka)
    with serving(app) as base, headless_chromium(scratch / "profile", width=1280, height=900) as browser:
        browser.get(f"{base}/dashboard/#token={TOKEN}")
        deadline = time.monotonic() + 60
        while browser.execute_script("return document.getElementById('live-status').dataset.state") != "live":
            if time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not connect to the live tail within 60 s")
            time.sleep(0.05)
        sse_delays: list[float] = []
        ready, stop = threading.Event(), threading.Event()
        listener = threading.Thread(target=listen, args=(base, sse_delays, ready, stop), daemon=True)
        listener.start()
        ready.wait(30)
        producer = KafkaProducer(**kafka.client_kwargs(), acks="all", linger_ms=0)
        latest = sim.latest()
        machines = sorted(latest)
        for i in range(args.messages):
            machine = machines[i % len(machines)]
            end = latest[machine].window_end + timedelta(hours=1 + i)
            p = Prediction(
                edge_id="edge-bench",
                seq=1_000_000 + i,
                machine_id=machine,
                window_start=end - timedelta(hours=6),
                window_end=end,
                horizon_h=24,
                risk={"bearing": (i % 100) / 100},
                model_name="precursor-lm",
                model_version="0.3.0",
                emitted_at=datetime.now(UTC),
            )
            producer.send(kafka.topics.predictions, key=machine.encode(), value=encode(p))
            producer.flush()
            time.sleep(args.every)
        producer.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = browser.execute_script("return (window.precursorLive || {delaysMs: []}).delaysMs.length")
            if got >= args.messages and len(sse_delays) >= args.messages:
                break
            time.sleep(0.1)
        browser_delays = browser.execute_script("return window.precursorLive.delaysMs")
        stop.set()
    return browser_delays, sse_delays


if __name__ == "__main__":
    main()
