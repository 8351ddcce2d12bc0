"""What ingest does to cost less gives the same answers as what it replaced: the producer's partitioner that remembers
key hashes picks kafka-python's partitions, and pipeline options that make each view once read and write the same
values as fresh views."""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions
from kafka.partitioner.default import DefaultPartitioner

from pipelines.engines import OptionViewsOnce
from pipelines.kafka_io import KeyHashCache


class _Cluster:
    """The two questions a partitioner asks of kafka-python's cluster metadata."""

    def __init__(self, partitions: int) -> None:
        self._partitions = set(range(partitions))

    def topics(self) -> set[str]:
        return {"t"}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions


def test_remembered_key_hashes_pick_the_default_partitioners_partitions() -> None:
    default, cached = DefaultPartitioner(), KeyHashCache(limit=100)
    for partitions in (1, 6, 7):
        cluster = _Cluster(partitions)
        keys = [f"pump-{i:05d}".encode() for i in range(300)] + [os.urandom(n) for n in range(40)] + [b""]
        for key in keys + keys:  # the second time from the table (emptied once it holds 100)
            expected = default.partition("t", None, key, None, None, cluster)
            assert cached.partition("t", None, key, None, None, cluster) == expected
    assert cached.partition("t", None, None, None, None, _Cluster(6)) in range(6)  # no key: any partition


def test_a_view_made_once_reads_and_writes_the_options_values() -> None:
    flags = ["--streaming", "--pipeline_type_check"]
    options, plain = OptionViewsOnce(flags), PipelineOptions(flags)
    assert options.view_as(StandardOptions) is options.view_as(StandardOptions)
    assert options.view_as(StandardOptions).streaming is plain.view_as(StandardOptions).streaming is True
    options.view_as(TypeOptions).runtime_type_check = True  # written through one view, seen by the next
    assert options.view_as(TypeOptions).runtime_type_check is True
    assert options.get_all_options()["runtime_type_check"] is True
    assert "_views" not in options.__getstate__()
