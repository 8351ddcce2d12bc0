"""Window statistics: what the tokenizer quantizes and what the feature-based baselines read.

A window is cut on the clock, not on row counts: it covers ``[end - window_h, end)`` (the edge agent's rule: a window
ending at boundary ``b`` holds the readings with ``b - length <= t < b``), split into ``blocks`` equal spans. Per block
and sensor we take the mean, the standard deviation and the slope (per hour) of the scaled values; a block with no
reading of a sensor gives NaN, which downstream code turns into a "missing" token or leaves to the classifier.

Values are scaled per sensor before any statistic: by the machine's own robust centre and scale where training data
had enough of that machine, else by the fleet's. Numpy only: the edge tokenizes with this.

>>> import numpy as np
>>> t = np.arange(6, dtype=np.int64) * 3600
>>> x = np.array([[0.0], [1.0], [2.0], [3.0], [np.nan], [5.0]])
>>> stats = block_statistics(x, t, end_s=6 * 3600, window_s=6 * 3600, blocks=2)
>>> stats["mean"].tolist(), stats["slope"].tolist()
([[1.0], [4.0]], [[1.0], [1.0]])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from models.edge.regimes import Regimes
from models.edge.scoring import Window

STATISTICS = ("mean", "std", "slope", "last", "min", "max")
"""Every statistic :func:`block_statistics` computes; tokenizer settings pick from these."""

HOUR_S = 3600.0


def aligned_values(window: Window, sensors: Sequence[str]) -> np.ndarray:
    """The window's values ``(T, len(sensors))`` as float64 in the given sensor order; NaN where a sensor is absent.

    Sensors the window has but ``sensors`` lacks are dropped: a model only reads the sensors it was trained on.
    """
    if window.sensors == sensors or tuple(window.sensors) == tuple(sensors):
        # The usual case on the edge (every window of a source shares its layout): one C-ordered copy.
        return window.values.astype(np.float64, order="C")
    out = np.full((len(window.timestamps), len(sensors)), np.nan, dtype=np.float64)
    position = {name: j for j, name in enumerate(window.sensors)}
    pairs = [(j, position[name]) for j, name in enumerate(sensors) if name in position]
    if pairs:
        out[:, [j for j, _ in pairs]] = window.values[:, [k for _, k in pairs]]
    return out


@dataclass(frozen=True)
class SensorScaling:
    """Robust centre and scale per sensor, for the fleet and for each machine training data had enough of.

    ``scaled = (value - centre - daily[hour]) / scale``. Centre is the median, scale the interquartile range / 1.349
    (the standard deviation for normal data); where that is zero, the standard deviation. With a daily profile, each
    machine's median offset per hour of day (UTC) is taken out too: a load cycle then no longer drowns the slower
    changes that precede failures. A machine unseen in training is scaled by the fleet's figures.

    With ``residual`` (an ``(S, S)`` matrix, zero diagonal), each scaled sensor then becomes what the other sensors
    do not explain: ``scaled - scaled @ residual``, a ridge fit of every sensor on the others over the training rows.
    Why: sensors move together with the operating point (flow, pressure and current all follow the load, weekly
    cycles and slow wander included, which a daily profile does not catch), while a fault breaks that relation: a
    leaking seal loses pressure *for its speed*. A missing sensor counts as its centre in the others' fits.
    """

    sensors: tuple[str, ...]
    center: np.ndarray  # (S,)
    scale: np.ndarray  # (S,)
    machines: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # id -> (center, scale)
    daily: Mapping[str, np.ndarray] = field(default_factory=dict)  # id ("" for the fleet) -> (24, S) hourly offsets
    residual: np.ndarray | None = None  # (S, S): column j predicts sensor j from the others; zero diagonal
    regimes: Regimes | None = None  # operating regimes (models.edge.regimes): each reading measured within its own

    @classmethod
    def fit(
        cls,
        rows_by_machine: Mapping[str, np.ndarray],
        sensors: Sequence[str],
        *,
        per_machine: bool,
        min_machine_rows: int = 50,
        times_by_machine: Mapping[str, np.ndarray] | None = None,
        residual: bool = False,
        regimes: bool = False,
    ) -> SensorScaling:
        """Fit on each machine's training rows ``(N_m, S)`` (each row once, columns in ``sensors`` order).

        With ``times_by_machine`` (epoch seconds per row), also fit the daily profiles; with ``regimes``, look for
        operating regimes in the scaled rows (:meth:`models.edge.regimes.Regimes.detect`: kept only where the rows fall
        into tight clusters); with ``residual``, the cross-sensor fits (on rows scaled by everything before them).
        """
        if not rows_by_machine:
            raise ValueError("SensorScaling.fit needs the rows of at least one machine")
        all_rows = np.concatenate([np.asarray(r, dtype=np.float64) for r in rows_by_machine.values()])
        center, scale = _robust(all_rows)
        machines: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if per_machine:
            for machine_id in sorted(rows_by_machine):
                rows = np.asarray(rows_by_machine[machine_id], dtype=np.float64)
                if len(rows) < min_machine_rows:
                    continue
                m_center, m_scale = _robust(rows)
                enough = np.sum(np.isfinite(rows), axis=0) >= min_machine_rows
                m_center = np.where(enough & np.isfinite(m_center), m_center, center)
                m_scale = np.where(enough & np.isfinite(m_scale) & (m_scale > 0), m_scale, scale)
                machines[machine_id] = (m_center, m_scale)
        daily: dict[str, np.ndarray] = {}
        if times_by_machine is not None:
            all_times = np.concatenate([np.asarray(times_by_machine[m]) for m in rows_by_machine])
            daily[""] = _hourly_offsets(all_rows - center, all_times)
            for machine_id, (m_center, _) in machines.items():
                rows = np.asarray(rows_by_machine[machine_id], dtype=np.float64)
                daily[machine_id] = _hourly_offsets(rows - m_center, np.asarray(times_by_machine[machine_id]))
        scaling = cls(tuple(sensors), center, scale, machines, daily)

        def scaled_rows(by: SensorScaling) -> np.ndarray:
            return np.concatenate(
                [
                    by._scaled(np.asarray(rows, dtype=np.float64), machine_id, _times(times_by_machine, machine_id))
                    for machine_id, rows in rows_by_machine.items()
                ]
            )

        if regimes:
            found = Regimes.detect(scaled_rows(scaling))
            if found is not None:
                scaling = cls(tuple(sensors), center, scale, machines, daily, regimes=found)
        if not residual or len(sensors) < 2:
            return scaling
        return cls(
            tuple(sensors),
            center,
            scale,
            machines,
            daily,
            _cross_sensor_fit(scaled_rows(scaling)),
            regimes=scaling.regimes,
        )

    def apply(self, window: Window) -> np.ndarray:
        """The window's values in this scaling's sensor order, scaled: ``(T, S)`` float64."""
        scaled = self._scaled(aligned_values(window, self.sensors), window.machine_id, np.asarray(window.timestamps))
        if self.residual is None:
            return scaled
        return scaled - np.nan_to_num(scaled, nan=0.0) @ self.residual

    def _scaled(self, values: np.ndarray, machine_id: str, timestamps: np.ndarray | None) -> np.ndarray:
        center, scale = self.machines.get(machine_id, (self.center, self.scale))
        if self.daily and timestamps is not None:
            profile = self.daily.get(machine_id if machine_id in self.machines else "", self.daily[""])
            center = center + profile[(timestamps // 3600) % 24]  # (T, S)
        safe = np.where(scale > 0, scale, 1.0)
        scaled = (values - center) / safe
        return scaled if self.regimes is None else self.regimes.apply(scaled)

    def to_json(self) -> dict[str, object]:
        return {
            "sensors": list(self.sensors),
            "center": _floats(self.center),
            "scale": _floats(self.scale),
            "machines": {m: {"center": _floats(c), "scale": _floats(s)} for m, (c, s) in sorted(self.machines.items())},
            "daily": {m: [_floats(row) for row in p] for m, p in sorted(self.daily.items())},
            **({"residual": [_floats(row) for row in self.residual]} if self.residual is not None else {}),
            **({"regimes": self.regimes.to_json()} if self.regimes is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SensorScaling:
        try:
            machines = {
                str(m): (_array(v["center"]), _array(v["scale"]))  # type: ignore[index]
                for m, v in dict(data["machines"]).items()  # type: ignore[call-overload]
            }
            daily = {
                str(m): np.stack([_array(row) for row in rows])  # type: ignore[attr-defined]
                for m, rows in dict(data.get("daily", {})).items()  # type: ignore[call-overload]
            }
            residual = data.get("residual")
            matrix = np.stack([_array(row) for row in residual]) if residual is not None else None  # type: ignore[attr-defined]
            sensors = tuple(data["sensors"])  # type: ignore[arg-type]
            if matrix is not None and (matrix.shape != (len(sensors), len(sensors)) or not np.isfinite(matrix).all()):
                raise ValueError(f"residual must be a finite {len(sensors)}x{len(sensors)} matrix")
            found = data.get("regimes")
            regimes = Regimes.from_json(found, len(sensors)) if found is not None else None  # type: ignore[arg-type]
            return cls(sensors, _array(data["center"]), _array(data["scale"]), machines, daily, matrix, regimes)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"scaling config is malformed: {err!r}") from None


def _times(times_by_machine: Mapping[str, np.ndarray] | None, machine_id: str) -> np.ndarray | None:
    return None if times_by_machine is None else np.asarray(times_by_machine[machine_id])


def _cross_sensor_fit(scaled: np.ndarray, ridge: float = 1e-3) -> np.ndarray:
    """``(S, S)``: column ``j`` holds the ridge coefficients of sensor ``j`` on the other sensors (zero diagonal).

    Fitted on the rows where every sensor is present; missing values count as 0 (the centre) when applied.
    """
    n_sensors = scaled.shape[1]
    rows = scaled[np.isfinite(scaled).all(axis=1)]
    out = np.zeros((n_sensors, n_sensors))
    if len(rows) < 2 * n_sensors:
        return out  # too few complete rows to fit on: residuals are the scaled values themselves
    gram = rows.T @ rows
    for j in range(n_sensors):
        others = [i for i in range(n_sensors) if i != j]
        a = gram[np.ix_(others, others)] + ridge * len(rows) * np.eye(len(others))
        out[others, j] = np.linalg.solve(a, gram[others, j])
    return out


def _hourly_offsets(deviations: np.ndarray, times: np.ndarray, min_rows: int = 5) -> np.ndarray:
    """``(24, S)``: the median deviation from the centre per hour of day; 0 where an hour has too few readings."""
    hours = (times // 3600) % 24
    out = np.zeros((24, deviations.shape[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        for h in range(24):
            rows = deviations[hours == h]
            enough = np.sum(np.isfinite(rows), axis=0) >= min_rows
            if enough.any():
                out[h] = np.where(enough, np.nanmedian(rows, axis=0), 0.0)
    return out


def _floats(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


def _array(values: object) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)  # type: ignore[attr-defined]


def _robust(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        # An all-missing column gives NaN centre and scale: expected, handled by the caller.
        warnings.simplefilter("ignore", category=RuntimeWarning)
        center = np.nanmedian(rows, axis=0)
        q75, q25 = np.nanpercentile(rows, [75, 25], axis=0)
        scale = (q75 - q25) / 1.349
        std = np.nanstd(rows, axis=0)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, std)
    return center, scale


def distinct_rows(windows: Sequence[Window], sensors: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each machine's (times ``(N_m,)``, rows ``(N_m, S)``) across (overlapping) windows, each instant once."""
    times: dict[str, list[np.ndarray]] = {}
    values: dict[str, list[np.ndarray]] = {}
    for w in windows:
        times.setdefault(w.machine_id, []).append(np.asarray(w.timestamps))
        values.setdefault(w.machine_id, []).append(aligned_values(w, sensors))
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for machine_id in sorted(times):
        t = np.concatenate(times[machine_id])
        _, first = np.unique(t, return_index=True)  # overlapping windows repeat rows: keep each once
        if len(first):
            rows[machine_id] = (t[first], np.concatenate(values[machine_id])[first])
    return rows


