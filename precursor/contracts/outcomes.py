"""What can follow a window: no failure, or a failure of some kind. The names every side reads risks and labels by.

A :class:`~precursor.contracts.messages.Prediction`'s risk always has :data:`ANY_FAILURE` (a failure of any, or an
unnamed,
kind) and may name kinds beside it; a labeled window's outcome is :data:`OK` or a failure kind.

>>> failure_kind("failure:bearing"), failure_kind("failure"), failure_kind("error:E7")
('bearing', 'failure', None)
"""

from __future__ import annotations

ANY_FAILURE = "failure"
"""The risk key, event text and outcome for a failure of any (or unnamed) kind."""

OK = "ok"
"""The outcome for "no failure within the horizon"."""


def failure_kind(event: str) -> str | None:
    """The failure kind of an event text (:data:`ANY_FAILURE` where it names none), or ``None`` for no failure."""
    if event == ANY_FAILURE:
        return ANY_FAILURE
    if event.startswith(ANY_FAILURE + ":"):
        return event.split(":", 1)[1]
    return None
