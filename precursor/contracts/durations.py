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
>>> parse_duration("3000000d")
Traceback (most recent call last):
...
ValueError: duration '3000000d' is longer than 100 years
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw])\s*$")
# No duration a person means is longer; a longer one overflows the dates it is subtracted from (a time before year 1).
MAX_DURATION = timedelta(days=36525)


def parse_duration(value: str | float | int | timedelta) -> timedelta:
    """A duration from ``<number><unit>``; a bare number is seconds."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _PATTERN.match(str(value)[:64])
        if not match:
            shown = repr(value) if len(str(value)) <= 64 else repr(str(value)[:61] + "...")
            raise ValueError(f"duration {shown} is not a number followed by ms, s, m, h, d or w (e.g. 30m, 6h, 7d)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or abs(seconds) > MAX_DURATION.total_seconds():
        raise ValueError(f"duration {value!r} is longer than 100 years")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


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
