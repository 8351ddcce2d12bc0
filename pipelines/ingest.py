"""Pipeline v0: Kafka -> validate -> dead-letter -> drop duplicates -> prediction store.

One composite per topic (:class:`IngestTopic`) does the same four jobs for predictions and for events:

    ReadKafka -> Parse (bad records to the dead-letter topic, with the reason) -> DropDuplicates by (edge_id, seq)
             -> WriteToStore (ON CONFLICT DO NOTHING, so re-runs never double a row)
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from contracts.messages import ContractError, DeadLetter, EdgeEvent, EdgeMessage, Prediction, decode, encode
from pipelines.kafka_io import KafkaRecord, ProduceToKafka, ReadKafkaRanges
from store import PredictionStore

DEAD = "dead"
NAMESPACE = "precursor"


def _parse_into(model: type[EdgeMessage]) -> Callable[[KafkaRecord], EdgeMessage]:
    def parse(record: KafkaRecord) -> EdgeMessage:
        if record.value is None:
            raise ContractError(f"{model.__name__}: empty record (a tombstone has no message)")
        return decode(model, record.value)

    return parse


class ParseMessages(beam.DoFn):
    """Valid messages to the main output; anything else to ``dead`` as a DeadLetter naming what was wrong."""

    def __init__(self, model: type[EdgeMessage]) -> None:
        self._model = model
        self._parse = _parse_into(model)
        self._valid = Metrics.counter(NAMESPACE, f"{model.__name__}.valid")
        self._invalid = Metrics.counter(NAMESPACE, f"{model.__name__}.dead_lettered")

    def process(self, record: KafkaRecord) -> Iterator[Any]:
        try:
            message = self._parse(record)
        except ContractError as err:
            self._invalid.inc()
            yield beam.pvalue.TaggedOutput(
                DEAD,
                DeadLetter(
                    source_topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key.decode("utf-8", "replace") if record.key else None,
                    raw_b64=base64.b64encode(record.value or b"").decode(),
                    reason=str(err),
                ),
            )
            return
        self._valid.inc()
        yield message


class DropDuplicates(beam.PTransform):
    """Keeps one message per (edge_id, seq): a retried send from an edge arrives twice but counts once."""

    def expand(self, messages: beam.PCollection) -> beam.PCollection:
        duplicates = Metrics.counter(NAMESPACE, "duplicates_dropped")

        def first(key_and_messages: tuple[tuple[str, int], Iterable[EdgeMessage]]) -> EdgeMessage:
            _, group = key_and_messages
            items = list(group)
            if len(items) > 1:
                duplicates.inc(len(items) - 1)
            return items[0]

        return (
            messages
            | "KeyBySeq" >> beam.Map(lambda m: ((m.edge_id, m.seq), m))
            | "GroupBySeq" >> beam.GroupByKey()
            | "KeepFirst" >> beam.Map(first)
        )


class WriteToStore(beam.DoFn):
    """Batches a bundle's messages into one insert; counts rows that were new versus already stored."""

    def __init__(self, store_path: str, model: type[EdgeMessage], batch_size: int = 5000) -> None:
        self._store_path = store_path
        self._model = model
        self._batch_size = batch_size
        self._batch: list[EdgeMessage] = []
        self._stored = Metrics.counter(NAMESPACE, f"{model.__name__}.stored")
        self._already = Metrics.counter(NAMESPACE, f"{model.__name__}.already_stored")

    def start_bundle(self) -> None:
        self._batch = []

    def process(self, message: EdgeMessage) -> None:
        self._batch.append(message)
        if len(self._batch) >= self._batch_size:
            self._flush()

    def finish_bundle(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        new = PredictionStore(self._store_path).insert(self._batch)  # type: ignore[arg-type]
        self._stored.inc(new)
        self._already.inc(len(self._batch) - new)
        self._batch = []


@dataclass(frozen=True)
class TopicIngest:
    """What to ingest from one topic: the message model it must match."""

    topic: str
    model: type[EdgeMessage]


class IngestTopic(beam.PTransform):
    """ReadKafka -> Parse -> (DeadLetter | DropDuplicates -> WriteToStore) for one topic."""

    def __init__(self, ingest: TopicIngest, ranges: list, settings: Any, store_path: str) -> None:
        super().__init__()
        self._ingest = ingest
        self._ranges = ranges
        self._settings = settings
        self._store_path = store_path

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        model = self._ingest.model
        parsed = (
            pbegin
            | "ReadKafka" >> ReadKafkaRanges(self._settings, self._ranges)
            | "Parse" >> beam.ParDo(ParseMessages(model)).with_outputs(DEAD, main="valid")
        )
        _ = (
            parsed[DEAD]
            | "EncodeDeadLetters" >> beam.Map(lambda d: ((d.key or "").encode(), encode(d)))
            | "SendDeadLetters" >> beam.ParDo(ProduceToKafka(self._settings, self._settings.topics.deadletter))
        )
        return (
            parsed["valid"]
            | "DropDuplicates" >> DropDuplicates()
            | "WriteToStore" >> beam.ParDo(WriteToStore(self._store_path, model))
        )


def topic_ingests(topics: Any) -> list[TopicIngest]:
    return [TopicIngest(topics.predictions, Prediction), TopicIngest(topics.events, EdgeEvent)]
