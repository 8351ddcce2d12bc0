"""Running an agent as a process: config -> sources -> agent -> outbox -> Kafka, for months, on a small box.

Threads: one reader per source (each hands :class:`SourceBatch` es to a small bounded queue, so a fast replay waits
for the agent instead of filling memory), the agent's loop (this thread: windows, scoring, commits, heartbeats), the
outbox sender, the model-update follower and the health server.

SIGTERM (or Ctrl-C) drains and flushes: the readers stop, what they already read is processed and committed, the
sources are acknowledged, a last heartbeat is committed, and the sender gets ``drain_timeout`` to empty the outbox
into Kafka. Whatever is left stays in the outbox for the next start.

A source that fails (an exception out of its reader; a bad *record* never does that, it is quarantined) stops the
agent the same way, and the process exits with status 1 naming the source and the error (:class:`SourceFailure`):
crash-only, as the positions, the open windows and the outbox are all committed together, a restart (systemd's
``Restart=always``) continues from exactly where the failed source's last handled batch ended, with the broker's
unacknowledged MQTT messages redelivered. The agent never goes on with a dead source while looking alive, and never
exits 0 after one failed.

    python -m edge_agent.daemon --config edge.yaml      # what ``precursor edge run --config edge.yaml`` runs
"""

from __future__ import annotations

import argparse
import gc
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from edge_agent.agent import AgentStats, EdgeAgent, Health
from edge_agent.config import ConfigError, EdgeConfig
from edge_agent.health import HealthServer
from edge_agent.identity import EdgeIdentity
from edge_agent.logs import configure_logging
from edge_agent.outbox import Outbox
from edge_agent.scorers import RunningModel, ScorerSlot, load_running
from edge_agent.sender import OutboxSender
from edge_agent.sources import open_source
from edge_agent.telemetry_source import SourceBatch, TelemetrySource
from edge_agent.updates import ModelUpdater, UpdateFollower
from precursor.contracts.formats import read_machines

log = logging.getLogger("precursor.edge")

OUTBOX_FILE = "outbox.sqlite"
SCORING_FAILURE_S = 60.0
"""After windows failed to score (and no model was left to roll back to), health says failing for this long."""
STALL_S = 30.0
"""The agent's loop not turning for this long means it is failing (stuck), whatever else looks fine."""


class SourceFailure(RuntimeError):
    """A source failed; the agent stopped after committing what it had read. ``stats`` are the run's figures."""

    def __init__(self, failures: dict[str, str], stats: AgentStats) -> None:
        super().__init__("; ".join(f"source {name} failed: {error}" for name, error in failures.items()))
        self.failures = failures
        self.stats = stats


@dataclass(frozen=True)
class _SourceEnded:
    source: str
    error: str | None


