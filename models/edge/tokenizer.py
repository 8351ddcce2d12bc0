"""Telemetry as language: a machine's window becomes a sequence of token ids, ending with the question.

The sequence, oldest to newest::

    <bos> attr:model=X5 maint:bearing#a07 lastfail=never tod:3 err:E12    context: who the machine is, what happened
    <b0> s1:mean04 s2:mean_ ... ev:error:E7                               each block: per sensor, binned statistics
    <b1> ...                                                             (the mean by default), then the block's
                                                                         events in time order
    <trend> s1:wslope12 s1:wstd03 s2:wslope07 ...                        whole-window statistics (slope and spread)
    <horizon:24h>                                                        the question; the NEXT token is the answer:
                                                                         <ok>, <failure> or <failure:KIND>

- Values are scaled per machine and sensor (robust centre and scale from the machine's training rows; the fleet's for
  a machine training never saw), then each statistic is cut into quantile bins fitted on training windows only
  (class-balanced when the windows' labels are given: half the bins where failed windows lie).
  ``s2:mean_`` says "no reading in this block": missing values are tokens, not errors. Sensors a window has but
  training did not are ignored; sensors constant in training carry no information and get no tokens. With
  ``restart_at_failure``, the statistics read only the rows after the window's latest failure: a repaired machine is
  not the one that failed, and its window should not look like the failing one's.
- Context tokens: static attributes (categorical values, or quantile bins for numeric ones; attributes constant in
  training are dropped, and so is any that would let the attribute tokens together single out fewer than
  ``ATTRIBUTE_MIN_MACHINES`` training machines), hours since the last maintenance of each part and since the last
  failure within the lookback (log-spaced bins), the most recent error codes before the window, and the hour of day.
- The sequence never exceeds ``max_length``: the fixed part (context, blocks, statistics) is checked at fit time;
  events and recent errors, which vary, are trimmed oldest first to fit.

Saved as a Hugging Face ``tokenizer.json`` (WordLevel; its vocab holds every token, so ``tokenizers`` alone can map
ids to text) plus ``tokenizer_config.json`` (the usual Hugging Face keys and, under ``precursor_telemetry``, the
settings, scaling and bins). :attr:`TelemetryTokenizer.content_hash` is the sha256 of both, so a tokenizer is
versioned by what it does. Imports numpy, tokenizers and our own contracts only: the edge uses this file.

Window boundaries follow the edge agent's rule: a window covers ``[end - window_h, end)``; rows before that are
ignored, so a caller may pass a longer buffer. The window's ``events`` should hold at least the events within
``window_h + event_lookback_h`` before its end and the latest maintenance of each part.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from models.edge.features import (
    HOUR_S,
    SensorScaling,
    WindowContext,
    block_statistics,
    even_block_statistics,
    evenly_filled,
    fit_scaling,
    statistics_input,
    window_context,
    window_rows,
)
from models.edge.outcome import outcome_token
from models.edge.scoring import Window
from precursor.contracts.outcomes import ANY_FAILURE, OK

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CONFIG_KEY = "precursor_telemetry"
FORMAT = "precursor-telemetry-tokenizer/1"

SETTINGS_WRITTEN_WHEN_ON = ("restart_at_failure", "regimes", "age_values")
PAD, UNK, BOS, TREND = "<pad>", "<unk>", "<bos>", "<trend>"
AGE_EDGES_H = (1.0, 3.0, 6.0, 12.0, 24.0, 48.0, 96.0, 168.0, 336.0, 720.0, 1440.0, 2880.0, 4320.0, 8760.0)
"""Bins for "hours since": fixed and log-spaced, from an hour to a year (15 bins)."""
TIME_TO_FAILURE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 2.0, 4.0)
"""Buckets, in horizons, of the hours to the next failure: what training asks after the outcome (``<next:B>``)."""
HOUR_OF_DAY_BUCKETS = 8
MAX_CATEGORICAL_VALUES = 32
MAX_ERROR_CODES = 64
NUMERIC_ATTRIBUTE_BINS = 8
ATTRIBUTE_MIN_MACHINES = 5
"""Every combination of attribute tokens is shared by at least this many training machines (``_fit_attributes``)."""
MAX_FIT_WINDOWS = 20_000
MAX_CACHED_ATTRIBUTE_SETS = 65_536
ENCODE_BATCH = 256
"""Windows :meth:`TelemetryTokenizer.encode_many` works out together: training encodes thousands, and the arrays of a
batch (windows x rows x sensors) should stay small."""

Statistic = Literal["mean", "std", "slope", "last", "min", "max"]


class TokenizerError(ValueError):
    """A tokenizer that cannot be fitted, saved or loaded as asked; the text says which setting or file is wrong."""


class SequenceTooLongError(TokenizerError):
    """The fixed part of a sequence is longer than ``max_length``: ``sensors`` informative sensors and ``context``
    tokens of machine context (begin, attributes, parts, last failure, time of day), so a caller can work out which
    other settings would fit (:func:`fixed_length_of`)."""

    def __init__(self, message: str, *, sensors: int, context: int) -> None:
        super().__init__(message)
        self.sensors = sensors
        self.context = context


def fixed_length_of(sensors: int, context: int, s: TokenizerSettings) -> int:
    """Tokens every sequence has under settings ``s``: the context, each block's marker and statistics, the window's
    marker and statistics, and the horizon token; what ``max_length`` leaves goes to events and errors."""
    body = s.blocks * (1 + sensors * len(s.block_stats)) if s.block_stats else 0
    trend = 1 + sensors * len(s.window_stats) if s.window_stats else 0
    return context + body + trend + 1


class TokenizerSettings(BaseModel):
    """What a tokenizer is asked to do. Everything it learns from data is kept apart, in the fitted state."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    horizon_h: Annotated[float, Field(gt=0, le=24 * 365)]
    window_h: Annotated[float, Field(gt=0, le=24 * 365)]
    blocks: Annotated[int, Field(ge=1, le=32)] = 4
    bins: Annotated[int, Field(ge=2, le=64)] = 16
    block_stats: tuple[Statistic, ...] = ("mean",)
    window_stats: tuple[Statistic, ...] = ("slope", "std")
    scaling: Literal["machine", "fleet"] = "machine"
    daily_profile: bool = False
    residual: bool = False
    # Look for operating regimes (models.edge.regimes) in the training rows; kept only where the readings fall into
    # tight clusters (C-MAPSS FD004 of the quality suite, none of its other fleets). Off here so that tokenizers saved
    # before the setting load as they were; TrainSettings turns it on.
    regimes: bool = False
    # Statistics see only the rows after the window's latest failure (models.edge.features.blank_before_failure). Off
    # here so that tokenizers saved before the setting load as they were; TrainSettings.restart_at_failure turns it on.
    restart_at_failure: bool = False
    # For a model with a value channel: each "hours since" token (a part's maintenance, the last failure) also carries
    # its hours (age_value), so the model sees the age and not only its bin, as the trees do. Off here so that
    # tokenizers saved before the setting load as they were.
    age_values: bool = False
    max_length: Annotated[int, Field(ge=8, le=8192)] = 256
    event_lookback_h: Annotated[float, Field(ge=0)] = 72.0
    max_recent_errors: Annotated[int, Field(ge=0, le=64)] = 4
    max_events_per_block: Annotated[int, Field(ge=0, le=64)] = 4
    min_machine_rows: Annotated[int, Field(ge=2)] = 50

    @model_validator(mode="after")
    def _some_statistic(self) -> TokenizerSettings:
        if not self.block_stats and not self.window_stats:
            raise ValueError("block_stats and window_stats are both empty: the model would see no sensor values")
        return self

    @property
    def horizon_token(self) -> str:
        return f"<horizon:{self.horizon_h:g}h>"


