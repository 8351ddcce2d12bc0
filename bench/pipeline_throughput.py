"""Pipeline v0 throughput: predictions/s from Kafka through the Beam pipeline (FnApiRunner) into the DuckDB store.

Fills a fresh topic with N Prediction messages (before the clock starts), then times one bounded ``run_once`` that
reads, validates, drops duplicates and stores them all, and a second run over the same offsets (everything already
stored: the idempotent path). Uses the configured broker if it answers, else a temporary local one.

    .venv/bin/python bench/pipeline_throughput.py --messages 100000
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from kafka import KafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka_throughput import predictions, reachable_broker

from contracts.settings import KafkaSettings
from infra.kafka_admin import admin_client, ensure_topics
from pipelines.run import run_once


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args(argv)

    print(
        f"# pipeline throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    with reachable_broker(KafkaSettings()) as (base, where):
        settings = base.model_copy(update={"topic_prefix": f"bench{uuid.uuid4().hex[:6]}"})
        specs = settings.topics.specs()
        ensure_topics(settings, specs)
        try:
            pairs = predictions(args.messages)
            producer = KafkaProducer(**settings.client_kwargs(), acks="all", linger_ms=20, batch_size=256 * 1024)
            for key, value in pairs:
                producer.send(settings.topics.predictions, key=key, value=value)
            producer.flush()
            producer.close()
            with tempfile.TemporaryDirectory() as folder:
                store = Path(folder) / "store.duckdb"
                started = time.perf_counter()
                first = run_once(settings, store)
                first_s = time.perf_counter() - started
                started = time.perf_counter()
                again = run_once(settings, store, from_beginning=True)
                again_s = time.perf_counter() - started
        finally:
            with admin_client(settings, timeout_s=10) as admin:
                admin.delete_topics([s.name for s in specs], raise_errors=False)
    assert first.stored == args.messages and again.already_stored == args.messages, (first, again)
    print(f"broker: {where}")
    print(f"{'run':<28}{'predictions':>12}{'seconds':>10}{'predictions/s':>16}")
    print(f"{'first run (all new)':<28}{first.read:>12}{first_s:>10.2f}{first.read / first_s:>16,.0f}")
    print(f"{'re-run (all already stored)':<28}{again.read:>12}{again_s:>10.2f}{again.read / again_s:>16,.0f}")


if __name__ == "__main__":
    main()