def informative_sensors(rows_by_machine: Mapping[str, np.ndarray], sensors: Sequence[str]) -> list[str]:
    """Sensors with at least two distinct values: a constant says nothing about failures."""
    rows = np.concatenate(list(rows_by_machine.values()))
    keep = []
    for j, name in enumerate(sensors):
        column = rows[:, j][np.isfinite(rows[:, j])]
        if len(column) >= 2 and float(column.max() - column.min()) > 0:
            keep.append(name)
    return keep


def fit_scaling(
    windows: Sequence[Window],
    *,
    per_machine: bool,
    min_machine_rows: int = 50,
    daily_profile: bool = False,
    residual: bool = False,
    regimes: bool = False,
) -> SensorScaling:
    """Scaling for the informative sensors of training windows (constant sensors dropped)."""
    if not windows:
        raise ValueError("fit_scaling needs at least one training window")
    sensors = sorted({name for w in windows for name in w.sensors})
    rows = distinct_rows(windows, sensors)
    keep = informative_sensors({m: r for m, (_, r) in rows.items()}, sensors)
    if not keep:
        raise ValueError(f"no sensor varies in the training windows (sensors: {', '.join(sensors) or 'none'})")
    columns = [sensors.index(n) for n in keep]
    return SensorScaling.fit(
        {m: r[:, columns] for m, (_, r) in rows.items()},
        keep,
        per_machine=per_machine,
        min_machine_rows=min_machine_rows,
        times_by_machine={m: t for m, (t, _) in rows.items()} if daily_profile else None,
        residual=residual,
        regimes=regimes,
    )


