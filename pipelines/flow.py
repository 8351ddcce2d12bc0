"""The dataflow from reading to store, stage by stage: how much arrives at each stage, how much it passes on, what
waits in front of it, which stage is the bottleneck, and what a prediction costs in CPU and energy.

Four stages, in flow order, each measured where it can be measured:

- ``edge``: the edge agents, from their newest heartbeats (read from Kafka, so they are current even when the
  pipeline stands; from the store where Kafka cannot be read). Readings in, predictions out, scoring time.
- ``kafka``: the edges' outboxes into the broker. What the edges predict, against what the broker appended to the
  predictions topic in the last window; the backlog is what waits in the outboxes, and how long the oldest waited.
- ``pipeline``: Beam ingest. What the broker appended, against what ingest runs read in the window; the backlog is
  the consumer group's lag (:func:`infra.kafka_admin.consumer_lag`), elements per step from the runs' counters.
- ``store``: the rows the runs handed to the store, against the rows written; write latency and the share of the
  runs' time spent writing.

The bottleneck rule (:data:`RULE`): a stage is *behind* when

- ``edge``: its scorer is busy at least ``busy_limit`` of the time (it cannot score more than arrives);
- ``kafka``: at least ``min_backlog`` messages wait in the edges' outboxes and the oldest waited ``max_outbox_lag_s``;
- ``pipeline``: at least ``min_backlog`` records wait in Kafka and ingest drains them slower than ``keep_up`` times
  the rate they arrive at, or not at all;
- ``store``: the pipeline is behind and at least ``store_share`` of its run time went to store writes (the store,
  not the pipeline's own work, is what it waits on).

The bottleneck is the first stage behind in flow order, except that a store behind comes before the pipeline it
slows. With no stage behind there is none, and the verdict says the flow keeps up.

Cost per 1,000 predictions: edge scoring from the CPU seconds the agents spent scoring, the whole edge agent from
its process CPU; pipeline ingest from its runs' CPU (all topics' records, charged to the predictions among them);
retraining from the CPU seconds the newest model in the registry recorded when it trained, per 1,000 training
windows (the labeled predictions it learned from). Energy: RAPL where every part measured it, else the power model
of :mod:`infra.energy`, named in the answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.energy import Cost, EnergySettings, PowerModel, estimate
from infra.kafka_admin import BrokerUnreachable, TopicBacklog, check_reachable, consumer_lag
from models.edge.object_registry import version_objects
from models.edge.registry import CONFIG_FILE
from pipelines.edge_trust import HeartbeatJudge
from pipelines.run_log import CONSUMER, ingest_group, ledger_stages
from precursor.contracts.messages import EdgeFlow, Heartbeat
from precursor.contracts.object_store import ObjectStoreError, is_url
from precursor.contracts.settings import KafkaSettings, Topics
from precursor.store.db import StoreBusy
from precursor.store.queries import reading
from precursor.store.runs import consumer_positions, last_run, latest_edge_flows, runs_since, table_rows

log = logging.getLogger("precursor.flow")

StageName = Literal["edge", "kafka", "pipeline", "store"]
STAGES: tuple[StageName, ...] = ("edge", "kafka", "pipeline", "store")
StageState = Literal["ok", "behind", "idle", "unknown"]
STORE_TABLES = ("predictions", "events", "heartbeats", "telemetry_summaries", "alerts")

RULE = (
    "A stage is behind when work waits in front of it and it passes on less than arrives: the edge when its "
    "scorer is busy {busy:.0%} of the time or more; Kafka when {backlog}+ messages wait in the edges' outboxes and the "
    "oldest waited {outbox_lag:g} s; the pipeline when {backlog}+ records wait in Kafka and it drains them slower than "
    "{keep_up:.0%} of their arrival rate, or not at all; the store when the pipeline is behind and store writes take "
    "{store_share:.0%}+ of its run time. The bottleneck is the first stage behind in flow order (a store behind before "
    "the pipeline it slows)."
)


class FlowSettings(BaseSettings):
    """``PRECURSOR_FLOW_*``: the window rates are measured over, and the thresholds of the bottleneck rule."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_FLOW_", extra="forbid")

    window_s: Annotated[float, Field(ge=5, le=86_400)] = 60.0
    min_backlog: Annotated[int, Field(ge=1)] = 100
    max_outbox_lag_s: Annotated[float, Field(gt=0)] = 30.0
    busy_limit: Annotated[float, Field(gt=0, le=1)] = 0.9
    keep_up: Annotated[float, Field(gt=0, le=1)] = 0.9
    store_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    edge_stale_s: Annotated[float, Field(gt=0)] = Field(300.0, description="older heartbeats say nothing of now")
    cost_window_s: Annotated[float, Field(gt=0)] = Field(3600.0, description="pipeline runs the cost is taken over")
    timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0

    @property
    def rule(self) -> str:
        return RULE.format(
            busy=self.busy_limit,
            backlog=self.min_backlog,
            outbox_lag=self.max_outbox_lag_s,
            keep_up=self.keep_up,
            store_share=self.store_share,
        )


