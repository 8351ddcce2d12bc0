"""The telemetry tokenizer: round trip, determinism, unseen sensors, missing values, context, limits."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from tokenizers import Tokenizer

from models.edge.features import FeatureSpec, SensorScaling, feature_vector
from models.edge.outcome import outcome_token, pack_sequences, risk_from_logits, risks_from_logits
from models.edge.scoring import Window
from models.edge.tokenizer import TelemetryTokenizer, TokenizerError, TokenizerSettings
from precursor.contracts.messages import Event

END = datetime(2026, 3, 1, 12, tzinfo=UTC)
SENSORS = ("pressure", "temp", "vib")


def make_window(
    machine_id: str = "m-1",
    *,
    seed: int = 0,
    end: datetime = END,
    hours: int = 12,
    sensors: Sequence[str] = SENSORS,
    level: float = 0.0,
    events: Sequence[tuple[float, str]] = (),
    attributes: dict[str, str] | None = None,
) -> Window:
    """``hours`` hourly readings ending an hour before ``end``; ``events`` as (hours before end, event text)."""
    rng = np.random.default_rng(seed)
    timestamps = np.array([int((end - timedelta(hours=hours - i)).timestamp()) for i in range(hours)], dtype=np.int64)
    values = (rng.normal(0, 1, (hours, len(sensors))) + level + np.arange(len(sensors)) * 10).astype(np.float32)
    return Window(
        machine_id=machine_id,
        start=end - timedelta(hours=hours),
        end=end,
        timestamps=timestamps,
        sensors=tuple(sensors),
        values=values,
        events=tuple(
            Event(timestamp=end - timedelta(hours=h), machine_id=machine_id, event=text)
            for h, text in sorted(events, key=lambda e: -e[0])
        ),
        attributes=attributes or {},
    )


def training_windows() -> list[Window]:
    windows = []
    for m in range(4):
        for k in range(30):
            windows.append(
                make_window(
                    f"m-{m}",
                    seed=100 * m + k,
                    end=END - timedelta(hours=k),
                    level=0.3 * m,
                    events=[(5.0, "error:E7"), (100.0, "maintenance:bearing")] if k % 3 == 0 else [(30.0, "error:E1")],
                    attributes={"model": "A" if m % 2 else "B", "serial": f"SN-{m}", "site": "north"},
                )
            )
    return windows


@pytest.fixture(scope="module")
def fitted() -> TelemetryTokenizer:
    tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, max_length=128, min_machine_rows=10))
    tokenizer.fit(training_windows(), ["ok", "failure", "bearing"], attribute_min_machines=2)
    return tokenizer


def test_sequence_starts_with_context_and_ends_with_the_horizon_token(fitted: TelemetryTokenizer) -> None:
    window = make_window("m-1", events=[(5.0, "error:E7"), (100.0, "maintenance:bearing")], attributes={"model": "A"})
    tokens = fitted.tokens(window)
    assert tokens[0] == "<bos>"
    assert tokens[-1] == "<horizon:24h>"
    assert fitted.encode(window)[-1] == fitted.horizon_id
    assert "attr:model=A" in tokens
    assert not any(t.startswith("attr:serial") or t.startswith("attr:site") for t in tokens)  # identifier, constant
    assert "maint:bearing#a07" in tokens  # 100 h ago: the 96-168 h bin
    assert "ev:error:E7" in tokens  # inside the window, after its block sensor tokens
    # 12 h in 4 blocks of 3 h: 5 h before the end is block 2, after that block's sensor tokens
    assert tokens.index("<b2>") < tokens.index("ev:error:E7") < tokens.index("<b3>")
    assert tokens[tokens.index("<b0>") + 1].startswith("pressure:mean")  # sensor-major: each sensor's statistics
    assert f"tod:{12 * 8 // 24}" in tokens


def test_outcome_tokens_cover_ok_unnamed_and_named_kinds(fitted: TelemetryTokenizer) -> None:
    outcomes = fitted.outcome_tokens
    assert set(outcomes) == {"ok", "failure", "bearing"}
    assert fitted.decode(list(outcomes.values())) == ["<ok>", "<failure>", "<failure:bearing>"]
    assert fitted.outcome_id("never-seen-kind") == outcomes["failure"]


def test_round_trip_through_the_hugging_face_files(fitted: TelemetryTokenizer, tmp_path) -> None:
    window = make_window("m-2", seed=7, events=[(2.0, "error:E1"), (3.0, "anomaly")])
    ids = fitted.encode(window)
    tokens = fitted.decode(ids)
    fitted.save(tmp_path)
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.encode(" ".join(tokens)).ids == ids  # the HF file alone maps the text back to the same ids
    assert hf.get_vocab_size() == fitted.vocab_size
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["precursor_telemetry"]["content_hash"] == fitted.content_hash
    assert config["model_max_length"] == 128

    loaded = TelemetryTokenizer.load(tmp_path)
    assert loaded.content_hash == fitted.content_hash
    assert loaded.encode(window) == ids
    assert loaded.outcome_tokens == fitted.outcome_tokens


def test_fitting_is_deterministic_and_versioned_by_content() -> None:
    settings = TokenizerSettings(horizon_h=24, window_h=12, max_length=128)
    a, b = TelemetryTokenizer(settings), TelemetryTokenizer(settings)
    a.fit(training_windows(), ["ok", "bearing"])
    b.fit(training_windows(), ["ok", "bearing"])
    window = make_window("m-3", seed=3)
    assert a.content_hash == b.content_hash
    assert a.encode(window) == b.encode(window) == a.encode(window)
    c = TelemetryTokenizer(settings.model_copy(update={"bins": 8}))
    c.fit(training_windows(), ["ok", "bearing"])
    assert c.content_hash != a.content_hash
    assert a.version == f"tok-{a.content_hash[:12]}"


def test_encoding_does_not_change_the_tokenizer_or_the_window(fitted: TelemetryTokenizer) -> None:
    window = make_window("m-9", seed=4)
    before_hash, before_values = fitted.content_hash, window.values.copy()
    fitted.encode(window)
    assert fitted.content_hash == before_hash
    np.testing.assert_array_equal(window.values, before_values)


def test_unseen_sensors_are_ignored(fitted: TelemetryTokenizer) -> None:
    window = make_window("m-1", seed=5)
    extra = Window(
        window.machine_id,
        window.start,
        window.end,
        window.timestamps,
        (*window.sensors, "brand_new"),
        np.concatenate([window.values, np.full((len(window.timestamps), 1), 42.0, np.float32)], axis=1),
    )
    assert fitted.encode(extra) == fitted.encode(window)
    assert not any("brand_new" in t for t in fitted.vocabulary_tokens())


def test_missing_values_and_missing_sensors_become_missing_tokens(fitted: TelemetryTokenizer) -> None:
    window = make_window("m-1", seed=6)
    blank = window.values.copy()
    blank[:, 1] = np.nan  # temp never reported
    blank[:4, 2] = np.nan  # vib missing in the first block only
    tokens = fitted.tokens(
        Window(window.machine_id, window.start, window.end, window.timestamps, window.sensors, blank)
    )
    assert tokens.count("temp:mean_") == 4 and tokens.count("temp:wstd_") == 1 and tokens.count("temp:wslope_") == 1
    assert tokens.count("vib:mean_") == 1  # its first block (the first 3 h) has no reading
    without_temp = Window(
        window.machine_id, window.start, window.end, window.timestamps, ("pressure", "vib"), window.values[:, [0, 2]]
    )
    assert fitted.tokens(without_temp).count("temp:mean_") == 4
    empty = Window("m-1", window.start, window.end, np.zeros(0, np.int64), SENSORS, np.zeros((0, 3), np.float32))
    assert fitted.tokens(empty)[-1] == "<horizon:24h>"


def test_machines_are_scaled_by_their_own_training_data(fitted: TelemetryTokenizer) -> None:
    # m-3 runs 0.9 higher than m-0 in training: the same raw values read lower for m-3 than for m-0
    same_values = make_window("m-0", seed=11, level=0.45)
    as_m3 = Window("m-3", same_values.start, same_values.end, same_values.timestamps, SENSORS, same_values.values)
    means = lambda w: [int(t[-2:]) for t in fitted.tokens(w) if t.startswith("pressure:mean")]  # noqa: E731
    assert sum(means(as_m3)) < sum(means(same_values))
    unseen = Window("m-new", same_values.start, same_values.end, same_values.timestamps, SENSORS, same_values.values)
    assert len(fitted.encode(unseen)) == len(fitted.encode(same_values))  # fleet scaling for a machine never seen


def test_events_are_trimmed_oldest_first_to_fit_max_length() -> None:
    settings = TokenizerSettings(horizon_h=24, window_h=12, max_length=25, blocks=3, window_stats=())
    tokenizer = TelemetryTokenizer(settings)
    tokenizer.fit(training_windows(), ["ok"], attribute_min_machines=2)
    assert tokenizer.fixed_length == 18  # bos, model, bearing age, lastfail, tod, 3 x (block + 3 sensors), horizon
    busy = make_window("m-1", events=[(h / 4, "error:E7") for h in range(1, 40)] + [(0.1, "anomaly")])
    tokens = tokenizer.tokens(busy)
    assert len(tokens) == 25
    assert tokens[-1] == "<horizon:24h>"
    # the newest events survive: the last block keeps its 4 (ending with the anomaly), the one before it 3
    assert tokens[-5:-1] == ["ev:error:E7", "ev:error:E7", "ev:error:E7", "ev:anomaly"]
    assert tokens.count("ev:error:E7") == 6


def test_attribute_tokens_never_single_out_a_machine() -> None:
    # 12 machines: two models and two sites, six of each, crossed; install years all different; a serial number.
    windows = [
        make_window(
            f"m-{m}",
            seed=m * 10 + k,
            end=END - timedelta(hours=k),
            attributes={
                "model": "AB"[m % 2],
                "site": ("north", "south")[m // 6],
                "install_year": str(2010 + (m * 5) % 12),
                "serial": f"SN-{m}",
            },
        )
        for m in range(12)
        for k in range(3)
    ]

    def kept(k: int) -> list[str]:
        tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, min_machine_rows=5))
        tokenizer.fit(windows, ["ok"], attribute_min_machines=k)
        groups = Counter(tuple(t for t in tokenizer.tokens(w) if t.startswith("attr:")) for w in windows[::3])
        assert min(groups.values()) >= k  # every combination the model can see covers k machines
        return [a.key for a in tokenizer.state.attributes]

    assert kept(5) == ["model"]  # model x site would leave groups of 3
    assert kept(3) == ["model", "site"]  # model x site x year bin would leave single machines
    assert kept(2) == ["model", "site"]
    assert kept(1) == ["install_year", "model", "serial", "site"]  # no rule: serial names each machine
    with pytest.raises(TokenizerError, match="attribute_min_machines"):
        kept(0)


def test_fit_refuses_a_layout_longer_than_max_length() -> None:
    tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, max_length=16, blocks=4))
    with pytest.raises(TokenizerError, match="more than max_length=16"):
        tokenizer.fit(training_windows(), ["ok"])


def test_unfitted_and_tampered_tokenizers_give_clear_errors(fitted: TelemetryTokenizer, tmp_path) -> None:
    with pytest.raises(TokenizerError, match="not fitted"):
        TelemetryTokenizer(TokenizerSettings(horizon_h=1, window_h=1)).encode(make_window())
    with pytest.raises(TokenizerError, match="no such file"):
        TelemetryTokenizer.load(tmp_path)
    fitted.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["precursor_telemetry"]["edges"]["mean"][0][0] += 1.0
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="content_hash"):
        TelemetryTokenizer.load(tmp_path)


def test_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="horizon_h"):
        TokenizerSettings(horizon_h=0, window_h=1)
    with pytest.raises(ValueError, match="both empty"):
        TokenizerSettings(horizon_h=1, window_h=1, block_stats=(), window_stats=())


def test_risk_is_the_softmax_over_outcome_tokens() -> None:
    outcomes = {"ok": 1, "failure": 2, "bearing": 3}
    logits = np.array([9.0, 0.0, -np.inf, np.log(3.0)])  # p(ok)=1/4, p(failure)=0, p(bearing)=3/4; token 0 ignored
    risk = risk_from_logits(logits, outcomes)
    assert risk == pytest.approx({"failure": 0.75, "bearing": 0.75})
    batch = risks_from_logits(np.stack([logits, np.zeros(4)]), outcomes)
    assert batch[1] == pytest.approx({"failure": 2 / 3, "bearing": 1 / 3})
    assert outcome_token("bearing") == "<failure:bearing>"
    with pytest.raises(ValueError, match="one vector"):
        risk_from_logits(np.zeros((2, 4)), outcomes)


def test_packing_right_pads_and_truncates_from_the_left() -> None:
    packed = pack_sequences([[5, 6, 7, 8], [9]], pad_id=0, max_length=3)
    assert packed.input_ids.tolist() == [[6, 7, 8], [9, 0, 0]]
    assert packed.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    logits = np.arange(2 * 3 * 2).reshape(2, 3, 2)
    assert packed.last_logits(logits).tolist() == [[4, 5], [6, 7]]


def test_labelled_fit_spends_half_the_bins_where_failed_windows_lie() -> None:
    healthy = [make_window(f"m-{k % 3}", seed=k, end=END - timedelta(hours=k)) for k in range(90)]
    failing = [make_window(f"m-{k % 3}", seed=500 + k, end=END - timedelta(hours=k), level=6.0) for k in range(10)]
    windows, outcomes = healthy + failing, ["ok"] * 90 + ["failure"] * 10
    settings = TokenizerSettings(horizon_h=24, window_h=12, scaling="fleet", max_length=128)
    plain, balanced = TelemetryTokenizer(settings), TelemetryTokenizer(settings)
    plain.fit(windows)
    balanced.fit(windows, outcomes=outcomes)

    def failing_bins(tokenizer: TelemetryTokenizer) -> set[str]:
        return {t for w in failing for t in tokenizer.tokens(w) if t.startswith("pressure:mean")}

    assert len(failing_bins(plain)) <= 2  # the failing windows all land in the top bin or two
    assert len(failing_bins(balanced)) >= 5  # now told apart from each other
    assert balanced.outcome_tokens.keys() == {"ok", "failure"}
    with pytest.raises(TokenizerError, match="2 outcomes for 100 windows"):
        plain.fit(windows, outcomes=["ok", "ok"])


def test_context_reads_the_same_however_much_history_the_caller_keeps(fitted: TelemetryTokenizer) -> None:
    # The edge keeps 30 days of events, training windows only the lookback: a failure older than the window plus
    # the lookback (12 h + 72 h) must read the same either way.
    old = make_window("m-1", events=[(200.0, "failure:bearing"), (100.0, "maintenance:bearing")])
    trimmed = make_window("m-1", events=[(100.0, "maintenance:bearing")])
    assert fitted.encode(old) == fitted.encode(trimmed)
    recent = fitted.tokens(make_window("m-1", events=[(50.0, "failure:bearing")]))
    assert "lastfail#a06" in recent  # 48-96 h ago


def test_daily_profile_takes_the_load_cycle_out() -> None:
    def cyclic(k: int, shift: float = 0.0) -> Window:
        end = END - timedelta(hours=k)
        hours = 12
        t = np.array([int((end - timedelta(hours=hours - i)).timestamp()) for i in range(hours)], dtype=np.int64)
        rng = np.random.default_rng(k)
        cycle = 10 * np.sin((t // 3600 % 24) / 24 * 2 * np.pi)  # the same every day: load, not wear
        load = cycle + shift + rng.normal(0, 0.1, hours)
        values = np.stack([load, rng.normal(0, 1, hours)], axis=1).astype(np.float32)
        return Window("m-1", end - timedelta(hours=hours), end, t, ("load", "temp"), values)

    windows = [cyclic(k) for k in range(200)]
    worn = [cyclic(k, shift=2.0) for k in range(24)]  # a small rise, at every hour of the day
    for daily, expected_all_top in ((False, False), (True, True)):
        tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, daily_profile=daily))
        tokenizer.fit(windows)
        bins = [int(t[-2:]) for w in worn for t in tokenizer.tokens(w) if t.startswith("load:mean")]
        assert (min(bins) == 15) is expected_all_top  # the top bin, whatever the hour, only without the cycle
    assert tokenizer.state.scaling.daily["m-1"].shape == (24, 2)


def test_daily_profile_survives_save_and_load(tmp_path) -> None:
    tokenizer = TelemetryTokenizer(
        TokenizerSettings(horizon_h=24, window_h=12, daily_profile=True, min_machine_rows=10, max_length=128)
    )
    tokenizer.fit(training_windows())
    tokenizer.save(tmp_path)
    loaded = TelemetryTokenizer.load(tmp_path)
    window = make_window("m-2", seed=9)
    assert loaded.encode(window) == tokenizer.encode(window)
    assert set(loaded.state.scaling.daily) == {"", "m-0", "m-1", "m-2", "m-3"}


def test_residual_scaling_reads_a_sensor_against_the_others() -> None:
    def pump(k: int, leak: float = 0.0) -> Window:
        # Pressure follows the speed, whatever the speed does (no daily pattern to take out); a leak loses pressure
        # for its speed, within the range the pressure has anyway.
        end = END - timedelta(hours=k)
        t = np.array([int((end - timedelta(hours=12 - i)).timestamp()) for i in range(12)], dtype=np.int64)
        rng = np.random.default_rng(k)
        speed = rng.uniform(-3, 3) + rng.normal(0, 0.1, 12)
        pressure = 2.0 * speed - leak + rng.normal(0, 0.1, 12)
        values = np.stack([speed, pressure], axis=1).astype(np.float32)
        return Window("m-1", end - timedelta(hours=12), end, t, ("speed", "pressure"), values)

    windows = [pump(k) for k in range(300)]
    leaking = [pump(k, leak=1.0) for k in range(300, 324)]
    for residual, expected_all_bottom in ((False, False), (True, True)):
        tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, residual=residual))
        tokenizer.fit(windows)
        bins = [int(t[-2:]) for w in leaking for t in tokenizer.tokens(w) if t.startswith("pressure:mean")]
        assert (max(bins) == 0) is expected_all_bottom  # the lowest bin at every speed, only against the speed
    matrix = tokenizer.state.scaling.residual
    assert matrix is not None and matrix.shape == (2, 2) and np.all(np.diag(matrix) == 0)
    assert matrix[0, 1] > 0.9  # pressure is read as (mostly) the speed's doing


def test_residual_scaling_survives_save_and_load_and_a_missing_sensor(tmp_path) -> None:
    tokenizer = TelemetryTokenizer(
        TokenizerSettings(horizon_h=24, window_h=12, residual=True, min_machine_rows=10, max_length=128)
    )
    tokenizer.fit(training_windows())
    tokenizer.save(tmp_path)
    loaded = TelemetryTokenizer.load(tmp_path)
    window = make_window("m-2", seed=9)
    assert loaded.encode(window) == tokenizer.encode(window)
    np.testing.assert_array_equal(loaded.state.scaling.residual, tokenizer.state.scaling.residual)
    gap = make_window("m-2", seed=9, sensors=("pressure", "temp"))  # no "vib": the others still get tokens
    tokens = tokenizer.tokens(gap)
    assert "vib:mean_" in tokens and any(t.startswith("temp:mean") and not t.endswith("_") for t in tokens)

    scaling = json.loads((tmp_path / "tokenizer_config.json").read_text())["precursor_telemetry"]["scaling"]
    assert SensorScaling.from_json(scaling).residual is not None
    with pytest.raises(ValueError, match="residual must be a finite 3x3 matrix"):
        SensorScaling.from_json({**scaling, "residual": [[0.0, 1.0]]})


def test_statistics_restart_at_a_failure_inside_the_window(tmp_path) -> None:
    settings = TokenizerSettings(horizon_h=24, window_h=12, max_length=128, min_machine_rows=10)
    plain = TelemetryTokenizer(settings)
    plain.fit(training_windows(), attribute_min_machines=2)
    restarting = TelemetryTokenizer(settings.model_copy(update={"restart_at_failure": True}))
    restarting.fit(training_windows(), attribute_min_machines=2)
    # Four blocks of 3 h; the failure 6.5 h before the end leaves the readings of the last 6 hours (blocks 2 and 3).
    straddling = make_window("m-1", seed=5, level=4.0, events=[(6.5, "failure:bearing"), (8.0, "error:E7")])
    tokens = restarting.tokens(straddling)
    assert tokens.count("pressure:mean_") == tokens.count("vib:mean_") == 2
    assert plain.tokens(straddling).count("pressure:mean_") == 0
    assert "ev:failure:?" in tokens and "ev:error:E7" in tokens  # the events themselves stay
    # Restarting reads the window as if the readings before the failure were never sent.
    unsent = straddling.values.copy()
    unsent[:6] = np.nan
    as_unsent = dataclasses.replace(straddling, values=unsent)
    assert restarting.encode(straddling) == plain.encode(as_unsent) == restarting.encode_many([straddling])[0]
    # No failure inside the window (one after its end is not known yet): nothing changes.
    later = make_window("m-1", seed=5, events=[(-1.0, "failure:bearing"), (8.0, "error:E7")])
    assert restarting.encode(later) == plain.encode(later)

    spec = FeatureSpec.from_training(training_windows(), window_h=12, restart_at_failure=True)
    blanked = feature_vector(straddling, spec)
    np.testing.assert_array_equal(blanked, feature_vector(as_unsent, spec))
    assert not np.array_equal(blanked, feature_vector(straddling, dataclasses.replace(spec, restart_at_failure=False)))

    # Saved only when on, so that tokenizers saved before the setting existed keep their content hash.
    plain.save(tmp_path / "plain")
    restarting.save(tmp_path / "restarting")
    saved = {
        name: json.loads((tmp_path / name / "tokenizer_config.json").read_text())["precursor_telemetry"]["settings"]
        for name in ("plain", "restarting")
    }
    assert "restart_at_failure" not in saved["plain"] and saved["restarting"]["restart_at_failure"] is True
    loaded = TelemetryTokenizer.load(tmp_path / "restarting")
    assert loaded.settings.restart_at_failure and loaded.encode(straddling) == restarting.encode(straddling)
    assert TelemetryTokenizer.load(tmp_path / "plain").content_hash == plain.content_hash != restarting.content_hash


def test_operating_regimes_are_found_and_each_sensor_read_within_its_own(tmp_path) -> None:
    """An engine flown at three settings: which one changes every hour, and hides a slow drift of one sensor."""
    modes = np.array([[0.0, 0.0, 0.0], [40.0, -30.0, 20.0], [-25.0, 35.0, -40.0]])

    def engine(k: int, drift: float = 0.0) -> Window:
        end = END - timedelta(hours=k)
        t = np.array([int((end - timedelta(hours=12 - i)).timestamp()) for i in range(12)], dtype=np.int64)
        rng = np.random.default_rng(k)
        values = modes[rng.integers(0, 3, 12)] + rng.normal(0, 1.0, (12, 3))
        values[:, 2] += drift
        return Window("e-1", end - timedelta(hours=12), end, t, SENSORS, values.astype(np.float32))

    windows = [engine(k) for k in range(200)]
    drifting = [engine(k, drift=3.0) for k in range(200, 224)]
    fitted = {}
    for regimes in (False, True):
        tokenizer = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, regimes=regimes, max_length=128))
        tokenizer.fit(windows)
        fitted[regimes] = tokenizer
        bins = [int(t[-2:]) for w in drifting for t in tokenizer.tokens(w) if t.startswith("vib:mean")]
        # Within its regime the drift is three spreads: the top bins. Against the regimes' jumps it is lost.
        assert (min(bins) >= 12) is regimes, bins
    found = fitted[True].state.scaling.regimes
    assert fitted[False].state.scaling.regimes is None
    assert found is not None and found.centroids.shape == (3, 3)

    fitted[True].save(tmp_path)
    loaded = TelemetryTokenizer.load(tmp_path)
    assert loaded.encode(drifting[0]) == fitted[True].encode(drifting[0])
    scaling = json.loads((tmp_path / "tokenizer_config.json").read_text())["precursor_telemetry"]["scaling"]
    with pytest.raises(ValueError, match="regimes must be two K x 3 matrices"):
        SensorScaling.from_json({**scaling, "regimes": {"centroids": [[0.0]], "scales": [[1.0]]}})


def test_a_fleet_without_regimes_is_scaled_as_before() -> None:
    auto = TelemetryTokenizer(
        TokenizerSettings(horizon_h=24, window_h=12, min_machine_rows=10, max_length=128, regimes=True)
    )
    off = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, min_machine_rows=10, max_length=128))
    auto.fit(training_windows())
    off.fit(training_windows())
    assert auto.state.scaling.regimes is None
    window = make_window("m-2", seed=9)
    assert auto.encode(window) == off.encode(window)


def test_training_looks_for_regimes_and_a_tokenizer_saved_before_them_keeps_its_hash(tmp_path) -> None:
    from models.training.train import TrainSettings

    assert TrainSettings(horizon_h=24).tokenizer.regimes is True
    assert TrainSettings(horizon_h=24, regimes=False).tokenizer.regimes is False
    before = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=12, min_machine_rows=10, max_length=128))
    before.fit(training_windows())
    before.save(tmp_path)
    written = json.loads((tmp_path / "tokenizer_config.json").read_text())["precursor_telemetry"]["settings"]
    assert "regimes" not in written  # off: not written, so tokenizers saved before the setting hash as they did
    assert TelemetryTokenizer.load(tmp_path).content_hash == before.content_hash