@dataclass(frozen=True)
class AttributeCoding:
    """How one static attribute becomes a token: by value (``values``) or by quantile bin (``edges``)."""

    key: str
    values: tuple[str, ...] = ()
    edges: tuple[float, ...] | None = None

    def token(self, value: str | None) -> str:
        if value is not None and self.edges is not None:
            number = _as_float(value)
            if number is not None:
                return f"attr:{_clean(self.key)}#{int(np.searchsorted(self.edges, number, side='right'))}"
        elif value is not None and _clean(value) in self.values:
            return f"attr:{_clean(self.key)}={_clean(value)}"
        return f"attr:{_clean(self.key)}=?"

    def vocabulary(self) -> list[str]:
        name = _clean(self.key)
        if self.edges is not None:
            own = [f"attr:{name}#{b}" for b in range(len(self.edges) + 1)]
        else:
            own = [f"attr:{name}={v}" for v in self.values]
        return [*own, f"attr:{name}=?"]


@dataclass(frozen=True)
class FittedState:
    """What a tokenizer learned from training data."""

    scaling: SensorScaling
    edges: Mapping[str, tuple[tuple[float, ...], ...]]  # "mean" / "wslope" -> per sensor, ascending bin edges
    failure_kinds: tuple[str, ...]  # named kinds; the unnamed "failure" is always an outcome too
    attributes: tuple[AttributeCoding, ...]
    maintenance_parts: tuple[str, ...]
    error_codes: tuple[str, ...]