def window_rows(timestamps: np.ndarray, end_s: int, window_s: float) -> slice:
    """The rows of ascending ``timestamps`` inside ``[end_s - window_s, end_s)``."""
    lo = int(np.searchsorted(timestamps, end_s - window_s, side="left"))
    hi = int(np.searchsorted(timestamps, end_s, side="left"))
    return slice(lo, hi)


def block_statistics(
    values: np.ndarray,
    timestamps: np.ndarray,
    *,
    end_s: int,
    window_s: float,
    blocks: int,
    stats: Iterable[str] = STATISTICS,
) -> dict[str, np.ndarray]:
    """Statistic name -> ``(blocks, S)`` array over the window ``[end_s - window_s, end_s)``; NaN where undefined.

    ``std`` needs two readings in the block and ``slope`` two distinct times; ``slope`` is per hour. ``stats`` names
    the statistics wanted (the result holds those only): the edge tokenizer needs two or three of the six.
    """
    if blocks < 1:
        raise ValueError(f"blocks must be at least 1, got {blocks}")
    wanted = frozenset(stats)
    if not wanted <= _KNOWN_STATISTICS:
        raise ValueError(f"unknown statistic(s) {sorted(wanted - _KNOWN_STATISTICS)}; known: {', '.join(STATISTICS)}")
    n_sensors = values.shape[1]
    out = {name: np.full((blocks, n_sensors), np.nan) for name in STATISTICS if name in wanted}
    rows = window_rows(timestamps, end_s, window_s)
    t_all = timestamps[rows].astype(np.float64)
    if len(t_all) == 0:
        return out
    # C order matters beyond speed: numpy sums a C-ordered (n, S) block row by row, and every path below must add
    # the same numbers in the same order, so the tokens never depend on which path a window took.
    x_all = np.ascontiguousarray(values[rows])
    hours = t_all / HOUR_S
    per_block = len(t_all) // blocks
    with np.errstate(all="ignore"):
        if evenly_filled(t_all, end_s=end_s, window_s=window_s, blocks=blocks):
            # Evenly filled blocks (regular sampling, the usual case): every block at once, as (blocks, n, S).
            _fill_statistics(
                out,
                slice(None),
                x_all.reshape(blocks, per_block, n_sensors),
                hours.reshape(blocks, per_block, 1),
            )
        else:
            which = np.minimum(((t_all - (end_s - window_s)) / window_s * blocks).astype(np.int64), blocks - 1)
            for b in range(blocks):
                in_block = which == b
                if in_block.any():
                    _fill_statistics(out, slice(b, b + 1), x_all[in_block][None], hours[in_block][None, :, None])
    return out