# -- the answer ------------------------------------------------------------------------------------------------------


class Stage(BaseModel):
    """One stage: what arrives, what it passes on, what waits in front of it, and what the rule made of that."""

    name: StageName
    title: str
    input_per_s: float | None = Field(description="items per second arriving at the stage; None: not measured")
    output_per_s: float | None = Field(description="items per second the stage passed on")
    backlog: int | None = Field(description="items waiting in front of the stage; None: it has no queue to count")
    backlog_what: str
    state: StageState
    reason: str
    bottleneck: bool = False


class EdgeFigures(BaseModel):
    edge_id: str
    heartbeat_at: datetime
    health: str
    outbox_depth: int
    outbox_lag_s: float
    flow: EdgeFlow


class TopicFigures(BaseModel):
    """One topic's backlog as the report shows it: :class:`~infra.kafka_admin.TopicBacklog`'s figures by name."""

    topic: str
    partitions: int
    end: int
    committed: int
    lag: int
    produced_per_s: float
    last_produced_at: datetime | None


class PipelineStep(BaseModel):
    """One step of ingest, over the window: elements it handled, per second of the window."""

    name: Literal["read", "parse", "dedupe", "store"]
    elements: int
    per_s: float


class StoreFigures(BaseModel):
    writes: int
    write_ms_mean: float | None
    write_ms_max: float | None
    write_share: float | None = Field(description="of the pipeline runs' time in the window, the share spent writing")
    rows: dict[str, int]
    last_run_at: datetime | None

    @classmethod
    def of_runs(
        cls, runs: Sequence[dict[str, Any]], rows: dict[str, int], last_run_at: datetime | None
    ) -> StoreFigures:
        """The store writes of the pipeline runs that finished in the window (their run-log rows)."""
        writes = sum(r["store_writes"] for r in runs)
        write_s = sum(r["store_write_s"] for r in runs)
        run_s = sum(r["seconds"] for r in runs)
        maxima = [r["store_write_max_ms"] for r in runs if r["store_write_max_ms"] is not None]
        return cls(
            writes=writes,
            write_ms_mean=1000 * write_s / writes if writes else None,
            write_ms_max=max(maxima, default=None),
            write_share=write_s / run_s if run_s > 0 else None,
            rows=rows,
            last_run_at=last_run_at,
        )


class CostRow(BaseModel):
    """CPU and energy per 1,000 predictions of one part, with what the energy figure rests on."""

    part: Literal["edge scoring", "edge agent", "pipeline ingest", "retraining"]
    cpu_s: float
    predictions: int
    per: str = Field(description="what the 1,000 count: predictions, or training windows for retraining")
    cpu_s_per_1000: float | None
    energy_j_per_1000: float | None
    energy_source: Literal["rapl", "model"]
    basis: str


class FlowReport(BaseModel):
    """The dataflow now: stages with the bottleneck marked, the figures behind them, and cost per prediction."""

    at: datetime
    window_s: float
    stages: list[Stage]
    bottleneck: StageName | None
    verdict: str
    rule: str
    edges: list[EdgeFigures]
    topics: list[TopicFigures]
    pipeline_steps: list[PipelineStep]
    store: StoreFigures
    costs: list[CostRow]
    energy_model: str = Field(description="the power model used where RAPL was not read")
    problems: list[str] = Field(description="what could not be read, and why")


# -- what is observed ------------------------------------------------------------------------------------------------


@dataclass
class Retraining:
    version: str
    cpu_s: float | None
    wall_s: float | None
    windows: int


