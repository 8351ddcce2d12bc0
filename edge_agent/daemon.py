"""Running an agent as a process: config -> sources -> agent -> Kafka, stopping cleanly on SIGTERM or Ctrl-C."""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from edge_agent.agent import AgentStats, EdgeAgent
from edge_agent.config import EdgeConfig
from edge_agent.publisher import KafkaPublisher, Sink
from edge_agent.scorers import load_scorer
from edge_agent.sources import Item, TelemetrySource, open_source

log = logging.getLogger("precursor.edge")

_DONE = object()


def merged(sources: list[TelemetrySource], stop: threading.Event, capacity: int = 10_000) -> Iterator[Item]:
    """Items of several sources as they come; one source is read directly, several through reader threads."""
    if len(sources) == 1:
        for item in sources[0]:
            if stop.is_set():
                return
            yield item
        return
    q: queue.Queue[object] = queue.Queue(maxsize=capacity)

    def pump(source: Iterable[Item]) -> None:
        try:
            for item in source:
                if stop.is_set():
                    break
                q.put(item)
        finally:
            q.put(_DONE)

    threads = [threading.Thread(target=pump, args=(s,), daemon=True, name=f"source-{i}") for i, s in enumerate(sources)]
    for t in threads:
        t.start()
    remaining = len(threads)
    while remaining and not stop.is_set():
        item = q.get()
        if item is _DONE:
            remaining -= 1
        else:
            yield item  # type: ignore[misc]


def run_agent(config_path: str | Path, *, sink: Sink | None = None) -> AgentStats:
    config = EdgeConfig.load(config_path)
    sources = [open_source(s) for s in config.sources]
    attributes: dict[str, dict[str, str]] = {}
    for s in sources:
        attributes.update(s.attributes())
    scorer = load_scorer(config.model)
    sink = sink or KafkaPublisher(config.kafka)
    agent = EdgeAgent(config, scorer, sink, attributes=attributes)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: draining and flushing", signal.Signals(signum).name)
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    log.info("edge agent %s: %d source(s), model %s %s", config.edge_id, len(sources), scorer.name, scorer.version)
    try:
        return agent.run(merged(sources, stop))
    finally:
        signal.signal(signal.SIGTERM, previous)
        sink.close()