_KNOWN_STATISTICS = frozenset(STATISTICS)


def evenly_filled(t_all: np.ndarray, *, end_s: int, window_s: float, blocks: int) -> bool:
    """Whether a window's times (``t_all``, float64, the rows :func:`window_rows` picks, at least one) fill its
    ``blocks`` evenly, in order: regular sampling, for which :func:`block_statistics` takes every block at once."""
    per_block, extra = divmod(len(t_all), blocks)
    if extra:
        return False
    if blocks == 1:
        return True
    which = np.minimum(((t_all - (end_s - window_s)) / window_s * blocks).astype(np.int64), blocks - 1)
    return bool(np.array_equal(which, np.repeat(np.arange(blocks), per_block)))


def even_block_statistics(
    x: np.ndarray, hours: np.ndarray, *, blocks: int, stats: Iterable[str]
) -> dict[str, np.ndarray]:
    """:func:`block_statistics` of several evenly filled windows of the same length at once: ``x`` ``(W, n, S)``
    (C order) their values, ``hours`` ``(W, n)`` their times in hours; name -> ``(W, blocks, S)``.

    The same numbers to the last bit as one window at a time: every sum still runs over one block's rows in row
    order, the windows just stack on the axis the blocks already stack on (the edge scores windows in batches, and
    numpy's cost per call, not per number, is most of a window's).
    """
    n_windows, n, n_sensors = x.shape
    per_block = n // blocks
    out = {name: np.full((n_windows * blocks, n_sensors), np.nan) for name in STATISTICS if name in frozenset(stats)}
    with np.errstate(all="ignore"):
        _fill_statistics(
            out,
            slice(None),
            x.reshape(n_windows * blocks, per_block, n_sensors),
            hours.reshape(n_windows * blocks, per_block, 1),
        )
    return {name: v.reshape(n_windows, blocks, n_sensors) for name, v in out.items()}


