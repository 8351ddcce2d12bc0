"""Durations as people write them on a command line or in a config file: ``20ms``, ``90s``, ``30m``, ``6h``, ``7d``.

>>> parse_duration("6h")
datetime.timedelta(seconds=21600)
>>> parse_duration("1.5d").total_seconds() / 3600
36.0
>>> parse_duration("20ms").total_seconds()
0.02
>>> parse_duration("soon")
Traceback (most recent call last):
...
ValueError: duration 'soon' is not a number followed by ms, s, m, h, d or w (e.g. 30m, 6h, 7d)
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw])\s*$")


def parse_duration(value: str | float | int | timedelta) -> timedelta:
    """A duration from ``<number><unit>``; a bare number is seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=float(value))
    match = _PATTERN.match(str(value))
    if not match:
        raise ValueError(f"duration {value!r} is not a number followed by ms, s, m, h, d or w (e.g. 30m, 6h, 7d)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def format_duration(value: timedelta) -> str:
    """The shortest exact ``<number><unit>`` form.

    >>> format_duration(timedelta(hours=30))
    '30h'
    """
    seconds = value.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0 and seconds >= _UNITS[unit]:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]
"""A pydantic field type that accepts ``6h``-style text and writes it back the same way."""
