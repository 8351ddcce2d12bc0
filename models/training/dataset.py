"""Labelled windows from the generic formats, cut exactly as the edge agent cuts them, and time-based splits.

Windows end on boundaries that are multiples of ``every_h`` since the epoch; the window ending at ``b`` holds a
machine's readings with ``b - window_h <= t < b`` (the edge agent's rule, so cloud and edge tokenize the same input)
and its events before ``b``: those within ``event_lookback_h`` plus the latest maintenance of each part.

The label of a window ending at ``b`` is the machine's first failure in ``[b, b + horizon_h)``: its kind (``failure``
when unnamed), else ``ok``. A label is used only when it is known before the end of the data it may use
(``labels_until``, exclusive): a failure before then, or ``b + horizon_h <= labels_until``. Windows whose outcome was
still open are left out, never guessed.

Time-based splits, no leakage: training windows end before the validation start and their labels are known by it;
validation windows end at or after it. The validation period is chosen to hold several failures (a fraction of them,
at least ``min_failures``), because thresholds and checkpoints picked on one or two failures are noise. One rule
(:func:`validation_start_s`) splits the generic files (:func:`choose_split`) and windows already labeled, as the
retrain flow holds them (:func:`split_for_validation`).

Machine splits, for fleets where time cannot separate the periods (a test set of machines never seen in training):
:class:`MachineSplit` holds out a share of machines chosen by a hash of their id (the same machines on every run and
every computer, whatever order the files list them in), or the machines a file lists. A model for new machines is
validated on new machines too (:func:`choose_validation_machines`, another hash): a share of the training machines
whose windows the selection run never learns from.

>>> split = MachineSplit.parse("0.3")
>>> held = [m for m in (f"drive-{i}" for i in range(1000)) if split.holds_out(m)]
>>> len(held), split.holds_out("drive-7") == MachineSplit.parse("0.3").holds_out("drive-7")
(282, True)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from models.edge.scoring import Window
from precursor.contracts.formats import TelemetryTable, read_events, read_machines, read_telemetry_table
from precursor.contracts.messages import Event
from precursor.contracts.outcomes import ANY_FAILURE, OK

HOUR_S = 3600


class DatasetError(ValueError):
    """Data that cannot be windowed or split as asked; the text names the file, setting or time involved."""


@dataclass(frozen=True)
class Failure:
    machine_id: str
    time_s: int
    kind: str  # "failure" when the event names no kind


@dataclass(frozen=True)
class Fleet:
    """A fleet's telemetry, events and static attributes, as read from the generic files."""

    table: TelemetryTable
    events: dict[str, list[Event]]  # machine_id -> events, oldest first
    attributes: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, telemetry: str | Path, events: str | Path | None, machines: str | Path | None = None) -> Fleet:
        for name, path in (("telemetry", telemetry), ("events", events), ("machines", machines)):
            if path is not None and not Path(path).is_file():
                raise DatasetError(f"{name} file {str(path)!r} does not exist")
        table = read_telemetry_table(telemetry)
        if len(table.machine_ids) == 0:
            raise DatasetError(f"telemetry file {str(telemetry)!r} has no rows")
        by_machine: dict[str, list[Event]] = {}
        for event in read_events(events) if events is not None else []:
            by_machine.setdefault(event.machine_id, []).append(event)
        return cls(table, by_machine, read_machines(machines))

    @property
    def machine_ids(self) -> list[str]:
        return [m for m, _ in self.table.machines()]

    def only(self, keep: Callable[[str], bool]) -> Fleet:
        """The fleet restricted to the machines ``keep`` accepts: their readings, events and attributes."""
        wanted = {m for m in self.machine_ids if keep(m)}
        kept = np.isin(self.table.machine_ids, np.array(sorted(wanted), dtype=object))
        if not wanted:
            raise DatasetError("no machine of the fleet is left after the machine split")
        table = TelemetryTable(
            machine_ids=self.table.machine_ids[kept],
            timestamps=self.table.timestamps[kept],
            sensors=list(self.table.sensors),
            values=self.table.values[kept],
        )
        return Fleet(
            table,
            {m: e for m, e in self.events.items() if keep(m)},
            {m: a for m, a in self.attributes.items() if keep(m)},
        )

    @property
    def last_time_s(self) -> int:
        """The latest instant the data speaks of: its last reading or its last event."""
        last = int(self.table.timestamps.max())
        for events in self.events.values():
            if events:
                last = max(last, int(events[-1].timestamp.timestamp()))
        return last

    def failures(self) -> list[Failure]:
        """Every failure event, oldest first."""
        out = [
            Failure(m, int(e.timestamp.timestamp()), e.detail or ANY_FAILURE)
            for m, events in self.events.items()
            for e in events
            if e.kind == "failure"
        ]
        return sorted(out, key=lambda f: (f.time_s, f.machine_id))