class AgentDaemon:
    """Everything an edge agent process runs, wired from one config. :meth:`run` blocks until stopped or done."""

    def __init__(self, config: EdgeConfig, *, stop: threading.Event | None = None, send: bool = True) -> None:
        self.config = config
        self.stop_event = stop or threading.Event()
        config.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            running, previous = load_running(config.model, config.state_dir / "models" / "current.json")
        except Exception as err:  # a bad artifact or key file must stop the start with a clear message
            raise ConfigError(f"model: cannot load {config.model.artifact or config.model.type}: {err}") from None
        self.slot = ScorerSlot(running, config.state_dir / "models" / "current.json")
        self.slot.previous = previous
        legacy_seq = config.state_dir / f"{config.edge_id}.seq"
        first_seq = int(legacy_seq.read_text()) if legacy_seq.is_file() else 0
        self.outbox = Outbox(
            config.state_dir / OUTBOX_FILE,
            max_bytes=config.outbox.max_bytes,
            durability=config.outbox.durability,
            first_seq=first_seq,
        )
        try:
            self.sources: list[TelemetrySource] = [
                open_source(spec, edge_id=config.edge_id, limits=config.input) for spec in config.sources
            ]
            attributes: dict[str, dict[str, str]] = {}
            for source in self.sources:
                attributes.update(source.attributes())
            if config.machines.file is not None:
                attributes = read_machines(config.machines.file) | attributes
        except (ValueError, OSError) as err:
            self.outbox.close()
            raise ConfigError(f"sources: {err}") from None
        try:
            identity = EdgeIdentity.load(config.state_dir, config.edge_id)
        except ValueError as err:  # an unreadable key: better no start than heartbeats the fleet flags as forged
            self.outbox.close()
            raise ConfigError(f"identity: {err}") from None
        if identity is None:
            log.warning(
                "edge %s is not enrolled: its heartbeats go unsigned (run `precursor edge enroll`)", config.edge_id
            )
        self.agent = EdgeAgent(
            config, self.slot, self.outbox, attributes=attributes, batch_size=config.model.max_batch, identity=identity
        )
        self.positions = self.agent.restore()
        self.sender = (
            OutboxSender(
                self.outbox,
                config.kafka,
                batch=config.outbox.send_batch,
                summaries=config.telemetry_summaries.enabled,
            )
            if send
            else None
        )
        self.updater: ModelUpdater | None = None
        self.follower: UpdateFollower | None = None
        if config.updates_active:
            try:
                self.updater = ModelUpdater(
                    config, self.slot, self.agent.recent_windows, on_change=self.request_heartbeat
                )
            except ValueError as err:  # unreadable trusted keys
                self.outbox.close()
                raise ConfigError(f"model.trusted_keys: {err}") from None
            self.follower = UpdateFollower(config, self.updater, self.stop_event) if send else None
        self.slot.on_rollback = self._rolled_back
        self.health: HealthServer | None = None
        if config.health.enabled:
            try:
                self.health = HealthServer(config.health.host, config.health.port, self.status, self.metrics_snapshot)
            except OSError as err:
                self.outbox.close()
                raise ConfigError(
                    f"health: cannot listen on {config.health.host}:{config.health.port}: {err}"
                ) from None
        self._queue: queue.Queue[SourceBatch | _SourceEnded] = queue.Queue(maxsize=2 * len(self.sources) + 2)
        self._readers: list[threading.Thread] = []
        self._ended: dict[str, str | None] = {}
        self._heartbeat_requested = threading.Event()
        self._last_turn = time.monotonic()
        self._started = time.monotonic()
        self._oldest_created: float | None = None

    # --- the loop -----------------------------------------------------------------------------------------------

    def request_heartbeat(self) -> None:
        self._heartbeat_requested.set()

    def _rolled_back(self, failed: RunningModel, reason: str) -> None:
        if self.updater is not None:
            self.updater.model_failed(failed, reason)
        self.request_heartbeat()  # the fleet should see at once which model runs

    def request_stop(self) -> None:
        self.stop_event.set()

    def run(self) -> AgentStats:
        if self.health is not None:
            self.health.start()
            log.info("health on http://%s:%d/healthz and /metrics", self.config.health.host, self.health.port)
        if self.sender is not None:
            self.sender.start()
        if self.follower is not None:
            self.follower.start()
        by_name = {s.name: s for s in self.sources}

        def acknowledge(acks: list[tuple[str, Any]]) -> None:
            for name, ack in acks:
                by_name[name].acknowledge(ack)

        self.agent.on_acks = acknowledge
        running = self.slot.running
        log.info(
            "edge agent %s started: %d source(s), model %s",
            self.config.edge_id,
            len(self.sources),
            running.label,
            extra={"model_version": running.scorer.version, "outbox_depth": self.outbox.depth},
        )
        self._heartbeat_requested.set()  # one at start, with the model that is running
        intake = self._intake()
        # What is loaded by now (modules, the model, the restored windows) lives as long as the agent. Frozen, the
        # collector's full passes skip it: each would otherwise walk it all, a pause of tens of ms in the middle of
        # the readings' way to the outbox.
        gc.collect()
        gc.freeze()
        try:
            self._loop(intake)
        finally:
            gc.unfreeze()
            self._shutdown(intake)
        return self.agent.stats

    def _intake(self) -> Generator[SourceBatch | _SourceEnded | None, None, None]:
        """What the sources hand over, or None when there is nothing (at least every 0.2 s, so the loop turns).

        One source is read in the agent's own thread: a reading goes from the source to the outbox without waiting in
        a queue. Several sources get a reader thread each, and a small queue.
        """
        if len(self.sources) == 1:
            source = self.sources[0]
            try:
                yield from source.batches(self.positions.get(source.name), self.stop_event)
                yield _SourceEnded(source.name, None)
            except Exception as err:  # a source that dies is reported, the agent goes on (and says it is failing)
                log.exception("source %s failed", source.name, extra={"source": source.name})
                yield _SourceEnded(source.name, f"{type(err).__name__}: {err}")
            while True:
                self.stop_event.wait(0.2)
                yield None
        for source in self.sources:
            thread = threading.Thread(target=self._read, args=(source,), name=f"source:{source.name}", daemon=True)
            thread.start()
            self._readers.append(thread)
        while True:
            try:
                yield self._queue.get(timeout=0.2)
            except queue.Empty:
                yield None

    def _read(self, source: TelemetrySource) -> None:
        error = None
        try:
            for batch in source.batches(self.positions.get(source.name), self.stop_event):
                if not batch.items and batch.position is None and batch.ack is None:
                    continue  # "nothing new": the queue's timeout already lets the loop turn
                while not self.stop_event.is_set():
                    try:
                        self._queue.put(batch, timeout=0.2)
                        break
                    except queue.Full:
                        continue
        except Exception as err:  # a source that dies is reported and the others go on
            error = f"{type(err).__name__}: {err}"
            log.exception("source %s failed", source.name, extra={"source": source.name})
        while True:
            try:
                self._queue.put(_SourceEnded(source.name, error), timeout=0.2)
                return
            except queue.Full:
                if self.stop_event.is_set():
                    return

    def _loop(self, intake: Generator[SourceBatch | _SourceEnded | None, None, None]) -> None:
        agent = self.agent
        heartbeat_every = self.config.heartbeat.interval.total_seconds()
        next_heartbeat = next_lag_check = time.monotonic()
        for item in intake:
            self._last_turn = now = time.monotonic()
            idle = True
            if isinstance(item, SourceBatch):
                agent.handle_batch(item)
                idle = not item.items
            elif isinstance(item, _SourceEnded):
                self._ended[item.source] = item.error
                if item.error is not None:
                    log.error(
                        "source %s failed (%s): stopping, to restart from the committed positions",
                        item.source,
                        item.error,
                        extra={"source": item.source, "error": item.error},
                    )
                    break
                log.info("source %s ended", item.source, extra={"source": item.source})
            if now >= next_lag_check:
                self._note_oldest()
                next_lag_check = now + 1.0
            if self._heartbeat_requested.is_set() or now >= next_heartbeat:
                self._heartbeat_requested.clear()
                self._heartbeat()
                next_heartbeat = now + heartbeat_every
                agent.commit()
            elif agent.commit_due(now) or (idle and agent.uncommitted):
                agent.commit()
            if self.stop_event.is_set():
                break
            if self.config.exit_when_sources_end and len(self._ended) == len(self.sources) and self._queue.empty():
                log.info("every source has ended")
                break

    def _heartbeat(self) -> None:
        self._note_oldest()
        self.agent.heartbeat(health=self.health_state(), outbox_depth=self.outbox.depth, lag_s=self.outbox_lag_s())

    def _shutdown(self, intake: Generator[SourceBatch | _SourceEnded | None, None, None]) -> None:
        log.info("stopping: draining what the sources already read, then flushing the outbox")
        self.stop_event.set()
        for thread in self._readers:
            thread.join(timeout=5)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, SourceBatch):
                self.agent.handle_batch(item)
        intake.close()
        self._heartbeat()
        self.agent.commit()
        for source in self.sources:
            source.close()
        if self.sender is not None:
            drained = self.sender.drain(self.config.drain_timeout.total_seconds())
            self.sender.stop()
            self.sender.join(timeout=10)
            if not drained:
                log.warning(
                    "Kafka did not take everything before the drain timeout: %d message(s) stay in the outbox",
                    self.outbox.depth,
                    extra={"outbox_depth": self.outbox.depth},
                )
        if self.follower is not None:
            self.follower.join(timeout=5)
        if self.health is not None:
            self.health.stop()
        self.agent.close()
        self.outbox.close()
        stats = self.agent.stats
        log.info(
            "stopped",
            extra=stats.as_dict()
            | {
                "late_dropped": self.agent.windows.late_dropped,
                "repeats_dropped": self.agent.windows.repeats_dropped,
                "outbox_depth": self.outbox.depth,
            },
        )

    # --- what the operator sees ---------------------------------------------------------------------------------

    @property
    def source_failures(self) -> dict[str, str]:
        """The sources that failed, with their errors."""
        return {name: error for name, error in self._ended.items() if error is not None}

    def outbox_lag_s(self) -> float:
        """Age of the oldest message not yet acknowledged by Kafka (0 when the outbox is empty), as of the last
        loop turn: other threads must not use the agent's database connection."""
        return (
            0.0
            if self._oldest_created is None or self.outbox.depth == 0
            else max(0.0, time.time() - self._oldest_created)
        )

    def _note_oldest(self) -> None:
        row = self.outbox.db.execute("SELECT created_at FROM messages ORDER BY seq LIMIT 1").fetchone()
        self._oldest_created = None if row is None else float(row[0])

    def health_state(self) -> Health:
        if time.monotonic() - self._last_turn > STALL_S:
            return "failing"
        if self._ended and all(self._ended.get(s.name) for s in self.sources):
            return "failing"  # every source died with an error
        failed_at = self.agent.last_scoring_failure
        if failed_at is not None and time.monotonic() - failed_at < SCORING_FAILURE_S:
            return "failing"  # no model can score: windows are being quarantined instead of predicted
        degraded = (
            (self.sender is not None and self.sender.broker_reachable is False)
            or self.outbox.queued_bytes >= 0.8 * self.outbox.max_bytes
            or any(self._ended.get(s.name) for s in self.sources)
            or any(getattr(s, "connected", True) is False for s in self.sources)
        )
        return "degraded" if degraded else "ok"

    def status(self) -> dict[str, Any]:
        running, previous = self.slot.running, self.slot.previous
        sender = self.sender
        return {
            "status": self.health_state(),
            "edge_id": self.config.edge_id,
            "uptime_s": round(time.monotonic() - self._started, 1),
            "model": {
                "name": running.scorer.name,
                "version": running.scorer.version,
                "sha256": running.sha256,
                "previous": None if previous is None else previous.scorer.version,
                "last_refusal": None if self.updater is None else self.updater.last_refusal,
            },
            "outbox": {
                "depth": self.outbox.depth,
                "bytes": self.outbox.queued_bytes,
                "max_bytes": self.outbox.max_bytes,
                "dropped": dict(self.outbox.dropped),
            },
            "kafka": {
                "reachable": None if sender is None else sender.broker_reachable,
                "sent": 0 if sender is None else sender.sent,
                "last_error": None if sender is None else sender.last_error,
            },
            "sources": [
                {
                    "name": s.name,
                    "ended": s.name in self._ended,
                    "error": self._ended.get(s.name),
                    "connected": getattr(s, "connected", None),
                }
                for s in self.sources
            ],
            "stats": self.agent.stats.as_dict(),
            "quarantined": dict(self.agent.quarantine.counts),
        }

    def metrics_snapshot(self) -> dict[str, Any]:
        agent, running, sender = self.agent, self.slot.running, self.sender
        latency = agent.latency
        cumulative, buckets = 0, []
        for bound, count in zip((*latency.BUCKETS, float("inf")), latency.bucket_counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        return agent.stats.as_dict() | {
            "late_readings": agent.windows.late_dropped,
            "repeated_readings": agent.windows.repeats_dropped,
            "sent": 0 if sender is None else sender.sent,
            "send_failures": 0 if sender is None else sender.failures,
            "model_swaps": self.slot.swaps,
            "model_rollbacks": self.slot.rollbacks,
            "model_refusals": 0 if self.updater is None else len(self.updater.refused),
            "quarantined": dict(agent.quarantine.counts),
            "outbox_dropped": dict(self.outbox.dropped),
            "outbox_depth": self.outbox.depth,
            "outbox_bytes": self.outbox.queued_bytes,
            "outbox_max_bytes": self.outbox.max_bytes,
            "outbox_lag_seconds": self.outbox_lag_s(),
            "machines": agent.windows.machines,
            "kafka_reachable": 1 if sender is not None and sender.broker_reachable else 0,
            "model_name": running.scorer.name,
            "model_version": running.scorer.version,
            "model_sha256": running.sha256,
            "health": self.health_state(),
            "latency_buckets": buckets,
            "latency_sum": latency.total,
        }


def run_agent(config_path: str | Path, *, stop: threading.Event | None = None) -> AgentStats:
    """Load and validate the config, run the agent until SIGTERM/Ctrl-C (or every source ended); return its stats.

    Raises :class:`SourceFailure` when a source failed (the agent stopped because of it)."""
    config = EdgeConfig.load(config_path)
    configure_logging(config.log.format, config.log.level)
    daemon = AgentDaemon(config, stop=stop)
    previous: dict[int, Any] = {}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: draining and flushing", signal.Signals(signum).name)
        daemon.request_stop()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        stats = daemon.run()
        if daemon.source_failures:
            raise SourceFailure(daemon.source_failures, stats)
        return stats
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_agent.daemon", description="Run a Precursor edge agent.")
    parser.add_argument("--config", "-c", required=True, type=Path, help="edge agent YAML config")
    args = parser.parse_args(argv)
    try:
        stats = run_agent(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except SourceFailure as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"edge agent done: {stats.readings} readings, {stats.windows} windows, {stats.predictions} predictions, "
        f"{stats.events} events, {stats.quarantined} quarantined"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
