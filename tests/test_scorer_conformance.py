"""One conformance suite that every scorer passes (River's habit): the drift baseline the edge runs without a model,
the two fitted baselines ``precursor evaluate`` compares against, the language model scored with torch in the cloud,
and its signed int8 ONNX export as the edge runs it.

What every scorer promises (:class:`models.edge.scoring.Scorer`): it leaves the window untouched, ``score`` is
``score_many`` of one window, every risk is a probability and has ``failure``, the same windows always get the same
risks, and scoring keeps no state that grows with what it has scored. Awkward windows (a sensor that never reported,
a single reading, a machine it never saw, context events) still get a risk. A new scorer joins by adding a fixture
entry below.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import tracemalloc
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest

from models.edge.baselines import DriftZScore, GradientBoostingBaseline, ZScoreRule, baseline_features
from models.edge.runtime import LMScorer
from models.edge.scoring import Scorer, Window
from models.edge.signing import generate_keypair, load_public_keys
from models.training.model import TorchScorer
from precursor.contracts.messages import Event
from precursor.contracts.outcomes import ANY_FAILURE
from tests.fixtures_edge import build_artifact, training_windows

SENSORS = ("pressure", "temp", "vib")

BATCH_TOLERANCE = {"lm-onnx": 2e-3, "lm-torch": 1e-5}
"""How far a window's risk may move with its batch-mates; exact for the rest. The int8 graph quantizes activations
with one scale per batch (models.edge.runtime.LMScorer), and torch pads a batch (attention masked, sums reordered)."""


@dataclasses.dataclass(frozen=True)
class Built:
    scorers: dict[str, Scorer]
    windows: list[Window]


def with_context(windows: list[Window]) -> list[Window]:
    """Every third window carries an error and a maintenance event before its end, as the edge hands them over."""
    out = []
    for i, w in enumerate(windows):
        if i % 3 == 0:
            events = (
                Event(timestamp=w.end - timedelta(minutes=40), machine_id=w.machine_id, event="maintenance:bearing"),
                Event(timestamp=w.end - timedelta(minutes=20), machine_id=w.machine_id, event="error:E7"),
            )
            w = dataclasses.replace(w, events=events)
        out.append(w)
    return out


def awkward(windows: list[Window]) -> list[Window]:
    """Windows a scorer meets at the edge but never in training."""
    base = windows[-1]
    silent = base.values.copy()
    silent[:, 1] = np.nan  # a sensor that never reported in this window
    return [
        dataclasses.replace(base, values=silent),
        dataclasses.replace(base, timestamps=base.timestamps[-1:], values=base.values[-1:].copy()),  # one reading
        dataclasses.replace(base, machine_id="never-seen-7"),
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("conformance")
    keys = generate_keypair(root / "keys", "conformance")
    artifact = build_artifact(root, "1.0.0", keys.private_key_path, SENSORS)
    windows = with_context(training_windows(SENSORS, machines=6, per_machine=12, seed=5))
    failed = [w.values.mean() > 3.0 for w in windows]  # the later machines read high: a learnable label
    spec = baseline_features(windows, {"window_h": 1.0, "blocks": 2, "scaling": "machine"})
    zscore = ZScoreRule(spec, horizon_h=24)
    zscore.fit(windows, failed)
    trees = GradientBoostingBaseline(spec, horizon_h=24, max_iter=20)
    trees.fit(windows, failed)
    return Built(
        scorers={
            "drift-zscore": DriftZScore(horizon_h=24),
            "zscore": zscore,
            "gradient-boosting": trees,
            "lm-torch": TorchScorer.load(root / "checkpoint-1.0.0"),
            "lm-onnx": LMScorer.load(artifact, load_public_keys(keys.public_key_path)),
        },
        windows=windows[::6] + awkward(windows),
    )


SCORERS = ("drift-zscore", "zscore", "gradient-boosting", "lm-torch", "lm-onnx")


@pytest.fixture(params=SCORERS)
def case(request: pytest.FixtureRequest, built: Built) -> tuple[str, Scorer, list[Window]]:
    return request.param, built.scorers[request.param], built.windows


def frozen_copies(windows: list[Window]) -> list[Window]:
    """Copies whose arrays refuse writes, so a scorer that writes into its input fails at the write."""
    out = []
    for w in windows:
        timestamps, values = w.timestamps.copy(), w.values.copy()
        timestamps.flags.writeable = values.flags.writeable = False
        out.append(dataclasses.replace(w, timestamps=timestamps, values=values))
    return out


def assert_same_window(a: Window, b: Window) -> None:
    assert (a.machine_id, a.start, a.end, a.sensors, a.events, dict(a.attributes)) == (
        b.machine_id,
        b.start,
        b.end,
        b.sensors,
        b.events,
        dict(b.attributes),
    )
    np.testing.assert_array_equal(a.timestamps, b.timestamps)
    np.testing.assert_array_equal(a.values, b.values)  # NaN where NaN


def test_it_names_itself_and_meets_the_interface(case: tuple[str, Scorer, list[Window]]) -> None:
    _, scorer, _ = case
    assert isinstance(scorer, Scorer)
    assert scorer.name and scorer.version and scorer.horizon_h == 24


def test_scoring_leaves_the_windows_untouched(case: tuple[str, Scorer, list[Window]]) -> None:
    _, scorer, windows = case
    given = frozen_copies(windows)
    scorer.score_many(given)
    scorer.score(given[0])
    for before, after in zip(windows, given, strict=True):
        assert_same_window(before, after)


def test_every_risk_is_a_probability_with_the_any_failure_key(case: tuple[str, Scorer, list[Window]]) -> None:
    _, scorer, windows = case
    risks = scorer.score_many(windows)
    assert len(risks) == len(windows)
    for window, risk in zip(windows, risks, strict=True):
        assert ANY_FAILURE in risk, (window.machine_id, risk)
        assert all(isinstance(k, str) and math.isfinite(v) and 0.0 <= v <= 1.0 for k, v in risk.items()), risk


def test_score_is_score_many_of_one_window(case: tuple[str, Scorer, list[Window]]) -> None:
    name, scorer, windows = case
    together = scorer.score_many(windows)
    alone = [scorer.score(w) for w in windows]
    tolerance = BATCH_TOLERANCE.get(name, 0.0)
    for one, batch in zip(alone, together, strict=True):
        assert one.keys() == batch.keys()
        assert all(abs(one[k] - batch[k]) <= tolerance for k in one), (one, batch)
    assert scorer.score_many([]) == []


def test_the_same_windows_always_get_the_same_risks(case: tuple[str, Scorer, list[Window]]) -> None:
    _, scorer, windows = case
    first = scorer.score_many(windows)
    scorer.score_many(list(reversed(windows)))  # anything scored in between changes nothing
    assert scorer.score_many(windows) == first
    assert [scorer.score(w) for w in windows[:3]] == [scorer.score(w) for w in windows[:3]]


def test_scoring_keeps_no_state_that_grows(case: tuple[str, Scorer, list[Window]]) -> None:
    _, scorer, windows = case

    def held_after(rounds: int, score: Callable[[], object]) -> int:
        for _ in range(rounds):
            score()
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    score = lambda: scorer.score_many(windows[:6])  # noqa: E731
    score()  # warm-up: caches that are filled once (encoders, sessions) are not growth
    tracemalloc.start()
    try:
        after_few = held_after(2, score)
        after_many = held_after(12, score)
    finally:
        tracemalloc.stop()
    # Ten more rounds may leave a few KiB behind (allocator and library caches: at most 10 KiB measured, torch's), not
    # per-call state: keeping so much as the six windows each round would add more than this.
    grown = after_many - after_few
    assert grown < 32 * 1024, f"{grown / 1024:.0f} KiB more held after 10 more rounds of six windows"


def test_the_edge_runtime_gives_the_cloud_models_risks(built: Built) -> None:
    """Torch against int8 ONNX of the same checkpoint: close, not equal (int8 weights and activations)."""
    cloud = built.scorers["lm-torch"].score_many(built.windows)
    edge = built.scorers["lm-onnx"].score_many(built.windows)
    for c, e in zip(cloud, edge, strict=True):
        assert c.keys() == e.keys()
        assert all(abs(c[k] - e[k]) < 0.02 for k in c), (c, e)