@dataclass
class Observations:
    """Everything the rule looks at, gathered by :func:`observe` (or made by hand in a test)."""

    at: datetime
    window_s: float
    edges: list[EdgeFigures] = field(default_factory=list)
    topics: list[TopicBacklog] | None = None  # None: Kafka could not be read
    runs: list[dict[str, Any]] = field(default_factory=list)  # pipeline runs that finished in the window
    cost_runs: list[dict[str, Any]] = field(default_factory=list)  # ... in the cost window
    last_run_at: datetime | None = None
    rows: dict[str, int] = field(default_factory=dict)
    retraining: Retraining | None = None
    problems: list[str] = field(default_factory=list)
    predictions_topic: str | None = None  # None: every topic counts as what the edges delivered


def observe(
    kafka: KafkaSettings,
    store_path: str | Path,
    *,
    settings: FlowSettings | None = None,
    consumer: str = CONSUMER,
    enrolled_edges: Path | None = None,
    model_registry: Path | str | None = None,
    now: datetime | None = None,
) -> Observations:
    """Read the flow's figures from Kafka, the store and (where given) the model registry; what cannot be read is
    named in ``problems`` and the rest is still answered."""
    settings = settings or FlowSettings()
    now = now or datetime.now(UTC)
    seen = Observations(at=now, window_s=settings.window_s)
    stale = now - timedelta(seconds=settings.edge_stale_s)
    reached: dict[tuple[str, int], int] = {}
    stored_edges: list[dict[str, Any]] = []
    topics = kafka.topics
    try:
        with reading(store_path, wait_s=settings.timeout_s) as store:
            window_start = now - timedelta(seconds=settings.window_s)
            seen.cost_runs = runs_since(store, now - timedelta(seconds=settings.cost_window_s), consumer)
            seen.runs = [r for r in seen.cost_runs if r["finished_at"] >= window_start]
            newest = last_run(store, consumer)
            seen.last_run_at = None if newest is None else newest["finished_at"]
            seen.rows = table_rows(store, STORE_TABLES)
            # the truth the Kafka group mirrors, with what a run that did not finish has stored and decided
            stages = {t: ledger_stages(consumer, alerted=t == topics.predictions) for t in _ingested(topics)}
            reached = consumer_positions(store, consumer, stages)
            stored_edges = latest_edge_flows(store, stale)
    except (FileNotFoundError, StoreBusy) as err:
        seen.problems.append(f"store: {err}")
    edge_topics = [topics.predictions, topics.events, topics.heartbeats]
    seen.predictions_topic = topics.predictions
    try:
        check_reachable(kafka.servers, timeout_s=min(2.0, settings.timeout_s))
        group = ingest_group(kafka, consumer)
        seen.topics = [
            *consumer_lag(kafka, group, edge_topics, window_s=settings.window_s, now=now, at_least=reached),
            *consumer_lag(
                kafka, group, [topics.telemetry], window_s=settings.window_s, now=now, at_least=reached, missing_ok=True
            ),
        ]
        seen.edges = recent_edge_flows(
            kafka, since=stale, judge=_judge(enrolled_edges, seen), timeout_s=settings.timeout_s
        )
    except (BrokerUnreachable, KafkaError, OSError) as err:
        seen.problems.append(f"Kafka at {kafka.bootstrap_servers}: {err}")
        seen.edges = [_edge_from_store(row) for row in stored_edges]  # the edges as the store last heard of them
    if model_registry is not None:
        seen.retraining = newest_training(model_registry)
    return seen


def _ingested(topics: Topics) -> tuple[str, ...]:
    """The topics ingest consumes (the edge's three, and the opt-in telemetry summaries)."""
    return (topics.predictions, topics.events, topics.heartbeats, topics.telemetry)


def _judge(enrolled_edges: Path | None, seen: Observations) -> HeartbeatJudge | None:
    """Who may speak for an edge: with an enrolled-edges file, forged heartbeats are left out of the flow."""
    if enrolled_edges is None:
        return None
    try:
        return HeartbeatJudge.from_files(enrolled_edges, None)
    except (OSError, ValueError) as err:
        seen.problems.append(f"enrolled edges: {err} (heartbeats taken unjudged)")
        return None


def _edge_from_store(row: dict[str, Any]) -> EdgeFigures:
    return EdgeFigures(
        edge_id=row["edge_id"],
        heartbeat_at=row["ts"],
        health=row["health"],
        outbox_depth=row["outbox_depth"],
        outbox_lag_s=row["lag_s"],
        flow=EdgeFlow.model_validate_json(row["flow"]),
    )


MAX_HEARTBEATS_READ = 100_000


