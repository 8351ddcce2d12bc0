"""Alert delay: from a qualifying prediction's arrival in Kafka to its alert stored in the prediction store.

Runs the ingest pipeline as ``precursor pipeline run --follow`` does (bounded runs back to back, ``--poll`` seconds
apart when there was nothing new) in a thread over fresh topics and a fresh store. Each of ``--machines`` machines
first sends one window above its model's threshold (0.3 against the model's 0.269; the pipeline stores it and
starts the streak), then, one machine every ``--every`` seconds, the second such window: the one that raises the
alert. The delay of each alert is its ``stored_at`` in the store minus that second prediction's Kafka timestamp.
Prints p50 / p95 / max, the mean run time and the load average.

Uses the broker that ``PRECURSOR_KAFKA_*`` points at when one answers; otherwise starts a local one on free ports.

    .venv/bin/python bench/alert_delay.py --machines 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from kafka import KafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_throughput import own_topics

from pipelines.run import RunReport, follow
from precursor.contracts.messages import Prediction, encode
from precursor.contracts.settings import KafkaSettings
from precursor.store import connect
from tests.fixtures_messages import hourly_prediction

THRESHOLD = 0.269


def prediction(machine: str, hour: int) -> Prediction:
    return hourly_prediction(
        hour,
        edge_id="edge-bench",
        seq=hour * 100_000 + int(machine.split("-")[1]),
        machine_id=machine,
        risk={"failure": 0.3},
        model_name="precursor-lm",
        threshold=THRESHOLD,
    )


def send(producer: KafkaProducer, kafka: KafkaSettings, p: Prediction) -> float:
    """Send and wait for the broker's acknowledgement; the record's Kafka timestamp, in epoch seconds."""
    meta = producer.send(kafka.topics.predictions, key=p.machine_id.encode(), value=encode(p)).get(timeout=30)
    return meta.timestamp / 1000


def figures(delays_ms: list[float]) -> str:
    ordered = sorted(delays_ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"Kafka -> stored alert: n={len(ordered)}  p50 {statistics.median(ordered):6.0f} ms   p95 {p95:6.0f} ms   "
        f"max {ordered[-1]:6.0f} ms"
    )


def measure(kafka: KafkaSettings, store: Path, args: argparse.Namespace) -> tuple[list[float], list[RunReport]]:
    machines = [f"m-{i:03d}" for i in range(args.machines)]
    producer = KafkaProducer(**kafka.client_kwargs(), acks="all", linger_ms=0)
    for m in machines:
        send(producer, kafka, prediction(m, 1))
    reports: list[RunReport] = []
    pipeline = threading.Thread(
        target=follow,
        args=(kafka, store),
        kwargs={"poll_s": args.poll, "idle_exit_s": args.idle_exit, "on_report": reports.append},
        daemon=True,
    )
    pipeline.start()
    while not reports:  # the first windows are in: every machine's streak has begun
        time.sleep(0.1)
    arrived: dict[str, float] = {}
    for m in machines:
        arrived[m] = send(producer, kafka, prediction(m, 2))
        time.sleep(args.every)
    producer.close()
    pipeline.join()
    with connect(store, read_only=True) as con:
        stored = dict(
            con.execute(
                "SELECT machine_id, epoch_us(stored_at) / 1e6 FROM alerts WHERE state = 'raised' AND kind = 'failure'"
            ).fetchall()
        )
    missing = sorted(set(machines) - set(stored))
    if missing:
        raise RuntimeError(f"{len(missing)} machines got no alert: {missing[:5]}")
    return [(stored[m] - arrived[m]) * 1000 for m in machines], reports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=40, help="alerts to measure, one per machine")
    parser.add_argument("--every", type=float, default=0.7, help="seconds between qualifying predictions")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between runs when nothing was new")
    parser.add_argument("--idle-exit", type=float, default=6.0, help="stop the pipeline after this long idle")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="precursor-bench-") as scratch, own_topics() as kafka:
        delays, reports = measure(kafka, Path(scratch) / "store.duckdb", args)
    runs = [r.seconds for r in reports if r.read]
    print(
        f"{args.machines} alerts, qualifying predictions {args.every:g} s apart; poll {args.poll:g} s; "
        f"{len(runs)} runs that read something, mean {statistics.mean(runs):.2f} s each; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(figures(delays))


if __name__ == "__main__":
    main()
