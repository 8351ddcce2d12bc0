"""Messages made by hand for tests and benchmarks that send them to Kafka themselves: one home for the window every
such prediction covers, so that a change to the contract is made once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from precursor.contracts.messages import Prediction

T0 = datetime(2026, 3, 1, tzinfo=UTC)
"""Hour 0 of the hand-made predictions."""


def hourly_prediction(
    hour: int,
    *,
    edge_id: str,
    seq: int,
    machine_id: str,
    risk: dict[str, float],
    model_name: str = "lm",
    model_version: str = "1",
    threshold: float | None = None,
) -> Prediction:
    """A prediction over the six hours that end ``hour`` hours after :data:`T0`, 24 hours ahead."""
    end = T0 + timedelta(hours=hour)
    return Prediction(
        edge_id=edge_id,
        seq=seq,
        machine_id=machine_id,
        window_start=end - timedelta(hours=6),
        window_end=end,
        horizon_h=24,
        risk=risk,
        model_name=model_name,
        model_version=model_version,
        threshold=threshold,
    )