def recent_edge_flows(
    kafka: KafkaSettings, *, since: datetime, judge: HeartbeatJudge | None = None, timeout_s: float = 5.0
) -> list[EdgeFigures]:
    """Each edge's newest heartbeat with a flow since ``since``, read from the heartbeats topic (from the first
    record at ``since`` to the end, at most :data:`MAX_HEARTBEATS_READ`). A record that is no heartbeat is skipped
    (the pipeline dead-letters it); with a ``judge``, so is a forged one."""
    consumer = KafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False)
    newest: dict[str, Heartbeat] = {}
    try:
        topic = kafka.topics.heartbeats
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        ends = consumer.end_offsets(tps)
        starts = consumer.offsets_for_times({tp: int(since.timestamp() * 1000) for tp in tps})
        wanted = {tp: (found.offset, ends[tp]) for tp, found in starts.items() if found is not None}
        wanted = {tp: span for tp, span in wanted.items() if span[0] < span[1]}
        if not wanted:
            return []
        consumer.assign(list(wanted))
        for tp, (start, _) in wanted.items():
            consumer.seek(tp, start)
        read = 0
        deadline = datetime.now(UTC) + timedelta(seconds=timeout_s)
        while wanted and read < MAX_HEARTBEATS_READ and datetime.now(UTC) < deadline:
            for tp, records in consumer.poll(timeout_ms=200, max_records=5000).items():
                for record in records:
                    read += 1
                    if record.offset >= wanted.get(tp, (0, -1))[1]:
                        continue
                    beat = _heartbeat(record.value)
                    if beat is None or beat.flow is None:
                        continue
                    if judge is not None and judge.judge(beat).trust == "forged":
                        continue
                    held = newest.get(beat.edge_id)
                    if held is None or (beat.timestamp, beat.seq) > (held.timestamp, held.seq):
                        newest[beat.edge_id] = beat
                if consumer.position(tp) >= wanted[tp][1]:
                    wanted.pop(tp)
                    consumer.pause(tp)
    finally:
        consumer.close()
    return [
        EdgeFigures(
            edge_id=b.edge_id,
            heartbeat_at=b.timestamp,
            health=b.health,
            outbox_depth=b.outbox_depth,
            outbox_lag_s=b.lag_s,
            flow=b.flow,  # type: ignore[arg-type]
        )
        for b in sorted(newest.values(), key=lambda b: b.edge_id)
        if b.timestamp >= since
    ]


def _heartbeat(value: bytes | None) -> Heartbeat | None:
    if value is None:
        return None
    try:
        return Heartbeat.model_validate_json(value)
    except ValidationError:
        return None


def newest_training(registry: Path | str) -> Retraining | None:
    """What training the registry's newest version cost, from its ``precursor.json`` (``training.cpu_s`` and
    ``seconds``; ``data.training_windows``). ``registry``: a folder or an object store URL (the newest object there).
    None where the registry holds no version or cannot be read."""
    try:
        newest = _newest_config(registry)
        if newest is None:
            return None
        version, text = newest
        meta = json.loads(text)
    except (OSError, ValueError, ObjectStoreError):
        return None
    training = meta.get("training") or {}
    windows = (meta.get("data") or {}).get("training_windows") or {}
    return Retraining(
        version=version,
        cpu_s=training.get("cpu_s"),
        wall_s=training.get("seconds"),
        windows=int(sum(windows.values())) if isinstance(windows, dict) else 0,
    )


def _newest_config(registry: Path | str) -> tuple[str, bytes] | None:
    """``(version, precursor.json bytes)`` of the registry's newest version by the time it was written, or None."""
    if not is_url(registry):
        found = sorted(Path(registry).glob(f"*/*/{CONFIG_FILE}"), key=lambda p: p.stat().st_mtime)
        return (found[-1].parent.name, found[-1].read_bytes()) if found else None
    fs, _, configs = version_objects(str(registry), [CONFIG_FILE])  # nothing there: FileNotFoundError, caught above
    if not configs:
        return None
    key = max(configs, key=lambda k: (configs[k].get("LastModified") or configs[k].get("mtime") or 0, k))
    return key.rsplit("/", 2)[-2], fs.cat_file(key)


# -- the rule --------------------------------------------------------------------------------------------------------


