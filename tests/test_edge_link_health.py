"""The edge reports its Kafka link as it is now, not as it was at the last send.

The reproduction: with nothing to send, ``/healthz`` still said the link was reachable 10 s into an outage.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.outbox import Outbox
from edge_agent.sender import OutboxSender
from precursor.contracts.messages import Heartbeat
from precursor.contracts.settings import KafkaSettings


class _Listener:
    """A TCP port that accepts connections while open: what the sender's reachability check sees of a broker."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                return

    def close(self) -> None:
        self._open = False
        self.sock.close()


class _AckingProducer:
    """Stands in for the Kafka producer (the sender's own seam): every send is acknowledged at once."""

    class _Done:
        is_done = True

        def succeeded(self) -> bool:
            return True

    def send(self, topic: str, key: bytes, value: bytes) -> Any:
        return self._Done()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


def wait_until(check: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def test_an_idle_sender_notices_the_broker_going_away_within_seconds(tmp_path: Path) -> None:
    broker = _Listener()
    outbox = Outbox(tmp_path / "state.db", max_bytes=10**6)
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{broker.port}")
    sender = OutboxSender(outbox, settings, producer_factory=_AckingProducer, idle_probe_s=0.5)
    sender.start()
    try:
        outbox.stage(Heartbeat(edge_id="e1", seq=outbox.next_seq(), timestamp="2026-01-01T00:00:00Z",
                               model_name="m", model_version="1"))  # fmt: skip
        outbox.commit()
        wait_until(lambda: sender.broker_reachable is True and outbox.depth == 0, 10)
        broker.close()  # the outage: nothing more to send, so only a probe can tell
        took = wait_until(lambda: sender.broker_reachable is False, 10)
        assert took < 3.0
        assert sender.last_error is not None and "no Kafka broker reachable" in sender.last_error
    finally:
        sender.stop()
        sender.join(10)
        broker.close()


def test_a_reachable_idle_broker_stays_reachable(tmp_path: Path) -> None:
    broker = _Listener()
    outbox = Outbox(tmp_path / "state.db", max_bytes=10**6)
    sender = OutboxSender(
        outbox,
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{broker.port}"),
        producer_factory=_AckingProducer,
        idle_probe_s=0.2,
    )
    sender.start()
    try:
        outbox.stage(Heartbeat(edge_id="e1", seq=outbox.next_seq(), timestamp="2026-01-01T00:00:00Z",
                               model_name="m", model_version="1"))  # fmt: skip
        outbox.commit()
        wait_until(lambda: sender.broker_reachable is True, 10)
        time.sleep(1.0)  # several probes
        assert sender.broker_reachable is True and sender.failures == 0
    finally:
        sender.stop()
        sender.join(10)
        broker.close()


def test_whoever_sees_the_outbox_drained_after_an_outage_sees_the_broker_reachable(tmp_path: Path) -> None:
    """The sender records the link as reachable before it deletes what Kafka acknowledged: with the other order, a
    reader of ``/healthz`` (and a test) could see an empty outbox beside "broker unreachable" and the old error."""
    broker = _Listener()
    outbox = Outbox(tmp_path / "state.db", max_bytes=10**6)
    sender = OutboxSender(
        outbox, KafkaSettings(bootstrap_servers=f"127.0.0.1:{broker.port}"), producer_factory=_AckingProducer
    )
    sender.broker_reachable, sender.last_error = False, "NoBrokersAvailable: the outage before"
    outbox.stage(Heartbeat(edge_id="e1", seq=outbox.next_seq(), timestamp="2026-01-01T00:00:00Z",
                           model_name="m", model_version="1"))  # fmt: skip
    outbox.commit()
    reader = outbox.reader()
    seen: list[tuple[bool | None, str | None, int]] = []

    def acknowledge(seqs: list[int]) -> int:
        seen.append((sender.broker_reachable, sender.last_error, outbox.depth))
        return reader.acknowledge(seqs)

    try:
        assert sender._send(reader.pending(10), acknowledge) is True
        assert seen == [(True, None, 1)]  # reachable, no error, while the row was still there
        assert outbox.depth == 0 and sender.sent == 1
    finally:
        reader.close()
        broker.close()