def _fill_statistics(out: dict[str, np.ndarray], at: slice, x: np.ndarray, t: np.ndarray) -> None:
    """The statistics ``out`` holds, for blocks ``x`` ``(B, n, S)`` of readings at hours ``t`` ``(B, n, 1)``, into
    ``out[name][at]``. Each block's sums run over axis 1 in row order, exactly as one ``(n, S)`` block would."""
    seen = np.isfinite(x)
    count = seen.sum(axis=1)  # (B, S)
    if "mean" in out or "std" in out or "slope" in out:
        mean = np.where(seen, x, 0.0).sum(axis=1) / count
        if "mean" in out:
            out["mean"][at] = mean
        if "std" in out or "slope" in out:
            dev = np.where(seen, x - mean[:, None, :], 0.0)
            if "std" in out:
                out["std"][at] = np.where(count >= 2, np.sqrt((dev**2).sum(axis=1) / count), np.nan)
            if "slope" in out:
                t_mean = np.where(seen, t, 0.0).sum(axis=1) / count
                t_dev = np.where(seen, t - t_mean[:, None, :], 0.0)
                t_var = (t_dev**2).sum(axis=1)
                out["slope"][at] = np.where((count >= 2) & (t_var > 0), (t_dev * dev).sum(axis=1) / t_var, np.nan)
    if "min" in out:
        out["min"][at] = np.where(count > 0, np.where(seen, x, np.inf).min(axis=1), np.nan)
    if "max" in out:
        out["max"][at] = np.where(count > 0, np.where(seen, x, -np.inf).max(axis=1), np.nan)
    if "last" in out:
        last_row = np.where(seen, np.arange(x.shape[1])[None, :, None], -1).max(axis=1)  # (B, S)
        last = np.take_along_axis(x, np.maximum(last_row, 0)[:, None, :], axis=1)[:, 0, :]
        out["last"][at] = np.where(last_row >= 0, last, np.nan)


def latest_failure_s(window: Window) -> float | None:
    """Epoch seconds of the latest failure among the window's events before its end; None when there is none."""
    end_s = window.end.timestamp()
    times = [t for e in window.events if e.kind == "failure" and (t := e.timestamp.timestamp()) < end_s]
    return max(times) if times else None