def assess(
    seen: Observations, settings: FlowSettings | None = None, energy: EnergySettings | None = None
) -> FlowReport:
    """Apply the bottleneck rule to what was observed, and price a prediction."""
    settings = settings or FlowSettings()
    model = (energy or EnergySettings()).power_model()
    window = seen.window_s
    edges = seen.edges
    runs = seen.runs

    # edge
    busy = max((e.flow.scoring_busy for e in edges), default=None)
    if not edges:
        edge = _stage(
            "edge",
            None,
            None,
            None,
            "unknown",
            f"no edge heartbeat with flow figures in the last {settings.edge_stale_s:g} s",
        )
    else:
        readings = sum(e.flow.readings_per_s for e in edges)
        predicted = sum(e.flow.predictions_per_s for e in edges)
        assert busy is not None
        if busy >= settings.busy_limit:
            state: StageState = "behind"
            reason = f"a scorer is busy {busy:.0%} of the time (limit {settings.busy_limit:.0%})"
        elif readings == 0 and predicted == 0:
            state, reason = "idle", "no readings in the edges' last heartbeat interval"
        else:
            state, reason = "ok", f"scorers busy at most {busy:.0%} of the time"
        edge = _stage("edge", readings, predicted, None, state, reason)

    # kafka: the edges' outboxes into the broker
    queued = sum(e.outbox_depth for e in edges) if edges else None
    oldest = max((e.outbox_lag_s for e in edges), default=0.0)
    appended = None if seen.topics is None else sum(t.produced_per_s for t in seen.topics)
    # The edges report predictions per second: Kafka's side of the comparison is the predictions topic alone.
    delivered = None
    if seen.topics is not None:
        delivered = sum(t.produced_per_s for t in seen.topics if seen.predictions_topic in (None, t.topic))
    if seen.topics is None:
        kafka = _stage("kafka", None, None, queued, "unknown", "Kafka could not be read")
    elif queued is not None and queued >= settings.min_backlog and oldest >= settings.max_outbox_lag_s:
        kafka = _stage(
            "kafka",
            sum(e.flow.predictions_per_s for e in edges),
            delivered,
            queued,
            "behind",
            f"{queued} messages wait in the edges' outboxes, the oldest for {oldest:.0f} s",
        )
    else:
        kafka = _stage(
            "kafka",
            sum(e.flow.predictions_per_s for e in edges) if edges else None,
            delivered,
            queued,
            "ok" if appended else "idle",
            f"outboxes hold {queued or 0} messages, the oldest {oldest:.0f} s old" if edges else "no edge reports",
        )

    # pipeline: Kafka into the store
    lag = None if seen.topics is None else sum(t.lag for t in seen.topics)
    drained = sum(r["read"] for r in runs) / window
    steps = _steps(runs, window)
    if lag is None:
        pipeline = _stage("pipeline", None, drained, None, "unknown", "Kafka could not be read: its lag is unknown")
    else:
        arriving = appended or 0.0
        since = "never" if seen.last_run_at is None else f"last at {seen.last_run_at:%H:%M:%S}"
        if lag >= settings.min_backlog and (drained == 0 or drained < settings.keep_up * arriving):
            state = "behind"
            reason = (
                f"{lag} records wait in Kafka; it drained {drained:.1f}/s against {arriving:.1f}/s arriving "
                f"(runs: {len(runs)} in the last {window:g} s, {since})"
            )
        elif lag == 0 and not runs:
            state, reason = "idle", f"nothing waits in Kafka (runs: {since})"
        else:
            state = "ok"
            reason = f"{lag} records wait in Kafka; it drained {drained:.1f}/s against {arriving:.1f}/s arriving"
        pipeline = _stage("pipeline", arriving, drained, lag, state, reason)

    # store
    handed = sum(r["stored_rows"] + r["already_stored"] for r in runs)
    written = sum(r["stored_rows"] for r in runs)
    figures = StoreFigures.of_runs(runs, seen.rows, seen.last_run_at)
    share, mean_ms = figures.write_share, figures.write_ms_mean
    latency = f"writes take {mean_ms:.0f} ms on average" if mean_ms is not None else "no writes in the window"
    if pipeline.state == "behind" and share is not None and share >= settings.store_share:
        store = _stage(
            "store", handed / window, written / window, None, "behind", f"{latency}, {share:.0%} of the runs' time"
        )
    else:
        store = _stage(
            "store",
            handed / window,
            written / window,
            None,
            "ok" if runs else "idle",
            latency + (f", {share:.0%} of the runs' time" if share is not None else ""),
        )

    stages = [edge, kafka, pipeline, store]
    behind = [s for s in stages if s.state == "behind"]
    chosen: Stage | None = store if store.state == "behind" else (behind[0] if behind else None)
    if chosen is not None:
        chosen.bottleneck = True
        verdict = f"The {chosen.title.lower()} is the bottleneck: {chosen.reason}."
    elif any(s.state == "unknown" for s in stages):
        unread = ", ".join(s.title for s in stages if s.state == "unknown")
        verdict = f"No stage read is behind; not read: {unread} (see problems)."
    else:
        verdict = "The flow keeps up: no stage is behind."
    return FlowReport(
        at=seen.at,
        window_s=window,
        stages=stages,
        bottleneck=None if chosen is None else chosen.name,
        verdict=verdict,
        rule=settings.rule,
        edges=edges,
        topics=[TopicFigures.model_validate(t, from_attributes=True) for t in seen.topics or []],
        pipeline_steps=steps,
        store=figures,
        costs=costs(seen, model),
        energy_model=model.basis,
        problems=seen.problems,
    )