@dataclass(frozen=True)
class WindowSpec:
    """How windows are cut and labelled. Hours throughout."""

    window_h: float
    horizon_h: float
    every_h: float = 1.0
    min_points: int = 3
    event_lookback_h: float = 30 * 24.0

    def __post_init__(self) -> None:
        for name in ("window_h", "horizon_h", "every_h"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise DatasetError(f"{name}={value!r}: must be a positive number of hours")
        if self.min_points < 1:
            raise DatasetError(f"min_points={self.min_points}: must be at least 1")


@dataclass(frozen=True)
class LabeledWindow:
    """A window and what happened next: ``outcome`` is ``ok`` or the kind of the first failure within the horizon."""

    window: Window
    outcome: str
    hours_to_failure: float | None  # to the machine's next failure at or after the window's end, if one is known

    @property
    def failed(self) -> bool:
        return self.outcome != OK

    @property
    def end_s(self) -> int:
        return int(self.window.end.timestamp())


def build_windows(
    fleet: Fleet,
    spec: WindowSpec,
    *,
    ends_from_s: int | None = None,
    ends_before_s: int | None = None,
    labels_until_s: int | None = None,
    machines: Sequence[str] | None = None,
) -> list[LabeledWindow]:
    """Every labelled window whose end ``b`` lies in ``[ends_from_s, ends_before_s)``, in machine then time order."""
    labels_until = fleet.last_time_s + 1 if labels_until_s is None else labels_until_s
    every_s = round(spec.every_h * HOUR_S)
    window_s = spec.window_h * HOUR_S
    horizon_s = spec.horizon_h * HOUR_S
    lookback_s = spec.event_lookback_h * HOUR_S
    wanted = None if machines is None else set(machines)
    failures: dict[str, list[Failure]] = {}
    for f in fleet.failures():
        failures.setdefault(f.machine_id, []).append(f)
    table = fleet.table
    sensors = tuple(table.sensors)
    out: list[LabeledWindow] = []
    for machine_id, rows in table.machines():
        if wanted is not None and machine_id not in wanted:
            continue
        times = table.timestamps[rows]
        values = table.values[rows]
        events = fleet.events.get(machine_id, [])
        event_times = np.array([int(e.timestamp.timestamp()) for e in events], dtype=np.int64)
        attributes = fleet.attributes.get(machine_id, {})
        machine_failures = failures.get(machine_id, [])
        failure_times = np.array([f.time_s for f in machine_failures], dtype=np.int64)
        boundaries = np.unique((times // every_s) * every_s + every_s)
        if ends_from_s is not None:
            boundaries = boundaries[boundaries >= ends_from_s]
        if ends_before_s is not None:
            boundaries = boundaries[boundaries < ends_before_s]
        for b in boundaries.tolist():
            lo = int(np.searchsorted(times, b - window_s, side="left"))
            hi = int(np.searchsorted(times, b, side="left"))
            if hi - lo < spec.min_points:
                continue
            k = int(np.searchsorted(failure_times, b, side="left"))  # the next failure at or after b
            nxt = machine_failures[k] if k < len(machine_failures) else None
            if nxt is not None and nxt.time_s < labels_until and nxt.time_s < b + horizon_s:
                outcome = nxt.kind
            elif b + horizon_s <= labels_until:
                outcome = OK
            else:
                continue  # the outcome was still open at labels_until
            hours_to_failure = None if nxt is None or nxt.time_s >= labels_until else (nxt.time_s - b) / HOUR_S
            out.append(
                LabeledWindow(
                    window=Window(
                        machine_id=machine_id,
                        start=datetime.fromtimestamp(b - window_s, UTC),
                        end=datetime.fromtimestamp(b, UTC),
                        timestamps=times[lo:hi],
                        sensors=sensors,
                        values=values[lo:hi],
                        events=_context_events(events, event_times, b, lookback_s),
                        attributes=attributes,
                    ),
                    outcome=outcome,
                    hours_to_failure=hours_to_failure,
                )
            )
    return out


def _context_events(events: list[Event], event_times: np.ndarray, end_s: int, lookback_s: float) -> tuple[Event, ...]:
    """Events before ``end_s`` within the lookback, plus the latest earlier maintenance of each part (the edge rule)."""
    hi = int(np.searchsorted(event_times, end_s, side="left"))
    lo = int(np.searchsorted(event_times, end_s - lookback_s, side="left"))
    recent = events[lo:hi]
    latest: dict[str, Event] = {}
    for e in events[:lo]:
        if e.kind == "maintenance" and e.detail:
            latest[e.detail] = e
    older = [e for e in latest.values() if e not in recent]
    return tuple(sorted([*older, *recent], key=lambda e: e.timestamp))


@dataclass(frozen=True)
class TimeSplit:
    """Training windows end before ``validation_from_s``; validation windows end in ``[validation_from_s, until_s)``.

    Every period is half-open: training labels count failures before ``validation_from_s``, validation labels
    failures before ``until_s``, and a test period that starts at ``until_s`` sees only later failures.
    """

    validation_from_s: int
    until_s: int

    def to_json(self) -> dict[str, str]:
        return {"validation_from": _iso(self.validation_from_s), "until": _iso(self.until_s)}


def validation_start_s(
    failure_times_s: Sequence[int], horizon_h: float, *, fraction: float, min_failures: int, held: str
) -> int:
    """Where the validation period starts: one horizon before the first of the last ``max(min_failures, fraction)``
    failures (``failure_times_s`` oldest first), so that failure's warning windows are validation too.

    Raises :class:`DatasetError`, starting with ``held`` (what holds the failures), when no failure would be left to
    learn from.
    """
    needed = max(min_failures, math.ceil(fraction * len(failure_times_s)))
    if len(failure_times_s) < needed + 1:
        raise DatasetError(
            f"{held}: training needs at least {needed + 1} ({needed} for the validation period, at least one to "
            "learn from)"
        )
    return int(failure_times_s[-needed] - horizon_h * HOUR_S)


def choose_split(
    fleet: Fleet, horizon_h: float, *, until_s: int | None = None, fraction: float = 0.2, min_failures: int = 3
) -> TimeSplit:
    """A validation period at the end of the data that holds its last failures (:func:`validation_start_s`)."""
    until = fleet.last_time_s + 1 if until_s is None else until_s
    failures = [f.time_s for f in fleet.failures() if f.time_s < until]
    validation_from = validation_start_s(
        failures,
        horizon_h,
        fraction=fraction,
        min_failures=min_failures,
        held=f"{len(failures)} failure(s) up to {_iso(until)}",
    )
    return TimeSplit(validation_from_s=validation_from, until_s=until)


def split_windows(
    fleet: Fleet, spec: WindowSpec, split: ValidationSplit
) -> tuple[list[LabeledWindow], list[LabeledWindow]]:
    """(training, validation) windows; training labels are known by the validation start, so nothing leaks. Split by
    machine, both sides end before ``until_s`` and share its labels: no machine is on both sides."""
    if isinstance(split, MachineValidation):
        every = build_windows(fleet, spec, ends_before_s=split.until_s, labels_until_s=split.until_s)
        return (
            [w for w in every if w.window.machine_id not in split.machines],
            [w for w in every if w.window.machine_id in split.machines],
        )
    train = build_windows(fleet, spec, ends_before_s=split.validation_from_s, labels_until_s=split.validation_from_s)
    validation = build_windows(
        fleet, spec, ends_from_s=split.validation_from_s, ends_before_s=split.until_s, labels_until_s=split.until_s
    )
    return train, validation


def labeled_failures(windows: Sequence[LabeledWindow]) -> list[Failure]:
    """The distinct failures the windows' labels point at, oldest first."""
    found = {
        (w.window.machine_id, round(w.end_s + w.hours_to_failure * HOUR_S), w.outcome)
        for w in windows
        if w.failed and w.hours_to_failure is not None
    }
    return [Failure(m, t, k) for m, t, k in sorted(found, key=lambda f: (f[1], f[0], f[2]))]


def label_known_by(window: LabeledWindow, instant_s: int, horizon_h: float) -> bool:
    """Whether the window's label was settled before ``instant_s``: its failure happened, or its horizon passed."""
    if window.failed and window.hours_to_failure is not None:
        return window.end_s + window.hours_to_failure * HOUR_S < instant_s
    return window.end_s + horizon_h * HOUR_S <= instant_s


def split_for_validation(
    windows: Sequence[LabeledWindow], horizon_h: float, *, fraction: float, min_failures: int
) -> tuple[list[LabeledWindow], list[LabeledWindow]]:
    """(training, validation) of windows already labeled: the period of :func:`choose_split`, read from the labels'
    failures; training windows end before it and their labels were known by then, so nothing leaks."""
    failures = [f.time_s for f in labeled_failures(windows)]
    validation_from = validation_start_s(
        failures,
        horizon_h,
        fraction=fraction,
        min_failures=min_failures,
        held=f"the evidence holds {len(failures)} failure(s)",
    )
    train = [w for w in windows if w.end_s < validation_from and label_known_by(w, validation_from, horizon_h)]
    validation = [w for w in windows if w.end_s >= validation_from]
    return train, validation


def machine_share(machine_id: str, salt: str) -> float:
    """Where a machine falls in [0, 1): a hash of its id, so a split depends on nothing but the ids and the salt."""
    digest = hashlib.sha256(f"{salt}\x00{machine_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class MachineSplit:
    """The machines held out for test: a share chosen by :func:`machine_share`, or those a file lists (one id a line,
    ``#`` comments and blank lines ignored)."""

    fraction: float | None = None
    listed: frozenset[str] | None = None
    source: str = ""
    salt: str = "test"

    def __post_init__(self) -> None:
        if (self.fraction is None) == (self.listed is None):
            raise DatasetError("a machine split needs either a fraction or a list of machines, not both")
        if self.fraction is not None and not 0 < self.fraction < 1:
            raise DatasetError(f"test machines fraction {self.fraction!r}: must lie strictly between 0 and 1")
        if self.listed is not None and not self.listed:
            raise DatasetError(f"test machines file {self.source!r} lists no machine")

    @classmethod
    def parse(cls, value: str) -> MachineSplit:
        """``--test-machines``: a fraction such as ``0.3``, or a file of machine ids."""
        try:
            fraction = float(value)
        except ValueError:
            path = Path(value)
            if not path.is_file():
                raise DatasetError(
                    f"--test-machines {value!r} is neither a fraction in (0, 1) nor an existing file of machine ids"
                ) from None
            lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
            return cls(listed=frozenset(line for line in lines if line), source=str(path.resolve()))
        return cls(fraction=fraction, source=value)

    def holds_out(self, machine_id: str) -> bool:
        if self.listed is not None:
            return machine_id in self.listed
        assert self.fraction is not None
        return machine_share(machine_id, self.salt) < self.fraction

    def to_json(self) -> dict[str, object]:
        if self.listed is not None:
            return {"file": self.source, "machines": sorted(self.listed)}
        return {"fraction": self.fraction, "salt": self.salt}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> MachineSplit:
        if "machines" in data:
            machines = data["machines"]
            assert isinstance(machines, list)
            return cls(listed=frozenset(str(m) for m in machines), source=str(data.get("file", "")))
        return cls(fraction=float(data["fraction"]), salt=str(data.get("salt", "test")))  # type: ignore[arg-type]

    def apply(self, train: Fleet, test: Fleet) -> tuple[Fleet, Fleet]:
        """(training fleet without the held-out machines, test fleet of only those)."""
        return train.only(lambda m: not self.holds_out(m)), test.only(self.holds_out)


@dataclass(frozen=True)
class MachineValidation:
    """Validation on a share of the machines, training on the others: every window of each that ends before
    ``until_s``, labelled with what was known by then. For fleets whose test machines are new to the model, and where a
    period at the end would hold one class only (every healthy drive seen only at the end of the year)."""

    machines: frozenset[str]
    until_s: int

    def to_json(self) -> dict[str, object]:
        return {"validation_machines": sorted(self.machines), "until": _iso(self.until_s)}


ValidationSplit = TimeSplit | MachineValidation
"""How training and validation windows are told apart: by time, or by machine."""


def split_from_json(data: dict[str, object]) -> ValidationSplit:
    """The split a model's ``precursor.json`` records (``data.split``), so evaluation cuts the same windows."""
    until = parse_time(str(data["until"]))
    if "validation_machines" in data:
        machines = data["validation_machines"]
        assert isinstance(machines, list)
        return MachineValidation(machines=frozenset(str(m) for m in machines), until_s=until)
    return TimeSplit(validation_from_s=parse_time(str(data["validation_from"])), until_s=until)


def choose_validation_machines(
    fleet: Fleet,
    *,
    until_s: int | None = None,
    fraction: float = 0.2,
    min_failures: int = 3,
    salt: str = "validation",
) -> MachineValidation:
    """A share of the machines (by :func:`machine_share`) for validation, grown past ``fraction`` until they hold at
    least ``min_failures`` failures before ``until_s``; the other machines must keep one to learn from."""
    until = fleet.last_time_s + 1 if until_s is None else until_s
    failing = {f.machine_id for f in fleet.failures() if f.time_s < until}
    shares = sorted(fleet.machine_ids, key=lambda m: machine_share(m, salt))
    cut = max(1, round(fraction * len(shares)))
    while sum(1 for m in shares[:cut] if m in failing) < min_failures and cut < len(shares):
        cut += 1
    held = frozenset(shares[:cut])
    if sum(1 for m in held if m in failing) < min_failures or not failing - held:
        raise DatasetError(
            f"{len(failing)} machine(s) with failures: a validation share needs {min_failures} and training one more"
        )
    return MachineValidation(machines=held, until_s=until)


def choose_validation(
    fleet: Fleet,
    by: Literal["time", "machines"],
    horizon_h: float,
    *,
    until_s: int | None = None,
    fraction: float = 0.2,
    min_failures: int = 3,
) -> ValidationSplit:
    """The validation split ``by`` asks for: a period at the end (:func:`choose_split`) or a share of the machines
    (:func:`choose_validation_machines`), each holding at least ``min_failures`` failures before ``until_s``."""
    if by == "machines":
        return choose_validation_machines(fleet, until_s=until_s, fraction=fraction, min_failures=min_failures)
    return choose_split(fleet, horizon_h, until_s=until_s, fraction=fraction, min_failures=min_failures)


def outcome_counts(windows: Sequence[LabeledWindow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in windows:
        counts[w.outcome] = counts.get(w.outcome, 0) + 1
    return dict(sorted(counts.items()))


def parse_time(value: str) -> int:
    """``--until`` / ``--since``: ISO 8601 (naive is UTC) or epoch seconds, to epoch seconds."""
    from precursor.contracts.formats import parse_timestamp

    try:
        return int(parse_timestamp(value).timestamp())
    except ValueError as err:
        raise DatasetError(str(err)) from None


def _iso(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")
