"""The one reachability check the edge publisher, the pipeline command and the API's live tail share."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from infra.kafka_admin import BrokerUnreachable, check_reachable


@pytest.fixture
def listening() -> Iterator[str]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_listening_server_is_enough_even_after_a_closed_one(listening: str, closed_port: str) -> None:
    assert check_reachable([closed_port, listening], timeout_s=2.0) == listening


def test_no_listener_names_each_server_and_how_to_start_one(closed_port: str) -> None:
    with pytest.raises(BrokerUnreachable) as caught:
        check_reachable([closed_port, "127.0.0.1:notaport"], timeout_s=2.0)
    message = str(caught.value)
    assert message.startswith(f"no Kafka broker reachable at {closed_port}, 127.0.0.1:notaport (")
    assert f"{closed_port}: " in message and "'notaport' is not a number" in message
    assert "precursor kafka up" in message
    assert isinstance(caught.value, ConnectionError)  # what the API's live tail documents it raises