def blank_before_failure(values: np.ndarray, window: Window) -> np.ndarray:
    """``values`` (rows as ``window.timestamps``) with every row before the window's latest failure blanked (NaN).

    Why: a failure ends in a repair, and the machine that comes back is not the one that failed. Statistics over a
    window that straddles a failure mix the degraded readings with the repaired machine's, so a window just after a
    repair looks like one just before a failure. Blanked, the blocks before the failure read as missing, and the
    statistics describe the machine as it is now. On the simulator's fleet this made the exact hours since the failure
    worth nothing more to gradient boosting (test PR-AUC 0.550 without them, 0.504 before): the blanking says it.
    """
    failed_at = latest_failure_s(window)
    if failed_at is None:
        return values
    out = values.copy()
    out[np.asarray(window.timestamps) < failed_at] = np.nan
    return out


def statistics_input(window: Window, scaling: SensorScaling, *, restart_at_failure: bool) -> np.ndarray:
    """The window's values as the statistics read them: scaled, and restarted at a failure if asked. The tokenizer
    and the baselines both start here, so the LM and its baselines read the same rows."""
    values = scaling.apply(window)
    return blank_before_failure(values, window) if restart_at_failure else values


def window_statistics(
    values: np.ndarray, timestamps: np.ndarray, *, end_s: int, window_s: float
) -> dict[str, np.ndarray]:
    """The same statistics over the whole window: name -> ``(S,)``."""
    return {k: v[0] for k, v in block_statistics(values, timestamps, end_s=end_s, window_s=window_s, blocks=1).items()}


# --- context: what happened to the machine, from its events -------------------------------------------------------


@dataclass(frozen=True)
class WindowContext:
    """What a window's events say, in hours before the window's end.

    ``hours_since_maintenance``: per part, its latest maintenance (however old); ``hours_since_failure``: the latest
    failure within the window and the lookback before it; ``recent_errors``: error codes before the window's start
    within the lookback, oldest first; ``window_events``: the events inside the window as (block, event text).
    """

    hours_since_maintenance: dict[str, float]
    hours_since_failure: float | None
    recent_errors: tuple[str, ...]
    window_events: tuple[tuple[int, str], ...]
    hour_of_day: int


def window_context(window: Window, *, window_h: float, blocks: int, event_lookback_h: float) -> WindowContext:
    end_s = window.end.timestamp()
    start_s = end_s - window_h * HOUR_S
    maintenance: dict[str, float] = {}
    last_failure: float | None = None
    recent: list[str] = []
    inside: list[tuple[int, str]] = []
    for event in sorted(window.events, key=lambda e: e.timestamp):
        t = event.timestamp.timestamp()
        if t >= end_s:
            continue  # the future is not context, whatever the caller passed in
        age_h = (end_s - t) / HOUR_S
        if event.kind == "maintenance" and event.detail:
            maintenance[event.detail] = age_h
        if event.kind == "failure" and age_h <= window_h + event_lookback_h:
            # Only within the lookback: callers keep older failures or not (the edge keeps 30 days, training data
            # only the lookback), and the tokens must not depend on that.
            last_failure = age_h
        if t >= start_s:
            block = min(int((t - start_s) / (window_h * HOUR_S) * blocks), blocks - 1)
            inside.append((block, event.event))
        elif event.kind == "error" and event.detail and age_h <= window_h + event_lookback_h:
            recent.append(event.detail)
    return WindowContext(
        hours_since_maintenance=maintenance,
        hours_since_failure=last_failure,
        recent_errors=tuple(recent),
        window_events=tuple(inside),
        hour_of_day=window.end.hour,
    )


# --- a fixed-length feature vector, for classifiers -------------------------------------------------------------


