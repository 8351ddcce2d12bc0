"""The edge's fast paths give exactly what the plain ones give: the same statistics to the last bit, the same ids.

``block_statistics`` is checked against a frozen copy of the per-block loop it replaced (what every tokenizer so far
was fitted with), ``even_block_statistics`` (many windows at once) against it, ``TelemetryTokenizer.encode`` (id
tables) against ``_encode_plain`` (token text), and ``encode_many`` (a batch's statistics together) against
``encode``, over windows with gaps, irregular times, events, attributes, unseen machines and sensors, under several
tokenizer settings.
"""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from models.edge.features import (
    STATISTICS,
    aligned_values,
    block_statistics,
    even_block_statistics,
    evenly_filled,
    window_rows,
)
from models.edge.scoring import Window
from models.edge.tokenizer import TelemetryTokenizer, TokenizerSettings
from tests.test_tokenizer import END, SENSORS, make_window, training_windows


def reference_block_statistics(
    values: np.ndarray, timestamps: np.ndarray, *, end_s: int, window_s: float, blocks: int
) -> dict[str, np.ndarray]:
    """``block_statistics`` as it was before the fast path: one block at a time, every statistic."""
    n_sensors = values.shape[1]
    out = {name: np.full((blocks, n_sensors), np.nan) for name in STATISTICS}
    rows = window_rows(timestamps, end_s, window_s)
    t_all = timestamps[rows].astype(np.float64)
    x_all = values[rows]
    if len(t_all) == 0:
        return out
    start = end_s - window_s
    which = np.minimum(((t_all - start) / window_s * blocks).astype(np.int64), blocks - 1)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", category=RuntimeWarning)
        for b in range(blocks):
            in_block = which == b
            if not in_block.any():
                continue
            x = x_all[in_block]
            t = (t_all[in_block] / 3600.0)[:, None]
            seen = np.isfinite(x)
            count = seen.sum(axis=0)
            filled = np.where(seen, x, 0.0)
            mean = filled.sum(axis=0) / count
            out["mean"][b] = mean
            dev = np.where(seen, x - mean, 0.0)
            out["std"][b] = np.where(count >= 2, np.sqrt((dev**2).sum(axis=0) / count), np.nan)
            t_mean = np.where(seen, t, 0.0).sum(axis=0) / count
            t_dev = np.where(seen, t - t_mean, 0.0)
            t_var = (t_dev**2).sum(axis=0)
            out["slope"][b] = np.where((count >= 2) & (t_var > 0), (t_dev * dev).sum(axis=0) / t_var, np.nan)
            out["min"][b] = np.where(count > 0, np.where(seen, x, np.inf).min(axis=0), np.nan)
            out["max"][b] = np.where(count > 0, np.where(seen, x, -np.inf).max(axis=0), np.nan)
            last_row = np.where(seen, np.arange(len(x))[:, None], -1).max(axis=0)
            out["last"][b] = np.where(last_row >= 0, x[np.maximum(last_row, 0), np.arange(n_sensors)], np.nan)
    return out


def random_case(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int, float, int]:
    """(values, timestamps, end_s, window_s, blocks): regular or irregular times, gaps, one sensor or many."""
    n_sensors = int(rng.choice([1, 2, 3, 10, 17]))
    blocks = int(rng.choice([1, 2, 3, 4, 6]))
    window_s = float(rng.choice([60, 100, 3600, 21600]))
    rows = int(rng.integers(0, 130))
    end = 1_767_225_600 + int(rng.integers(0, 10**6))
    if rng.random() < 0.5:  # regular sampling: evenly filled blocks, the vectorised path
        step = max(1, int(window_s // max(1, rows)))
        timestamps = np.arange(end - step * rows, end, step, dtype=np.int64)
    else:  # irregular, and partly outside the window
        timestamps = np.sort(rng.integers(end - int(window_s * 1.5), end + 10, rows)).astype(np.int64)
    values = rng.normal(rng.normal(0, 100), rng.uniform(0.001, 50), (len(timestamps), n_sensors))
    if rng.random() < 0.5:
        values[rng.random(values.shape) < rng.uniform(0, 0.6)] = np.nan
    if rng.random() < 0.1:
        values = np.asfortranarray(values)
    return values, timestamps, end, window_s, blocks


def test_block_statistics_are_bit_identical_to_the_per_block_loop() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3000):
        values, timestamps, end, window_s, blocks = random_case(rng)
        expected = reference_block_statistics(values, timestamps, end_s=end, window_s=window_s, blocks=blocks)
        got = block_statistics(values, timestamps, end_s=end, window_s=window_s, blocks=blocks)
        assert got.keys() == expected.keys()
        for name in STATISTICS:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name, strict=True)
        some = tuple(name for name in STATISTICS if rng.random() < 0.5) or ("slope",)
        subset = block_statistics(values, timestamps, end_s=end, window_s=window_s, blocks=blocks, stats=some)
        assert set(subset) == set(some)
        for name in some:
            np.testing.assert_array_equal(subset[name], expected[name], err_msg=name, strict=True)


