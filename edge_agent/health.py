"""``/healthz`` (JSON, 200 while the agent works, 503 when it is failing) and ``/metrics`` (Prometheus text format)
on a local port, served by a small threaded HTTP server beside the agent.

Metrics are read from the agent's own counters when scraped (a custom collector), so the reading path pays nothing
for them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("precursor.edge.health")

CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class AgentCollector(Collector):
    """Turns a snapshot (see :meth:`edge_agent.daemon.AgentDaemon.metrics_snapshot`) into Prometheus metrics."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        prefix = "precursor_edge"
        for name, help_text in (
            ("readings", "readings accepted into windows"),
            ("events", "events accepted"),
            ("windows", "windows completed"),
            ("predictions", "predictions committed to the outbox"),
            ("heartbeats", "heartbeats committed to the outbox"),
            ("summaries", "telemetry summaries committed to the outbox"),
            ("commits", "outbox transactions"),
            ("scoring_errors", "windows the model failed to score"),
            ("explained", "alerting windows explained (their predictions carry reasons)"),
            ("explain_errors", "alerting windows whose explanation failed (sent without reasons)"),
            ("late_readings", "readings dropped as late (their window was already scored)"),
            ("repeated_readings", "readings dropped as repeats of one already held"),
            ("sent", "messages Kafka acknowledged"),
            ("send_failures", "failed attempts to send to Kafka"),
            ("model_swaps", "model updates applied"),
            ("model_rollbacks", "models rolled back after failing at run time"),
            ("model_refusals", "model updates refused"),
        ):
            yield CounterMetricFamily(f"{prefix}_{name}", help_text, value=s[name])
        quarantined = CounterMetricFamily(f"{prefix}_quarantined", "records quarantined, by kind", labels=["kind"])
        for kind, count in sorted(s["quarantined"].items()):
            quarantined.add_metric([kind], count)
        yield quarantined
        dropped = CounterMetricFamily(
            f"{prefix}_outbox_dropped", "messages dropped because the outbox was full, by kind", labels=["kind"]
        )
        for kind, count in sorted(s["outbox_dropped"].items()):
            dropped.add_metric([kind], count)
        yield dropped
        for name, help_text in (
            ("outbox_depth", "messages waiting in the outbox"),
            ("outbox_bytes", "bytes of messages waiting in the outbox"),
            ("outbox_max_bytes", "the outbox's bound"),
            ("outbox_lag_seconds", "age of the oldest message waiting in the outbox"),
            ("machines", "machines with state in the window builder"),
            ("kafka_reachable", "1 if the last send reached Kafka"),
        ):
            yield GaugeMetricFamily(f"{prefix}_{name}", help_text, value=s[name])
        model = GaugeMetricFamily(f"{prefix}_model_info", "the running model", labels=["name", "version", "sha256"])
        model.add_metric([s["model_name"], s["model_version"], s["model_sha256"] or ""], 1)
        yield model
        health = GaugeMetricFamily(f"{prefix}_health", "1 for the current health state", labels=["state"])
        for state in ("ok", "degraded", "failing"):
            health.add_metric([state], 1 if s["health"] == state else 0)
        yield health
        buckets, total_sum = s["latency_buckets"], s["latency_sum"]
        yield HistogramMetricFamily(
            f"{prefix}_reading_to_outbox_seconds",
            "from a reading's arrival to its prediction being committed to the outbox",
            buckets=buckets,
            sum_value=total_sum,
        )


class HealthServer:
    """Serves ``/healthz`` and ``/metrics``; ``port=0`` binds a free port (see :attr:`port`)."""

    def __init__(
        self, host: str, port: int, status: Callable[[], dict[str, Any]], snapshot: Callable[[], dict[str, Any]]
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(AgentCollector(snapshot))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    report = status()
                    body = json.dumps(report, default=str).encode()
                    self._reply(503 if report.get("status") == "failing" else 200, "application/json", body)
                elif path == "/metrics":
                    self._reply(200, CONTENT_TYPE_METRICS, generate_latest(registry))
                else:
                    self._reply(404, "text/plain", b"not found: try /healthz or /metrics\n")

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("health: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
