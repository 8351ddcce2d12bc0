"""What the settings of a service this project starts on this machine are made of: its ports and its folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port a service binds."""


def _absolute(path: Path) -> Path:
    return path.expanduser().absolute()


AbsolutePath = Annotated[Path, AfterValidator(_absolute)]
"""A folder or file, made absolute (``~`` expanded) when read: the service then finds it from any working folder,
and a pid check that compares it with a running process's command line sees the same text."""
