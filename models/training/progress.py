"""Progress of long work (reading a fleet, training, scoring), told to whoever watches: a bar on a terminal, or no one.

Work takes a :class:`Progress` and calls two verbs: ``stage`` when it starts a new part, with the number of steps
when it knows them, and ``advance`` as steps finish. :data:`NO_PROGRESS` is the default and does nothing, so library
callers and flows see no change; the command line passes a :class:`TerminalProgress`, which draws on stderr only,
so what a command prints on stdout stays the same with or without it.

>>> NO_PROGRESS.stage("training", total=3); NO_PROGRESS.advance()
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import IO, Any, Protocol


class Progress(Protocol):
    def stage(self, name: str, total: int | None = None) -> None:
        """A new part of the work begins (the previous one is done); ``total`` steps, when known."""
        ...

    def advance(self, steps: int = 1) -> None:
        """``steps`` more steps of the current stage are done."""
        ...


class _Silent:
    def stage(self, name: str, total: int | None = None) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass


NO_PROGRESS: Progress = _Silent()


def wanted(*, quiet: bool, force: bool, stream: IO[str] | None = None) -> bool:
    """Bars only for a person watching: never with ``quiet``, always with ``force``, else when ``stream`` (stderr)
    is a terminal (not a pipe, a file or a CI log)."""
    if quiet:
        return False
    stream = stream if stream is not None else sys.stderr
    return force or stream.isatty()


class TerminalProgress:
    """Each stage as a line on ``stream`` (stderr): a spinner, its name, a bar when its steps are known, the time
    taken. Used as a context manager: the display starts on entry and ends, with every finished line kept, on exit."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        # force_terminal: drawn as asked even when the caller forced bars onto a stream that is not a terminal.
        console = Console(file=stream if stream is not None else sys.stderr, force_terminal=True)
        self._bars = RichProgress(
            SpinnerColumn(finished_text="✓"),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: Any = None
        self._total: int | None = None
        self._done = 0

    def __enter__(self) -> TerminalProgress:
        self._bars.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._finish_stage()
        self._bars.stop()

    def stage(self, name: str, total: int | None = None) -> None:
        self._finish_stage()
        self._task = self._bars.add_task(name, total=total, count=f"0/{total}" if total is not None else "")
        self._total = total
        self._done = 0

    def advance(self, steps: int = 1) -> None:
        if self._task is None:
            return
        self._done += steps
        count = f"{self._done}/{self._total}" if self._total is not None else f"{self._done}"
        self._bars.update(self._task, advance=steps, count=count)

    def _finish_stage(self) -> None:
        if self._task is None:
            return
        # A stage is done when the next begins, also one that ended early (training stops at its time budget):
        # its bar is then drawn full and its count says how far it got.
        done = self._done if self._total is not None else 1
        self._bars.update(self._task, total=max(done, 1), completed=max(done, 1))
        self._task = None