def test_even_block_statistics_of_many_windows_are_bit_identical_to_one_window_at_a_time() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        n_sensors, blocks = int(rng.choice([1, 3, 10])), int(rng.choice([1, 2, 3, 6]))
        window_s, rows = 3600.0, int(rng.choice([6, 12, 60]))
        end = 1_767_225_600 + 3600 * int(rng.integers(0, 1000))
        timestamps = np.arange(end - rows * (3600 // rows), end, 3600 // rows, dtype=np.int64)
        t_all = timestamps.astype(np.float64)
        if not evenly_filled(t_all, end_s=end, window_s=window_s, blocks=blocks):
            continue
        values = rng.normal(rng.normal(0, 100), rng.uniform(0.001, 50), (int(rng.integers(1, 20)), rows, n_sensors))
        values[rng.random(values.shape) < rng.uniform(0, 0.6)] = np.nan
        some = tuple(name for name in STATISTICS if rng.random() < 0.5) or ("mean",)
        hours = np.broadcast_to(t_all / 3600.0, values.shape[:2])
        together = even_block_statistics(values, hours, blocks=blocks, stats=some)
        assert set(together) == set(some)
        for w, x in enumerate(values):
            alone = block_statistics(x, timestamps, end_s=end, window_s=window_s, blocks=blocks, stats=some)
            for name in some:
                np.testing.assert_array_equal(together[name][w], alone[name], err_msg=name, strict=True)


def test_block_statistics_refuses_an_unknown_statistic() -> None:
    with pytest.raises(ValueError, match="unknown statistic"):
        block_statistics(np.zeros((2, 1)), np.arange(2), end_s=2, window_s=2, blocks=1, stats=("median",))


def test_aligned_values_with_the_same_reordered_or_missing_sensors() -> None:
    window = make_window("m-1", seed=3)
    for sensors in (SENSORS, ("vib", "pressure"), ("temp", "absent", "pressure"), ("absent",), ()):
        expected = np.full((len(window.timestamps), len(sensors)), np.nan)
        for j, name in enumerate(sensors):
            if name in window.sensors:
                expected[:, j] = window.values[:, window.sensors.index(name)]
        got = aligned_values(window, sensors)
        np.testing.assert_array_equal(got, expected, strict=True)
        assert got.flags.c_contiguous


def varied_windows() -> list[Window]:
    """Windows that take every branch of encoding: gaps, dropped and unseen sensors, events, attributes."""
    rng = np.random.default_rng(7)
    windows = []
    for k in range(60):
        machine = ["m-0", "m-1", "m-2", "m-3", "m-unseen"][k % 5]
        events = []
        if k % 2:
            events += [(float(rng.uniform(0.1, 11.9)), str(rng.choice(["error:E7", "error:E99", "anomaly"])))]
        if k % 3 == 0:
            events += [(5.0, "error:E7"), (30.0, "error:E1"), (100.0, "maintenance:bearing")]
        if k % 7 == 0:
            events += [(float(h), "failure:bearing") for h in (2, 40)] + [(3.0, "maintenance:seal")]
        if k % 11 == 0:
            events += [(h / 4, "error:E7") for h in range(1, 40)]
        attributes = [{}, {"model": "A"}, {"model": "B", "site": "north"}, {"model": "Z"}][k % 4]
        window = make_window(
            machine, seed=1000 + k, end=END + timedelta(hours=k), level=float(rng.normal(0, 2)), events=events
        )
        values = window.values.copy()
        values[rng.random(values.shape) < 0.15 * (k % 4)] = np.nan
        sensors = window.sensors
        if k % 6 == 1:  # a sensor the model does not know, and one it knows left out
            sensors, values = ("vib", "pressure", "brand_new"), np.concatenate([values[:, [2, 0]], values[:, :1]], 1)
        windows.append(
            Window(machine, window.start, window.end, window.timestamps, sensors, values, window.events, attributes)
        )
    end = datetime(2026, 3, 1, tzinfo=UTC)
    windows.append(Window("m-1", end - timedelta(hours=12), end, np.zeros(0, np.int64), SENSORS, np.zeros((0, 3))))
    return windows


@pytest.mark.parametrize(
    "settings",
    [
        TokenizerSettings(horizon_h=24, window_h=12, max_length=128, min_machine_rows=10),
        TokenizerSettings(
            horizon_h=24, window_h=12, blocks=3, block_stats=("mean", "std", "slope"), window_stats=(), max_length=64
        ),
        TokenizerSettings(horizon_h=24, window_h=12, block_stats=(), window_stats=("mean", "last", "min", "max")),
        TokenizerSettings(horizon_h=24, window_h=12, scaling="fleet", daily_profile=True, max_length=40, bins=5),
        TokenizerSettings(horizon_h=6, window_h=12, blocks=6, max_length=256, max_events_per_block=0),
    ],
)
def test_encode_gives_the_ids_of_the_plain_text_path(settings: TokenizerSettings, tmp_path) -> None:
    tokenizer = TelemetryTokenizer(settings)
    tokenizer.fit(training_windows(), ["ok", "failure", "bearing"], attribute_min_machines=2)
    tokenizer.save(tmp_path)
    loaded = TelemetryTokenizer.load(tmp_path)
    for window in varied_windows():
        plain = tokenizer._encode_plain(window)
        assert tokenizer.encode(window) == plain
        assert loaded.encode(window) == plain
        assert len(plain) <= settings.max_length


@pytest.mark.parametrize(
    "settings",
    [
        TokenizerSettings(horizon_h=24, window_h=12, max_length=128, min_machine_rows=10),
        TokenizerSettings(horizon_h=24, window_h=12, block_stats=(), window_stats=("mean", "last", "min", "max")),
        TokenizerSettings(horizon_h=24, window_h=12, scaling="fleet", daily_profile=True, max_length=40, bins=5),
        TokenizerSettings(horizon_h=6, window_h=12, blocks=6, max_length=256, max_events_per_block=0),
    ],
)
def test_encode_many_gives_the_ids_of_encode_one_window_at_a_time(settings: TokenizerSettings) -> None:
    tokenizer = TelemetryTokenizer(settings)
    tokenizer.fit(training_windows(), ["ok", "failure", "bearing"], attribute_min_machines=2)
    rng = np.random.default_rng(3)
    # Evenly sampled windows of a few lengths (each length a batch of its own), mixed with the varied ones (gaps,
    # irregular and empty windows go one at a time), in a shuffled order.
    windows = varied_windows()
    for k in range(90):
        window = make_window(
            ["m-0", "m-1", "m-unseen"][k % 3], seed=k, end=END + timedelta(hours=k), hours=[12, 6, 24][k % 3]
        )
        values = window.values.copy()
        values[rng.random(values.shape) < 0.1 * (k % 3)] = np.nan
        windows.append(Window(window.machine_id, window.start, window.end, window.timestamps, window.sensors, values))
    windows = [windows[i] for i in rng.permutation(len(windows))]
    expected = [tokenizer.encode(w) for w in windows]
    assert tokenizer.encode_many(windows) == expected
    assert tokenizer.encode_many(iter(windows[:7])) == expected[:7]
    assert tokenizer.encode_many([]) == []