TITLES: dict[StageName, str] = {"edge": "Edge agents", "kafka": "Kafka", "pipeline": "Pipeline", "store": "Store"}
BACKLOG_WHAT: dict[StageName, str] = {
    "edge": "no queue of its own: judged by how busy its scorer is",
    "kafka": "messages waiting in the edges' outboxes",
    "pipeline": "records in Kafka past the ingest group's offsets",
    "store": "no queue of its own: writes happen inside the pipeline's runs",
}


def _stage(
    name: StageName,
    input_per_s: float | None,
    output_per_s: float | None,
    backlog: int | None,
    state: StageState,
    reason: str,
) -> Stage:
    return Stage(
        name=name,
        title=TITLES[name],
        input_per_s=input_per_s,
        output_per_s=output_per_s,
        backlog=backlog,
        backlog_what=BACKLOG_WHAT[name],
        state=state,
        reason=reason,
    )


def _steps(runs: Sequence[dict[str, Any]], window: float) -> list[PipelineStep]:
    read = sum(r["read"] for r in runs)
    parsed = sum(r["parsed"] for r in runs)
    unique = parsed - sum(r["duplicates"] for r in runs)
    stored = sum(r["stored_rows"] + r["already_stored"] for r in runs)
    return [
        PipelineStep(name=name, elements=count, per_s=count / window)  # type: ignore[arg-type]
        for name, count in (("read", read), ("parse", parsed), ("dedupe", unique), ("store", stored))
    ]


def costs(seen: Observations, model: PowerModel) -> list[CostRow]:
    """Cost per 1,000 predictions of each part that was measured."""
    rows: list[CostRow] = []
    edges = seen.edges
    predictions = sum(e.flow.predictions for e in edges)
    if edges:
        rows.append(_row("edge scoring", estimate(sum(e.flow.scoring_cpu_s for e in edges), predictions, model=model)))
        energies = [e.flow.energy_j for e in edges]
        measured = None if any(j is None for j in energies) else sum(j for j in energies if j is not None)
        rows.append(
            _row("edge agent", estimate(sum(e.flow.cpu_s for e in edges), predictions, energy_j=measured, model=model))
        )
    if seen.cost_runs:
        energies = [r["energy_j"] for r in seen.cost_runs]
        measured = None if any(j is None for j in energies) else sum(energies)
        rows.append(
            _row(
                "pipeline ingest",
                estimate(
                    sum(r["cpu_s"] for r in seen.cost_runs),
                    sum(r["predictions_read"] for r in seen.cost_runs),
                    energy_j=measured,
                    model=model,
                ),
            )
        )
    trained = seen.retraining
    if trained is not None and trained.cpu_s is not None:
        rows.append(_row("retraining", estimate(trained.cpu_s, trained.windows, model=model), per="training windows"))
    return rows


def _row(part: str, cost: Cost, per: str = "predictions") -> CostRow:
    """A row is the part, what its 1,000 count, and the cost's figures of the same names."""
    figures = {name: getattr(cost, name) for name in CostRow.model_fields.keys() - {"part", "per"}}
    return CostRow(part=part, per=per, **figures)  # type: ignore[arg-type]


def flow_report(
    kafka: KafkaSettings,
    store_path: str | Path,
    *,
    settings: FlowSettings | None = None,
    energy: EnergySettings | None = None,
    enrolled_edges: Path | None = None,
    model_registry: Path | str | None = None,
) -> FlowReport:
    """Observe and assess: the answer of ``GET /api/v1/flow`` and ``precursor status``."""
    settings = settings or FlowSettings()
    seen = observe(kafka, store_path, settings=settings, enrolled_edges=enrolled_edges, model_registry=model_registry)
    return assess(seen, settings, energy)