@dataclass(frozen=True)
class FeatureSpec:
    """How :func:`feature_matrix` reads windows: the same cut and scaling the tokenizer uses, as continuous numbers."""

    scaling: SensorScaling
    window_h: float
    blocks: int = 3
    event_lookback_h: float = 72.0
    maintenance_parts: tuple[str, ...] = ()
    error_codes: tuple[str, ...] = ()
    numeric_attributes: tuple[str, ...] = ()
    restart_at_failure: bool = False

    @classmethod
    def from_training(
        cls,
        windows: Sequence[Window],
        *,
        window_h: float,
        blocks: int = 3,
        per_machine: bool = True,
        daily_profile: bool = False,
        residual: bool = False,
        regimes: bool = False,
        event_lookback_h: float = 72.0,
        max_error_codes: int = 32,
        restart_at_failure: bool = False,
    ) -> FeatureSpec:
        """Scaling, maintenance parts, frequent error codes and numeric attributes, from training windows only."""
        errors: dict[str, int] = {}
        for w in windows:
            for e in w.events:
                if e.kind == "error" and e.detail:
                    errors[e.detail] = errors.get(e.detail, 0) + 1
        frequent = sorted(errors, key=lambda c: (-errors[c], c))[:max_error_codes]
        attributes: dict[str, set[float]] = {}
        for w in windows:
            for key, value in w.attributes.items():
                attributes.setdefault(key, set()).add(_number_or_nan(value))
        return cls(
            scaling=fit_scaling(
                windows, per_machine=per_machine, daily_profile=daily_profile, residual=residual, regimes=regimes
            ),
            window_h=window_h,
            blocks=blocks,
            event_lookback_h=event_lookback_h,
            maintenance_parts=tuple(
                sorted({e.detail for w in windows for e in w.events if e.kind == "maintenance" and e.detail})
            ),
            error_codes=tuple(sorted(frequent)),
            numeric_attributes=tuple(
                sorted(k for k, v in attributes.items() if len(v) > 1 and all(math.isfinite(x) for x in v))
            ),
            restart_at_failure=restart_at_failure,
        )

    def scaled(self, window: Window) -> np.ndarray:
        """The window's values as the statistics read them (:func:`statistics_input`)."""
        return statistics_input(window, self.scaling, restart_at_failure=self.restart_at_failure)

    def names(self) -> list[str]:
        names = [f"{s}:w{stat}" for stat in STATISTICS for s in self.scaling.sensors]
        names += [
            f"{s}:b{b}{stat}"
            for stat in ("mean", "std", "slope")
            for b in range(self.blocks)
            for s in self.scaling.sensors
        ]
        names += [f"maintenance:{p}:hours" for p in self.maintenance_parts]
        names += ["failure:hours", "errors:recent", "errors:window", "events:window", "hour_of_day"]
        names += [f"error:{c}:count" for c in self.error_codes]
        names += [f"attr:{a}" for a in self.numeric_attributes]
        return names


def feature_vector(window: Window, spec: FeatureSpec) -> np.ndarray:
    """One row of window statistics, context and attributes; NaN where undefined (gradient boosting handles NaN)."""
    values = spec.scaled(window)
    end_s = int(window.end.timestamp())
    window_s = spec.window_h * HOUR_S
    whole = window_statistics(values, window.timestamps, end_s=end_s, window_s=window_s)
    per_block = block_statistics(values, window.timestamps, end_s=end_s, window_s=window_s, blocks=spec.blocks)
    context = window_context(window, window_h=spec.window_h, blocks=spec.blocks, event_lookback_h=spec.event_lookback_h)
    window_errors = [e for _, e in context.window_events if e.startswith("error:")]
    all_errors = [*context.recent_errors, *(e.split(":", 1)[1] for e in window_errors)]
    parts: list[Iterable[float]] = [
        *(whole[stat] for stat in STATISTICS),
        *(per_block[stat].reshape(-1) for stat in ("mean", "std", "slope")),
        [context.hours_since_maintenance.get(p, np.nan) for p in spec.maintenance_parts],
        [
            np.nan if context.hours_since_failure is None else context.hours_since_failure,
            len(context.recent_errors),
            len(window_errors),
            len(context.window_events),
            context.hour_of_day,
        ],
        [sum(1 for e in all_errors if e == code) for code in spec.error_codes],
        [_number_or_nan(window.attributes.get(a)) for a in spec.numeric_attributes],
    ]
    return np.concatenate([np.asarray(list(p), dtype=np.float64) for p in parts])


def feature_matrix(windows: Sequence[Window], spec: FeatureSpec) -> np.ndarray:
    """:func:`feature_vector` for each window: ``(N, F)``."""
    if not windows:
        return np.zeros((0, len(spec.names())))
    return np.stack([feature_vector(w, spec) for w in windows])


def _number_or_nan(value: str | None) -> float:
    if value is None:
        return np.nan
    try:
        number = float(value)
    except ValueError:
        return np.nan
    return number if math.isfinite(number) else np.nan