class TelemetryTokenizer:
    """Windows to token ids. Fit on training windows, then :meth:`encode` any window (edge and cloud alike).

    >>> tok = TelemetryTokenizer(TokenizerSettings(horizon_h=24, window_h=6))
    >>> tok.is_fitted
    False
    """

    def __init__(self, settings: TokenizerSettings) -> None:
        self.settings = settings
        self._state: FittedState | None = None
        self._hf: Tokenizer | None = None
        self._vocab: dict[str, int] = {}

    # --- fitting --------------------------------------------------------------------------------------------------

    def fit(
        self,
        windows: Sequence[Window],
        failure_kinds: Iterable[str] = (),
        *,
        outcomes: Sequence[str] | None = None,
        attribute_min_machines: int = ATTRIBUTE_MIN_MACHINES,
    ) -> None:
        """Learn sensors, scaling, bins and context vocabularies from training windows.

        ``failure_kinds``: the failure kinds training labels use (``"failure"`` for unnamed ones). ``outcomes``: each
        window's label (``"ok"`` or a kind), when known; then the bins are class-balanced quantiles, half of them
        spent where failed windows lie, so the tokens resolve the range where the decision is made rather than
        only the healthy bulk of the data. ``attribute_min_machines``: the fewest training machines any combination
        of attribute tokens may single out (the attributes kept are in the fitted state, so loading needs no rule).
        """
        if not windows:
            raise TokenizerError("fit needs at least one training window")
        if outcomes is not None and len(outcomes) != len(windows):
            raise TokenizerError(f"fit got {len(outcomes)} outcomes for {len(windows)} windows")
        if attribute_min_machines < 1:
            raise TokenizerError(f"attribute_min_machines={attribute_min_machines}: must be at least 1")
        s = self.settings
        try:
            scaling = fit_scaling(
                windows,
                per_machine=s.scaling == "machine",
                min_machine_rows=s.min_machine_rows,
                daily_profile=s.daily_profile,
                residual=s.residual,
                regimes=s.regimes,
            )
        except ValueError as err:
            raise TokenizerError(str(err)) from None
        informative = scaling.sensors
        edges = self._fit_edges(windows, scaling, outcomes)
        kinds = sorted({k for k in [*failure_kinds, *(outcomes or ())] if k not in (OK, ANY_FAILURE)})
        for w in windows:
            kinds.extend(e.detail for e in w.events if e.kind == "failure" and e.detail)
        state = FittedState(
            scaling=scaling,
            edges=edges,
            failure_kinds=tuple(sorted(set(kinds))),
            attributes=_fit_attributes(windows, attribute_min_machines),
            maintenance_parts=tuple(
                sorted({e.detail for w in windows for e in w.events if e.kind == "maintenance" and e.detail})
            ),
            error_codes=_frequent(
                (e.detail for w in windows for e in w.events if e.kind == "error" and e.detail), MAX_ERROR_CODES
            ),
        )
        self._install(state)
        fixed = self.fixed_length
        if fixed > s.max_length:
            context = self._context_length()
            self._state, self._hf, self._vocab = None, None, {}  # not a usable tokenizer: stay unfitted
            raise SequenceTooLongError(
                f"the fixed part of a sequence is {fixed} tokens ({len(informative)} sensors x "
                f"({s.blocks} blocks x {len(s.block_stats)} block_stats + {len(s.window_stats)} window_stats) plus "
                f"context), more than max_length={s.max_length}: use fewer blocks or statistics, or a larger "
                "max_length",
                sensors=len(informative),
                context=context,
            )

    def _fit_edges(
        self, windows: Sequence[Window], scaling: SensorScaling, outcomes: Sequence[str] | None
    ) -> dict[str, tuple[tuple[float, ...], ...]]:
        s = self.settings
        step = max(1, math.ceil(len(windows) / MAX_FIT_WINDOWS))
        picked = range(0, len(windows), step)
        failed = np.array([outcomes is not None and outcomes[i] != OK for i in picked])
        # Each class carries half the weight (when both are present): quantiles of a balanced sample.
        weight = np.ones(len(failed))
        if failed.any() and not failed.all():
            weight = np.where(failed, 0.5 / failed.sum(), 0.5 / (~failed).sum())
        samples: dict[str, list[np.ndarray]] = {}
        weights: dict[str, list[np.ndarray]] = {}
        for i, w in zip(picked, weight, strict=True):
            for name, stats in self._statistics(windows[i], scaling).items():
                samples.setdefault(name, []).append(stats)
                weights.setdefault(name, []).append(np.full(len(stats), w))
        edges: dict[str, tuple[tuple[float, ...], ...]] = {}
        for name, parts in samples.items():
            data = np.concatenate(parts)  # (n, S)
            row_weight = np.concatenate(weights[name])  # (n,)
            edges[name] = tuple(
                tuple(float(v) for v in _weighted_edges(data[:, j], row_weight, s.bins)) for j in range(data.shape[1])
            )
        return edges

    def _statistics(self, window: Window, scaling: SensorScaling) -> dict[str, np.ndarray]:
        """Statistic key -> ``(n, S)``: block statistics as ``mean`` etc. (n = blocks), window ones as ``wmean``."""
        s = self.settings
        values = self._scaled(window, scaling)
        end_s = int(window.end.timestamp())
        window_s = s.window_h * HOUR_S
        out: dict[str, np.ndarray] = {}
        if s.block_stats:
            per_block = block_statistics(
                values, window.timestamps, end_s=end_s, window_s=window_s, blocks=s.blocks, stats=s.block_stats
            )
            out.update({stat: per_block[stat] for stat in s.block_stats})
        if s.window_stats:
            whole = block_statistics(
                values, window.timestamps, end_s=end_s, window_s=window_s, blocks=1, stats=s.window_stats
            )
            out.update({f"w{stat}": whole[stat] for stat in s.window_stats})
        return out

    def _scaled(self, window: Window, scaling: SensorScaling) -> np.ndarray:
        return statistics_input(window, scaling, restart_at_failure=self.settings.restart_at_failure)

    # --- vocabulary -----------------------------------------------------------------------------------------------

    def _install(self, state: FittedState) -> None:
        self._state = state
        tokens = self._vocabulary(state)
        self._vocab = {t: i for i, t in enumerate(tokens)}
        hf = Tokenizer(WordLevel(self._vocab, unk_token=UNK))
        hf.pre_tokenizer = WhitespaceSplit()
        self._hf = hf
        self._sensor_ids = self._sensor_id_table(state)
        self._is_statistic = np.zeros(len(tokens), dtype=bool)
        for table in self._sensor_ids.values():
            self._is_statistic[table] = True
        self._edge_table = {
            key: np.array(
                [list(e) + [np.inf] * (self.settings.bins - 1 - len(e)) for e in edges], dtype=np.float64
            ).reshape(len(edges), self.settings.bins - 1)
            for key, edges in state.edges.items()
        }
        self._install_id_tables(state)

    def _install_id_tables(self, state: FittedState) -> None:
        """Token ids :meth:`encode` needs, looked up once here rather than as text for every window."""
        s, vocab = self.settings, self._vocab
        self._bos_id = vocab[BOS]
        self._horizon_token_id = vocab[s.horizon_token]
        self._trend_id = vocab[TREND]
        self._block_ids = [vocab[f"<b{b}>"] for b in range(s.blocks)]
        self._tod_ids = [vocab[f"tod:{h}"] for h in range(HOUR_OF_DAY_BUCKETS)]
        self._lastfail_ids = [vocab[f"lastfail#a{b:02d}"] for b in range(len(AGE_EDGES_H) + 1)]
        self._lastfail_never = vocab["lastfail=never"]
        self._maintenance_ids = [
            ([vocab[f"maint:{part}#a{b:02d}"] for b in range(len(AGE_EDGES_H) + 1)], vocab[f"maint:{part}=never"])
            for part in state.maintenance_parts
        ]
        self._is_age = np.zeros(len(vocab), dtype=bool)  # the tokens of a known age (not the "=never" ones)
        self._is_age[self._lastfail_ids] = True
        for aged, _ in self._maintenance_ids:
            self._is_age[aged] = True
        self._attribute_ids: dict[tuple[str | None, ...], list[int]] = {}
        # Every statistic row of a window stacked: each block statistic once per block, then the window statistics.
        # One comparison and one lookup then bin all of them.
        row_keys = [key for key in s.block_stats for _ in range(s.blocks)] + [f"w{key}" for key in s.window_stats]
        n_sensors = len(state.scaling.sensors)
        self._row_edges = np.stack([self._edge_table[key] for key in row_keys])  # (R, S, bins - 1)
        self._row_ids = np.stack([self._sensor_ids[key] for key in row_keys]).reshape(-1)  # (R * S * (bins + 1),)
        self._row_base = (np.arange(len(row_keys) * n_sensors) * (s.bins + 1)).reshape(len(row_keys), n_sensors)

    def _vocabulary(self, state: FittedState) -> list[str]:
        s = self.settings
        tokens = [PAD, UNK, BOS, s.horizon_token, outcome_token(OK), outcome_token(ANY_FAILURE)]
        tokens += [outcome_token(k) for k in state.failure_kinds]
        tokens += [f"<next:{b}>" for b in range(len(TIME_TO_FAILURE_FRACTIONS) + 1)] + ["<next:?>"]
        tokens += [f"<b{b}>" for b in range(s.blocks)] + [TREND]
        tokens += [f"tod:{h}" for h in range(HOUR_OF_DAY_BUCKETS)]
        tokens += [t for a in state.attributes for t in a.vocabulary()]
        for part in state.maintenance_parts:
            tokens += [f"maint:{part}#a{b:02d}" for b in range(len(AGE_EDGES_H) + 1)] + [f"maint:{part}=never"]
        tokens += [f"lastfail#a{b:02d}" for b in range(len(AGE_EDGES_H) + 1)] + ["lastfail=never"]
        tokens += [f"err:{c}" for c in state.error_codes] + ["err:?"]
        tokens += [f"ev:error:{c}" for c in state.error_codes] + ["ev:error:?"]
        tokens += [f"ev:maintenance:{p}" for p in state.maintenance_parts] + ["ev:maintenance:?"]
        tokens += ["ev:failure", *(f"ev:failure:{k}" for k in state.failure_kinds), "ev:failure:?", "ev:anomaly"]
        for key in self._statistic_keys():
            for sensor in state.scaling.sensors:
                tokens += [f"{sensor}:{key}{b:02d}" for b in range(s.bins)] + [f"{sensor}:{key}_"]
        if len(set(tokens)) != len(tokens):
            duplicated = sorted(t for t, n in Counter(tokens).items() if n > 1)
            raise TokenizerError(f"token names collide: {duplicated[:5]} (rename the sensors or parts involved)")
        return tokens

    def _statistic_keys(self) -> list[str]:
        return [*self.settings.block_stats, *(f"w{stat}" for stat in self.settings.window_stats)]

    def _sensor_id_table(self, state: FittedState) -> dict[str, np.ndarray]:
        """Statistic key -> ``(S, bins + 1)`` token ids; the last column is the "missing" token."""
        table = {}
        for key in self._statistic_keys():
            table[key] = np.array(
                [
                    [self._vocab[f"{sensor}:{key}{b:02d}"] for b in range(self.settings.bins)]
                    + [self._vocab[f"{sensor}:{key}_"]]
                    for sensor in state.scaling.sensors
                ],
                dtype=np.int64,
            )
        return table

    # --- encoding -------------------------------------------------------------------------------------------------

    @property
    def is_fitted(self) -> bool:
        return self._state is not None

    @property
    def state(self) -> FittedState:
        if self._state is None:
            raise TokenizerError("the tokenizer is not fitted: call fit(windows) or TelemetryTokenizer.load(dir)")
        return self._state

    @property
    def vocab_size(self) -> int:
        self.state  # noqa: B018 -- raises a clear error when not fitted
        return len(self._vocab)

    @property
    def sensors(self) -> tuple[str, ...]:
        return self.state.scaling.sensors

    @property
    def pad_id(self) -> int:
        return self._vocab[PAD] if self._vocab else 0

    @property
    def bos_id(self) -> int:
        return self._vocab[BOS]

    @property
    def horizon_id(self) -> int:
        return self._vocab[self.settings.horizon_token]

    @property
    def body_start_ids(self) -> frozenset[int]:
        """Ids that open a window's body, after the context: the first block marker, or ``<trend>``."""
        return frozenset({self._vocab["<b0>"], self._vocab[TREND]})

    @property
    def outcome_tokens(self) -> dict[str, int]:
        """``"ok"``, ``"failure"`` (unnamed or any kind) and each named failure kind -> its token id."""
        kinds = [OK, ANY_FAILURE, *self.state.failure_kinds]
        return {k: self._vocab[outcome_token(k)] for k in kinds}

    def time_to_failure_token(self, hours: float | None) -> str:
        """``<next:B>``: the bucket of hours to the machine's next failure (``<next:?>`` when unknown).

        Training asks for it after the outcome token, so the model learns how near a failure is, not only whether
        it falls inside the horizon; scoring never reads it.
        """
        if hours is None:
            return "<next:?>"
        edges = np.array(TIME_TO_FAILURE_FRACTIONS) * self.settings.horizon_h
        return f"<next:{int(np.searchsorted(edges, hours, side='right'))}>"

    def time_to_failure_id(self, hours: float | None) -> int:
        self.state  # noqa: B018 -- raises a clear error when not fitted
        return self._vocab[self.time_to_failure_token(hours)]

    def outcome_id(self, outcome: str) -> int:
        """The token id of a label (``"ok"``, ``"failure"`` or a kind); a kind unseen in training counts as unnamed."""
        tokens = self.outcome_tokens
        return tokens.get(outcome, tokens[ANY_FAILURE])

    @property
    def fixed_length(self) -> int:
        """Tokens every sequence has, whatever its events: the budget left over goes to events and errors."""
        return self.fixed_length_under(self.settings)

    def fixed_length_under(self, s: TokenizerSettings) -> int:
        """:attr:`fixed_length` under other settings (blocks, statistics) over the sensors and context fitted here:
        whether another tokenizer of the same windows would fit ``max_length``, without fitting it."""
        return fixed_length_of(len(self.state.scaling.sensors), self._context_length(), s)

    def _context_length(self) -> int:
        state = self.state
        return 1 + len(state.attributes) + len(state.maintenance_parts) + 1 + 1  # bos, attrs, parts, lastfail, tod

    def encode(self, window: Window) -> list[int]:
        """The window as token ids, at most ``max_length`` long, ending with the horizon token.

        The same ids as :meth:`_encode_plain` (the token-text path, kept as the reference and tested against), made
        from id tables filled at fit or load time: the edge encodes every window, and text costs time there. One
        window is a batch of one (:meth:`encode_many`): one fast path, not two.
        """
        return self._encode_batch([window])[0][0]

    def encode_many(self, windows: Iterable[Window]) -> list[list[int]]:
        """:meth:`encode` of each window, the same ids, with the statistics of evenly sampled windows of one length
        worked out together (see :func:`models.edge.features.even_block_statistics`) and binned together: numpy's cost
        per call is most of a window's, and the edge scores windows in batches."""
        windows = list(windows)
        out: list[list[int]] = []
        for start in range(0, len(windows), ENCODE_BATCH):
            out += self._encode_batch(windows[start : start + ENCODE_BATCH])[0]
        return out

    def encode_with_values(self, windows: Iterable[Window]) -> ValuedSequences:
        """:meth:`encode_many`'s ids, and beside each id the value its token stands for (see :func:`token_value`):
        the statistic a bin token was cut from, 0 for every other token. A model with a value channel reads both, so
        it sees where in its bin a reading lies, and how far past the last edge a tail bin's reading went."""
        windows = list(windows)
        out = ValuedSequences([], [])
        for start in range(0, len(windows), ENCODE_BATCH):
            ages: list[np.ndarray] | None = [] if self.settings.age_values else None
            ids, stacked = self._encode_batch(windows[start : start + ENCODE_BATCH], ages)
            out.ids.extend(ids)
            for i, (seq, rows) in enumerate(zip(ids, stacked, strict=True)):
                values = self._values_along(seq, rows)
                if ages is not None:
                    values[self._is_age[np.asarray(seq, dtype=np.int64)]] = ages[i]
                out.values.append(values)
        return out

    def _values_along(self, ids: Sequence[int], stacked: np.ndarray) -> np.ndarray:
        """The values ``(L,)`` float32 beside one sequence's ids: each statistic token gets its statistic, in the
        order :meth:`_assemble` lays the tokens out; the rest get 0."""
        s = self.settings
        n_block_stats, n_sensors = len(s.block_stats), stacked.shape[1]
        parts = []
        if n_block_stats:
            per_block = stacked[: n_block_stats * s.blocks].reshape(n_block_stats, s.blocks, n_sensors)
            parts.append(per_block.transpose(1, 2, 0).reshape(-1))
        if s.window_stats:
            parts.append(stacked[n_block_stats * s.blocks :].T.reshape(-1))
        seq = np.asarray(ids, dtype=np.int64)
        out = np.zeros(len(seq), dtype=np.float32)
        out[self._is_statistic[seq]] = token_value(np.concatenate(parts))
        return out

    def _encode_batch(
        self, windows: Sequence[Window], ages: list[np.ndarray] | None = None
    ) -> tuple[list[list[int]], np.ndarray]:
        """The windows' ids and their statistics; given ``ages``, each window's known ages are appended to it
        (:meth:`_head_ids`)."""
        s, state = self.settings, self.state
        window_s = s.window_h * HOUR_S
        keys = self._statistic_keys()
        stacked: list[np.ndarray | None] = [None] * len(windows)
        groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}  # rows -> (index, values, hours)
        for i, window in enumerate(windows):
            end_s = int(window.end.timestamp())
            rows = window_rows(window.timestamps, end_s, window_s)
            t_all = window.timestamps[rows].astype(np.float64)
            if len(t_all) and evenly_filled(t_all, end_s=end_s, window_s=window_s, blocks=s.blocks):
                values = self._scaled(window, state.scaling)[rows]
                groups.setdefault(len(t_all), []).append((i, values, t_all / HOUR_S))
            else:
                stats = self._statistics(window, state.scaling)
                stacked[i] = np.concatenate([stats[key] for key in keys])
        for members in groups.values():
            x = np.ascontiguousarray(np.stack([values for _, values, _ in members]))  # (W, n, S)
            hours = np.stack([h for _, _, h in members])  # (W, n)
            parts: dict[str, np.ndarray] = {}
            if s.block_stats:
                parts.update(even_block_statistics(x, hours, blocks=s.blocks, stats=s.block_stats))
            if s.window_stats:
                whole = even_block_statistics(x, hours, blocks=1, stats=s.window_stats)
                parts.update({f"w{stat}": whole[stat] for stat in s.window_stats})
            rows_of = np.concatenate([parts[key] for key in keys], axis=1)  # (W, R, S)
            for k, (i, _, _) in enumerate(members):
                stacked[i] = rows_of[k]
        rows = np.stack(stacked)  # type: ignore[arg-type]
        ids = self._binned_ids(rows)
        return [
            self._assemble(*self._head_ids(window, ages), sensor_ids)
            for window, sensor_ids in zip(windows, ids, strict=True)
        ], rows

    def _head_ids(self, window: Window, ages: list[np.ndarray] | None = None) -> tuple[list[int], list[list[str]]]:
        """The context's ids (up to the recent errors), and the event tokens of each block. Given ``ages``, the
        values of the "hours since" tokens of a known age are appended to it, in their order (:func:`age_value`)."""
        s, state, vocab = self.settings, self.state, self._vocab
        context = window_context(window, window_h=s.window_h, blocks=s.blocks, event_lookback_h=s.event_lookback_h)
        ids = [self._bos_id, *self._attributes_as_ids(window.attributes)]
        for (aged, never), part in zip(self._maintenance_ids, state.maintenance_parts, strict=True):
            age = context.hours_since_maintenance.get(part)
            ids.append(never if age is None else aged[bisect.bisect_right(AGE_EDGES_H, age)])
        failure_age = context.hours_since_failure
        ids.append(
            self._lastfail_never
            if failure_age is None
            else self._lastfail_ids[bisect.bisect_right(AGE_EDGES_H, failure_age)]
        )
        ids.append(self._tod_ids[context.hour_of_day * HOUR_OF_DAY_BUCKETS // 24])
        if ages is not None:
            known = [context.hours_since_maintenance.get(part) for part in state.maintenance_parts] + [failure_age]
            ages.append(age_value(np.array([a for a in known if a is not None], dtype=np.float64)))

        if not (context.window_events or context.recent_errors):  # most windows have neither
            return ids, [[] for _ in range(s.blocks)]
        recent, events_by_block = self._event_tokens(context)
        ids += [vocab[t] for t in recent]
        return ids, events_by_block

    def _event_tokens(self, context: WindowContext) -> tuple[list[str], list[list[str]]]:
        """The recent-error tokens and each block's event tokens, trimmed oldest first until the sequence fits
        ``max_length``: recent errors before events inside the window."""
        s, state = self.settings, self.state
        events_by_block: list[list[str]] = [[] for _ in range(s.blocks)]
        for block, text in context.window_events:
            events_by_block[block].append(self._event_token(text))
        events_by_block = [b[-s.max_events_per_block :] if s.max_events_per_block else [] for b in events_by_block]
        recent = [f"err:{c}" if c in state.error_codes else "err:?" for c in context.recent_errors]
        recent = recent[-s.max_recent_errors :] if s.max_recent_errors else []
        budget = s.max_length - self.fixed_length
        while len(recent) + sum(len(b) for b in events_by_block) > budget:
            if recent:
                recent.pop(0)
            else:
                next(b for b in events_by_block if b).pop(0)
        return recent, events_by_block

    def _binned_ids(self, stacked: np.ndarray) -> np.ndarray:
        """Statistics ``(W, R, S)`` (rows as in ``_row_edges``) to their sensors' token ids, ``(W, R, S)``."""
        with np.errstate(invalid="ignore"):
            # The number of edges <= value: numpy's searchsorted(side="right"), for every row and sensor at once.
            bins = (stacked[..., None] >= self._row_edges).sum(axis=-1)
        bins = np.where(np.isfinite(stacked), bins, self.settings.bins)  # the last column is the "missing" token
        return self._row_ids[self._row_base + bins]  # type: ignore[no-any-return]

    def _assemble(self, ids: list[int], events_by_block: list[list[str]], sensor_ids: np.ndarray) -> list[int]:
        """The head's ids, then each block's statistic ids and events, the trend, the horizon."""
        s, vocab = self.settings, self._vocab
        n_sensors, n_block_stats = sensor_ids.shape[1], len(s.block_stats)
        if n_block_stats:
            per_block = (
                sensor_ids[: n_block_stats * s.blocks]
                .reshape(n_block_stats, s.blocks, n_sensors)
                .transpose(1, 2, 0)  # block, then sensor-major, as _encode_plain orders them
                .reshape(s.blocks, n_sensors * n_block_stats)
                .tolist()
            )
            for b in range(s.blocks):
                ids.append(self._block_ids[b])
                ids += per_block[b]
                if events_by_block[b]:
                    ids += [vocab[t] for t in events_by_block[b]]
        if s.window_stats:
            ids.append(self._trend_id)
            ids += sensor_ids[n_block_stats * s.blocks :].T.reshape(-1).tolist()
            if not n_block_stats:
                ids += [vocab[t] for block in events_by_block for t in block]
        ids.append(self._horizon_token_id)
        return ids

    def _attributes_as_ids(self, attributes: Mapping[str, str]) -> list[int]:
        codings = self.state.attributes
        if not codings:
            return []
        key = tuple(attributes.get(a.key) for a in codings)
        known = self._attribute_ids.get(key)
        if known is None:
            if len(self._attribute_ids) >= MAX_CACHED_ATTRIBUTE_SETS:
                self._attribute_ids.clear()  # a bound, not an eviction policy: machines' attributes rarely change
            known = self._attribute_ids[key] = [self._vocab[a.token(v)] for a, v in zip(codings, key, strict=True)]
        return known

    def _encode_plain(self, window: Window) -> list[int]:
        """:meth:`encode` the plain way, through token text: the reference the fast path is tested against."""
        return [self._vocab[t] if isinstance(t, str) else t for t in self._tokens(window)]

    def tokens(self, window: Window) -> list[str]:
        """The window as token text (for reading and debugging); ``encode`` gives the ids of these."""
        return self.decode(self.encode(window))

    def missing_ids(self) -> np.ndarray:
        """For each token id, the id of its sensor's "missing" token for the same statistic; -1 for other tokens.

        Training uses it to hide random readings (token dropout), so the model leans on no single sensor and has
        seen gaps like the ones real telemetry has.
        """
        out = np.full(self.vocab_size, -1, dtype=np.int64)
        for table in self._sensor_ids.values():  # (S, bins + 1): the last column is the missing token
            out[table[:, :-1]] = table[:, -1:]
        return out

    def sensor_token_ids(self) -> dict[str, np.ndarray]:
        """Statistic key (``mean``, ``wstd``, ...) -> ``(S, bins + 1)`` token ids, sensors in :attr:`sensors` order,
        bins low to high; the last column is the "missing" token."""
        self.state  # noqa: B018 -- raises a clear error when not fitted
        return {key: table.copy() for key, table in self._sensor_ids.items()}

    def ordinal_families(self) -> list[list[int]]:
        """Token ids that name ordered bins of one quantity, each family low to high: every sensor statistic's value
        bins, and the age bins of each maintained part and of the last failure.

        A fresh model starts these embeddings along a line (:func:`models.training.model.init_ordinal_embeddings`), so
        bin 7 begins between bins 6 and 8 instead of at a random point, and rare tail bins borrow from their neighbours.
        """
        families = [row[:-1].tolist() for table in self._sensor_ids.values() for row in table]
        families += [ids for ids, _never in self._maintenance_ids]
        families.append(list(self._lastfail_ids))
        return families

    def vocabulary_tokens(self) -> list[str]:
        """Every token, in id order."""
        self.state  # noqa: B018 -- raises a clear error when not fitted
        return sorted(self._vocab, key=self._vocab.__getitem__)

    def decode(self, ids: Sequence[int]) -> list[str]:
        self.state  # noqa: B018 -- raises a clear error when not fitted
        assert self._hf is not None
        return [self._hf.id_to_token(int(i)) or UNK for i in ids]

    def _tokens(self, window: Window) -> list[str | int]:
        s, state = self.settings, self.state
        context = window_context(window, window_h=s.window_h, blocks=s.blocks, event_lookback_h=s.event_lookback_h)
        head: list[str | int] = [BOS]
        head += [a.token(window.attributes.get(a.key)) for a in state.attributes]
        for part in state.maintenance_parts:
            age = context.hours_since_maintenance.get(part)
            head.append(f"maint:{part}=never" if age is None else f"maint:{part}#a{_age_bin(age):02d}")
        failure_age = context.hours_since_failure
        head.append("lastfail=never" if failure_age is None else f"lastfail#a{_age_bin(failure_age):02d}")
        head.append(f"tod:{context.hour_of_day * HOUR_OF_DAY_BUCKETS // 24}")

        recent, events_by_block = self._event_tokens(context)
        head += recent

        stats = self._statistics(window, state.scaling)
        ids: dict[str, np.ndarray] = {}
        for key, values in stats.items():
            edges = self._edge_table[key]  # (S, bins - 1), padded with +inf
            with np.errstate(invalid="ignore"):
                # The number of edges <= value: numpy's searchsorted(side="right"), for every sensor at once.
                bins = (values[:, :, None] >= edges[None, :, :]).sum(axis=2)  # (n, S)
            bins = np.where(np.isfinite(values), bins, s.bins)  # the last column is the "missing" token
            ids[key] = self._sensor_ids[key][np.arange(values.shape[1])[None, :], bins]  # (n, S)

        body: list[str | int] = []
        for b in range(s.blocks if s.block_stats else 0):
            body.append(f"<b{b}>")
            per_sensor = np.stack([ids[stat][b] for stat in s.block_stats], axis=1)  # (S, K): sensor-major
            body += per_sensor.reshape(-1).tolist()
            body += events_by_block[b]
        if s.window_stats:
            body.append(TREND)
            body += np.stack([ids[f"w{stat}"][0] for stat in s.window_stats], axis=1).reshape(-1).tolist()
            if not s.block_stats:
                body += [e for block in events_by_block for e in block]
        return [*head, *body, s.horizon_token]

    def _event_token(self, text: str) -> str:
        state = self.state
        kind, _, detail = text.partition(":")
        if kind == "error":
            return f"ev:error:{detail}" if detail in state.error_codes else "ev:error:?"
        if kind == "maintenance":
            return f"ev:maintenance:{detail}" if detail in state.maintenance_parts else "ev:maintenance:?"
        if kind == "failure":
            if not detail:
                return "ev:failure"
            return f"ev:failure:{detail}" if detail in state.failure_kinds else "ev:failure:?"
        return "ev:anomaly"

    # --- persistence ----------------------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """The ``tokenizer_config.json`` content: Hugging Face's usual keys plus our settings and fitted state."""
        state = self.state
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": self.settings.max_length,
            "pad_token": PAD,
            "unk_token": UNK,
            "bos_token": BOS,
            "padding_side": "right",
            "truncation_side": "left",
            CONFIG_KEY: {
                "format": FORMAT,
                "settings": self._settings_json(),
                "scaling": state.scaling.to_json(),
                "edges": {k: [list(e) for e in v] for k, v in sorted(state.edges.items())},
                "failure_kinds": list(state.failure_kinds),
                "attributes": [
                    {"key": a.key, "values": list(a.values), "edges": None if a.edges is None else list(a.edges)}
                    for a in state.attributes
                ],
                "maintenance_parts": list(state.maintenance_parts),
                "error_codes": list(state.error_codes),
            },
        }

    def _settings_json(self) -> dict[str, Any]:
        settings = self.settings.model_dump(mode="json")
        for name in SETTINGS_WRITTEN_WHEN_ON:
            if not settings[name]:
                # Settings added since FORMAT was fixed are written only when on: a tokenizer saved before them
                # then keeps its bytes and its content hash.
                del settings[name]
        return settings

    @property
    def content_hash(self) -> str:
        """sha256 of the vocabulary and everything in the config: equal hashes, equal tokenization."""
        assert self._hf is not None or self.state
        payload = json.dumps(
            {"vocab": sorted(self._vocab.items(), key=lambda kv: kv[1]), "config": self.config()},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    @property
    def version(self) -> str:
        """A short name for the content hash, for logs and model metadata."""
        return f"tok-{self.content_hash[:12]}"

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (created if needed)."""
        self.state  # noqa: B018 -- raises a clear error when not fitted
        assert self._hf is not None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._hf.save(str(directory / TOKENIZER_FILE))
        config = self.config()
        config[CONFIG_KEY]["content_hash"] = self.content_hash
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> TelemetryTokenizer:
        """Read a saved tokenizer; refuses files whose vocabulary or hash do not match the config."""
        directory = Path(directory)
        config_path, tokenizer_path = directory / CONFIG_FILE, directory / TOKENIZER_FILE
        for path in (config_path, tokenizer_path):
            if not path.is_file():
                raise TokenizerError(f"{path}: no such file (a saved tokenizer has {TOKENIZER_FILE} and {CONFIG_FILE})")
        try:
            data = json.loads(config_path.read_text())[CONFIG_KEY]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise TokenizerError(f"{config_path}: not a telemetry tokenizer config ({err!r})") from None
        if data.get("format") != FORMAT:
            raise TokenizerError(f"{config_path}: format={data.get('format')!r}, expected {FORMAT!r}")
        try:
            settings = TokenizerSettings.model_validate(data["settings"])
            state = FittedState(
                scaling=SensorScaling.from_json(data["scaling"]),
                edges={k: tuple(tuple(float(x) for x in e) for e in v) for k, v in data["edges"].items()},
                failure_kinds=tuple(data["failure_kinds"]),
                attributes=tuple(
                    AttributeCoding(
                        key=a["key"],
                        values=tuple(a["values"]),
                        edges=None if a["edges"] is None else tuple(float(x) for x in a["edges"]),
                    )
                    for a in data["attributes"]
                ),
                maintenance_parts=tuple(data["maintenance_parts"]),
                error_codes=tuple(data["error_codes"]),
            )
        except (ValidationError, KeyError, TypeError, ValueError) as err:
            raise TokenizerError(f"{config_path}: invalid tokenizer config: {err}") from None
        tokenizer = cls(settings)
        tokenizer._install(state)
        saved_vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab()
        if saved_vocab != tokenizer._vocab:
            raise TokenizerError(f"{tokenizer_path}: its vocabulary does not match {config_path}")
        expected = data.get("content_hash")
        if expected is not None and expected != tokenizer.content_hash:
            raise TokenizerError(
                f"{config_path}: content_hash={expected!r} does not match its content ({tokenizer.content_hash!r})"
            )
        return tokenizer


# --- helpers ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValuedSequences:
    """Token ids and, beside each id, its value (float32, as long): :meth:`TelemetryTokenizer.encode_with_values`."""

    ids: list[list[int]]
    values: list[np.ndarray]


def token_value(statistic: np.ndarray) -> np.ndarray:
    """The value a statistic token carries: the scaled statistic on a log scale past 1, ``sign(x) * log1p(|x|)``, and 0
    where it is missing (its token says so).

    Why the log: readings are scaled to about unit spread, and a spike can be a hundred of those; the log keeps a
    spike's size readable without letting one reading swamp the token's embedding.

    >>> [round(float(v), 3) for v in token_value(np.array([0.0, 1.0, -99.0, np.nan]))]
    [0.0, 0.693, -4.605, 0.0]
    """
    x = np.asarray(statistic, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = np.sign(x) * np.log1p(np.abs(x))
    return np.where(np.isfinite(out), out, 0.0).astype(np.float32)


def age_value(hours: np.ndarray) -> np.ndarray:
    """The value an "hours since" token carries: days on a log scale, ``log1p(hours / 24)`` (0 for now, 5.9 for a
    year), so a week and a month differ as much as their bins do, in the statistics' range of values.

    >>> [round(float(v), 3) for v in age_value(np.array([0.0, 24.0, 24 * 365.0]))]
    [0.0, 0.693, 5.903]
    """
    return np.log1p(np.maximum(np.asarray(hours, dtype=np.float64), 0.0) / 24.0).astype(np.float32)


def _weighted_edges(values: np.ndarray, weights: np.ndarray, bins: int) -> np.ndarray:
    """Ascending, distinct edges at the ``k / bins`` weighted quantiles of the finite values.

    >>> _weighted_edges(np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4), 2).tolist()
    [2.5]
    """
    seen = np.isfinite(values)
    x, w = values[seen], weights[seen]
    if len(x) == 0:
        return np.zeros(0)
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    position = (np.cumsum(w) - 0.5 * w) / w.sum()  # each value sits at the middle of its weight
    return np.unique(np.interp(np.arange(1, bins) / bins, position, x))


def _age_bin(hours: float) -> int:
    return int(np.searchsorted(AGE_EDGES_H, hours, side="right"))


def _clean(value: str) -> str:
    """An attribute value as token text: whitespace would split the token, so it becomes ``_``."""
    return "_".join(str(value).split())


def _as_float(value: str) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _frequent(items: Iterable[str], limit: int) -> tuple[str, ...]:
    counts = Counter(items)
    return tuple(sorted(k for k, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]))


def _fit_attributes(windows: Sequence[Window], min_machines: int) -> tuple[AttributeCoding, ...]:
    """Attributes worth a token: more than one value in training, and, together, not singling out a machine.

    A model that can tell machines apart by their attribute tokens learns each one's own failure history by heart,
    and that history does not repeat in the next month. On the simulator's 30 machines, whose model, site, install
    year and age together named almost every machine, leaving the attributes out lifted test PR-AUC from 0.495 to
    0.536 (seed 0, the same split); keeping those that leave at least five machines to every combination (the model
    and its rated speed) scored 0.516 and 0.528 for seeds 0 and 1 (BENCHMARKS.md).

    So the attributes are taken coarsest first, and one is kept only if every combination of the kept attributes'
    tokens is still shared by at least ``min_machines`` training machines (k-anonymity): the model learns about kinds
    of machine, not about individuals. A large fleet keeps more attributes than a small one.
    """
    by_machine: dict[str, Mapping[str, str]] = {}
    for w in windows:
        by_machine.setdefault(w.machine_id, w.attributes)
    keys = sorted({k for attrs in by_machine.values() for k in attrs})
    # Numeric attributes in as many quantile bins as could each hold min_machines machines.
    numeric_bins = min(NUMERIC_ATTRIBUTE_BINS, len(by_machine) // min_machines)
    candidates = []
    for key in keys:
        values = [attrs[key] for attrs in by_machine.values() if attrs.get(key) not in (None, "")]
        distinct = set(values)
        if len(distinct) < 2:
            continue
        numbers = [_as_float(v) for v in values]
        if all(n is not None for n in numbers) and len(distinct) > numeric_bins:
            if numeric_bins < 2:
                continue
            cut = np.unique(np.quantile(np.array(numbers, dtype=np.float64), np.arange(1, numeric_bins) / numeric_bins))
            candidates.append(AttributeCoding(key=key, edges=tuple(float(x) for x in cut)))
        else:
            candidates.append(
                AttributeCoding(key=key, values=_frequent((_clean(v) for v in values), MAX_CATEGORICAL_VALUES))
            )

    def groups(codings: Sequence[AttributeCoding]) -> Counter[tuple[str, ...]]:
        return Counter(tuple(c.token(attrs.get(c.key)) for c in codings) for attrs in by_machine.values())

    kept: list[AttributeCoding] = []
    # Coarsest first; between equally coarse ones, a named value (a model) before a bin of a number (a year).
    for coding in sorted(candidates, key=lambda c: (len(groups([c])), c.edges is not None, c.key)):
        if min(groups([*kept, coding]).values()) >= min_machines:
            kept.append(coding)
    return tuple(sorted(kept, key=lambda c: c.key))
