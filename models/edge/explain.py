"""Why a prediction: the context that moved a window's risk most, found by occlusion on the model the edge runs.

Occlusion scores the window again with one piece of its context taken out, and calls the fall in risk that piece's
weight. What "taken out" means is chosen so that the window stays one the model knows, since a window it never saw
would move the risk for reasons of its own:

- **Tokens are replaced by the neutral token of their own slot, not removed.** The model reads absolute positions,
  so removing a token moves every later one. On the small models we measured, removing the hour-of-day token (which
  means nothing to them: replacing it by another hour moved the risk by 1e-4) moved the risk of true alerts by 0.15
  on average, as much as removing an error code did: an explanation by removal would name the shift.
- **a sensor**: each of its statistic tokens becomes that statistic's *missing* token (and its value 0, for a model
  with a value channel). Training hides random readings this very way (token dropout), so "this sensor said
  nothing" is familiar to the model, and neutral: it falls back on the other sensors and the context.
- **an error code**: two references, and the smaller drop counts. Its tokens (``err:C`` before the window,
  ``ev:error:C`` inside it) become the unknown code's (``err:?``, ``ev:error:?``), which keeps the positions but is a
  token training rarely shows; and they are taken out, which is a window training shows (how many errors a window
  has varies) but moves the positions. A code is a reason only where both say so.
- **a maintained part**: two references again, the smaller drop counting: its age becomes the bin of one horizon
  ("had it been serviced a horizon ago") or ``never``. Either alone can mislead: in a fleet serviced only after
  repairs, one horizon ago means "just repaired", and the risk falls for that; in one serviced every week, never is
  rare. Its maintenance events inside the window become ``ev:maintenance:?``.
- **the last failure**: its age becomes ``lastfail=never`` (no failure in the lookback: the usual case).
- **an attribute**: its token becomes the attribute's unknown value ``attr:K=?``.

Cost is bounded. Only the windows a caller asks about are explained (the edge: those at or above the alert
threshold). Stage one scores one variant per group: each sensor with a reading (at most ``max_sensors``, those whose
bins lie furthest from the middle first), each error code, part and attribute the window names, and its last
failure. Stage two scores the second reference of the leading candidates (a second reference can only lower a
drop, so the others cannot climb into the reasons by it) and, for the sensor that moved the risk most, one variant
per statistic (all blocks at once) and one per block (all statistics at once): the statistic that matters and the
block where it matters, so the reason can say "vibration_rms spread high over the last 6 h". Grouping first keeps
the variants few (sensors and groups, then statistics and blocks, rather than every token: 29 sequences per window
on the simulator's fleet of 7 sensors and 5 parts), and a sensor's tokens tell their story together where one token
alone may be redundant with its neighbours.

Each stage is one inference batch over every window explained together, each window's unoccluded sequence in the
same batch as its variants: dynamic int8 quantizes activations per batch, so a risk compared with one from another
batch could differ by about 1e-3 for no reason in the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from models.edge.features import WindowContext, window_context
from models.edge.runtime import LMScorer
from models.edge.scoring import Risk, Window
from models.edge.tokenizer import AGE_EDGES_H, TREND, TelemetryTokenizer, TokenizerSettings
from precursor.contracts.messages import MAX_REASONS, Reason, ReasonDetail

REMOVE = -1
"""A replacement that takes the token out (see the module's docstring for when)."""

STATISTIC_WORDS = {
    "mean": "level",
    "std": "spread",
    "slope": "trend",
    "last": "last reading",
    "min": "minimum",
    "max": "maximum",
}
"""How a reason names a statistic to a person."""


class ExplainSettings(BaseModel):
    """How many reasons, how small a drop still counts, and how many sensors stage one may try."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_reasons: Annotated[int, Field(ge=1, le=MAX_REASONS)] = 3
    min_log_odds_drop: Annotated[float, Field(ge=0, le=20)] = Field(
        0.1,
        description="a piece of context whose removal lowers the risk's log-odds by less is no reason (0.1: the odds "
        "fall by a tenth). On the log-odds scale, since a risk near 1 moves little in probability when one of two "
        "strong signs is hidden, but its odds still fall",
    )
    max_sensors: Annotated[int, Field(ge=1, le=1024)] = Field(
        32, description="sensors tried in stage one; more are ranked by how far their bins lie from the middle"
    )


@dataclass
class _Group:
    """One piece of context to take out: the edits that do it, and what a reason about it says."""

    kind: str  # sensor | event | context
    name: str
    tokens: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (position, its replacements)
    sensor: int | None = None
    hidden: list[tuple[int, int]] | None = None  # a sensor's one variant: (position, its missing token)

    def variants(self) -> list[list[tuple[int, int]]]:
        """The occluded versions of the window, as edits (position, new id): one, or one per reference where a
        token has two (a part's age); the group's drop is the smallest of theirs."""
        if self.hidden is not None:
            return [self.hidden]
        n = max(len(new) for _, new in self.tokens)
        return [[(pos, new[min(k, len(new) - 1)]) for pos, new in self.tokens] for k in range(n)]


class _Context:
    """A window's events in hours before its end (:func:`models.edge.features.window_context`), worked out the first
    time a reason about an event needs them, once per window."""

    def __init__(self, window: Window, settings: TokenizerSettings) -> None:
        self._window = window
        self._settings = settings

    @cached_property
    def value(self) -> WindowContext:
        s = self._settings
        return window_context(self._window, window_h=s.window_h, blocks=s.blocks, event_lookback_h=s.event_lookback_h)


@dataclass
class _Parsed:
    """One window's sequence, where each sensor's statistic tokens lie, and its stage-one groups."""

    window: Window
    ids: np.ndarray  # (L,) int64
    values: np.ndarray | None  # (L,) float32, for a model with a value channel
    kind: str  # the risk explained: the window's riskiest kind
    positions: dict[int, list[tuple[int, str, int | None]]]  # sensor -> (position, statistic key, block or None)
    groups: list[_Group]


class OcclusionExplainer:
    """Reasons for windows scored by an :class:`~models.edge.runtime.LMScorer` whose tokenizer is a
    :class:`~models.edge.tokenizer.TelemetryTokenizer` (see :func:`explainer_for`)."""

    def __init__(self, scorer: LMScorer, settings: ExplainSettings | None = None) -> None:
        tokenizer = scorer.tokenizer
        if not isinstance(tokenizer, TelemetryTokenizer):
            raise TypeError(f"occlusion needs a TelemetryTokenizer, not {type(tokenizer).__name__}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.settings = settings or ExplainSettings()
        s = tokenizer.settings
        self._window_h = s.window_h
        self._blocks = s.blocks
        self._bins = s.bins
        vocab = {t: i for i, t in enumerate(tokenizer.vocabulary_tokens())}
        size = len(vocab)
        # Per token id: its statistic key, sensor and bin (bins = missing), or -1 for other tokens.
        self._stat_key = np.full(size, -1, dtype=np.int64)
        self._stat_sensor = np.full(size, -1, dtype=np.int64)
        self._stat_bin = np.full(size, -1, dtype=np.int64)
        self._keys: list[str] = []
        self._missing: dict[tuple[int, int], int] = {}  # (key index, sensor) -> the missing token's id
        for k, (key, table) in enumerate(tokenizer.sensor_token_ids().items()):
            self._keys.append(key)
            for sensor, row in enumerate(table):
                self._stat_key[row] = k
                self._stat_sensor[row] = sensor
                self._stat_bin[row] = np.arange(len(row))
                self._missing[(k, sensor)] = int(row[-1])
        self._block_marker = {vocab[f"<b{b}>"]: b for b in range(s.blocks)}
        self._trend = vocab[TREND]
        # Per token id that names an event or an attribute: how to take it out, as (kind, group name, the id put in
        # its place). A part's age is set back to the bin one horizon old (see the module's docstring).
        fresh_bin = int(np.searchsorted(AGE_EDGES_H, s.horizon_h, side="right"))
        self._edit: dict[int, tuple[str, str, tuple[int, ...]]] = {}
        for text, i in vocab.items():
            if text.startswith("err:") and text != "err:?":
                self._edit[i] = ("event", "error:" + text[len("err:") :], (vocab["err:?"], REMOVE))
            elif text.startswith("ev:error:") and text != "ev:error:?":
                self._edit[i] = ("event", "error:" + text[len("ev:error:") :], (vocab["ev:error:?"], REMOVE))
            elif text.startswith("maint:"):
                part = text[len("maint:") :].split("#", 1)[0].split("=", 1)[0]
                references = (vocab[f"maint:{part}#a{fresh_bin:02d}"], vocab[f"maint:{part}=never"])
                self._edit[i] = ("event", f"maintenance:{part}", tuple(r for r in references if r != i))
            elif text.startswith("ev:maintenance:") and text != "ev:maintenance:?":
                part = text[len("ev:maintenance:") :]
                self._edit[i] = ("event", f"maintenance:{part}", (vocab["ev:maintenance:?"],))
            elif text.startswith("lastfail#"):
                self._edit[i] = ("event", "failure", (vocab["lastfail=never"],))
            elif text.startswith("attr:") and not text.endswith("=?"):
                key = text[len("attr:") :].split("#", 1)[0].split("=", 1)[0]
                self._edit[i] = ("context", key, (vocab[f"attr:{key}=?"],))

    # --- the two stages -------------------------------------------------------------------------------------------

    def explain_many(self, windows: Sequence[Window], risks: Sequence[Risk]) -> list[list[Reason]]:
        """The reasons of each window, largest risk drop first (none where nothing moved the risk's log-odds by
        ``min_log_odds_drop``), for the risk of its riskiest kind. Two inference batches, however many windows."""
        if len(windows) != len(risks):
            raise ValueError(f"explain_many got {len(risks)} risks for {len(windows)} windows")
        if not windows:
            return []
        parsed = self._parse(windows, risks)
        limit = self.settings.max_reasons
        # Stage one: every group's first variant.
        first = self._score([(p, [g.variants()[0] for g in p.groups], True) for p in parsed])
        plans: list[tuple[dict[int, float], float, list[_Group], list[tuple[str, str | int]]]] = []
        jobs: list[tuple[_Parsed, list[list[tuple[int, int]]], bool]] = []
        for p, (base, occluded) in zip(parsed, first, strict=True):
            drops = {id(g): base - r for g, r in zip(p.groups, occluded, strict=True)}
            floor = self._floor(base)
            ranked = sorted(p.groups, key=lambda g: -drops[id(g)])
            # A group's second reference can only lower its drop: only the leading candidates need one.
            seconds = [g for g in ranked[: limit + 2] if len(g.variants()) > 1 and base - drops[id(g)] <= floor]
            top = next((g.sensor for g in ranked if g.sensor is not None and base - drops[id(g)] <= floor), None)
            detail_edits, labels = self._detail_variants(p, top)
            plans.append((drops, base, seconds, labels))
            jobs.append((p, [*(g.variants()[1] for g in seconds), *detail_edits], bool(seconds)))
        # Stage two: those second references, and the top sensor's statistics and blocks.
        second = self._score(jobs)
        out = []
        for p, (drops, base, seconds, labels), (base_two, occluded) in zip(parsed, plans, second, strict=True):
            for g, r in zip(seconds, occluded[: len(seconds)], strict=True):
                drops[id(g)] = min(drops[id(g)], base_two - r)  # each drop against the base of its own batch
            # Statistics and blocks are only ranked against each other: the lower the risk without one, the more
            # it mattered.
            detail = {label: -r for label, r in zip(labels, occluded[len(seconds) :], strict=True)}
            floor = self._floor(base)
            kept = sorted((g for g in p.groups if base - drops[id(g)] <= floor), key=lambda g: -drops[id(g)])[:limit]
            top = next((g.sensor for g in kept if g.sensor is not None), None)
            context = _Context(p.window, self.tokenizer.settings)
            out.append([self._reason(p, g, drops[id(g)], detail if g.sensor == top else {}, context) for g in kept])
        return out

    def _floor(self, base: float) -> float:
        """The risk a variant must fall to for its group to be a reason: ``min_log_odds_drop`` below ``base``."""
        return _probability(_log_odds(base) - self.settings.min_log_odds_drop)

    def _parse(self, windows: Sequence[Window], risks: Sequence[Risk]) -> list[_Parsed]:
        tokenizer = self.tokenizer
        if self.scorer.takes_values:
            encoded = tokenizer.encode_with_values(windows)
            sequences: list[list[int]] = encoded.ids
            values: list[np.ndarray | None] = list(encoded.values)
        else:
            sequences = tokenizer.encode_many(windows)
            values = [None] * len(windows)
        return [
            self._parse_one(w, np.asarray(ids, dtype=np.int64), v, max(risk, key=lambda k: risk[k]))
            for w, ids, v, risk in zip(windows, sequences, values, risks, strict=True)
        ]

    def _parse_one(self, window: Window, ids: np.ndarray, values: np.ndarray | None, kind: str) -> _Parsed:
        positions: dict[int, list[tuple[int, str, int | None]]] = {}
        events: dict[tuple[str, str], _Group] = {}
        block: int | None = None
        for pos, i in enumerate(ids.tolist()):
            if i in self._block_marker:
                block = self._block_marker[i]
            elif i == self._trend:
                block = None
            elif self._stat_key[i] >= 0:
                key = self._keys[self._stat_key[i]]
                positions.setdefault(int(self._stat_sensor[i]), []).append(
                    (pos, key, None if key.startswith("w") else block)
                )
            elif i in self._edit:
                kind_, name, new = self._edit[i]
                events.setdefault((kind_, name), _Group(kind_, name)).tokens.append((pos, new))
        # A sensor with no reading in the window has nothing to take out.
        seen = [s for s, where in positions.items() if np.any(self._stat_bin[ids[[w[0] for w in where]]] < self._bins)]
        sensors = sorted(seen, key=lambda s: -self._extremeness(ids, positions[s]))[: self.settings.max_sensors]
        groups = [
            _Group("sensor", self.tokenizer.sensors[s], sensor=s, hidden=self._hide(ids, positions[s]))
            for s in sorted(sensors)
        ]
        groups += list(events.values())
        return _Parsed(window, ids, values, kind, positions, groups)

    def _extremeness(self, ids: np.ndarray, where: list[tuple[int, str, int | None]]) -> float:
        """How far a sensor's bins lie from the middle (missing counts as the middle): which sensors stage one tries
        first when there are more than ``max_sensors``."""
        bins = self._stat_bin[ids[[pos for pos, _, _ in where]]]
        middle = (self._bins - 1) / 2
        return float(np.max(np.where(bins == self._bins, 0.0, np.abs(bins - middle)), initial=0.0))

    def _hide(self, ids: np.ndarray, where: list[tuple[int, str, int | None]]) -> list[tuple[int, int]]:
        """Edits that turn these statistic tokens into their missing tokens."""
        out = []
        for pos, _key, _block in where:
            i = int(ids[pos])
            out.append((pos, self._missing[(int(self._stat_key[i]), int(self._stat_sensor[i]))]))
        return out

    def _detail_variants(
        self, p: _Parsed, sensor: int | None
    ) -> tuple[list[list[tuple[int, int]]], list[tuple[str, str | int]]]:
        """Stage two for one sensor: a variant per statistic key (its every block) and per block (its every
        statistic), labelled ``("key", key)`` and ``("block", b)``."""
        if sensor is None:
            return [], []
        where = p.positions[sensor]
        edits, labels = [], []
        for key in dict.fromkeys(key for _, key, _ in where):
            edits.append(self._hide(p.ids, [w for w in where if w[1] == key]))
            labels.append(("key", key))
        for b in sorted({b for _, _, b in where if b is not None}):
            edits.append(self._hide(p.ids, [w for w in where if w[2] == b]))
            labels.append(("block", b))
        return edits, labels

    def _score(self, jobs: list[tuple[_Parsed, list[list[tuple[int, int]]], bool]]) -> list[tuple[float, list[float]]]:
        """One batch: each job's variants, after its unoccluded sequence where the job asks for it; returns per job
        (base risk or NaN, variant risks) of the job's kind."""
        sequences: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for p, variants, with_base in jobs:
            for edits in [[]] * with_base + variants:
                ids, vals = _apply(p.ids, p.values, edits)
                sequences.append(ids)
                if vals is not None:
                    values.append(vals)
        if not sequences:
            return [(math.nan, []) for _ in jobs]
        risks = self.scorer.score_token_ids(
            [s.tolist() for s in sequences], values if self.scorer.takes_values else None, batch_size=len(sequences)
        )
        out, at = [], 0
        for p, variants, with_base in jobs:
            got = [r.get(p.kind, r.get("failure", 0.0)) for r in risks[at : at + with_base + len(variants)]]
            out.append((got[0], got[1:]) if with_base else (math.nan, got))
            at += with_base + len(variants)
        return out

    # --- words ----------------------------------------------------------------------------------------------------

    def _reason(
        self, p: _Parsed, group: _Group, drop: float, detail: dict[tuple[str, str | int], float], events: _Context
    ) -> Reason:
        drop = round(float(np.clip(drop, -1.0, 1.0)), 4)
        if group.kind == "sensor":
            return self._sensor_reason(p, group, drop, detail)
        context = events.value
        name = group.name
        if group.kind == "context":
            value = p.window.attributes.get(name)
            return Reason(kind="context", name=name, risk_drop=drop, text=_cut(f"{name} {value}"))
        kind, _, what = name.partition(":")
        if kind == "error":
            count = sum(1 for code in context.recent_errors if code == what) + sum(
                1 for _, text in context.window_events if text == name
            )
            count = count or len(group.tokens)
            return Reason(
                kind="event",
                name=name,
                risk_drop=drop,
                detail=ReasonDetail(count=count),
                text=_cut(f"error {what} {_times(count)}"),
            )
        if kind == "maintenance":
            age = context.hours_since_maintenance.get(what)
            text = f"{what} not maintained in the lookback" if age is None else f"{what} maintained {_ago(age)}"
            return Reason(kind="event", name=name, risk_drop=drop, detail=ReasonDetail(age_h=age), text=_cut(text))
        age = context.hours_since_failure  # the last failure: the one group left
        text = "a recent failure" if age is None else f"a failure {_ago(age)}"
        return Reason(kind="event", name=name, risk_drop=drop, detail=ReasonDetail(age_h=age), text=_cut(text))

    def _sensor_reason(
        self, p: _Parsed, group: _Group, drop: float, detail: dict[tuple[str, str | int], float]
    ) -> Reason:
        name = group.name
        assert group.sensor is not None
        where = p.positions[group.sensor]
        keys = {label: d for label, d in detail.items() if label[0] == "key"}
        if not keys:  # stage two looked only at the top sensor
            return Reason(
                kind="sensor",
                name=name,
                risk_drop=drop,
                detail=ReasonDetail(from_h=self._window_h, to_h=0.0),
                text=_cut(f"{name} readings over the last {self._window_h:g} h"),
            )
        top_key = str(max(keys, key=lambda label: keys[label])[1])
        statistic = top_key[1:] if top_key.startswith("w") else top_key
        word = STATISTIC_WORDS.get(statistic, statistic)
        if top_key.startswith("w"):
            block, from_h, to_h = None, self._window_h, 0.0
            span = f"over the last {self._window_h:g} h"
            shown = [pos for pos, key, _ in where if key == top_key]
        else:
            blocks = {label: d for label, d in detail.items() if label[0] == "block"}
            block = int(max(blocks, key=lambda label: blocks[label])[1]) if blocks else None
            length = self._window_h / self._blocks
            if block is None:
                from_h, to_h, span = self._window_h, 0.0, f"over the last {self._window_h:g} h"
            else:
                from_h = self._window_h - block * length
                to_h = max(0.0, self._window_h - (block + 1) * length)
                span = (
                    f"in the last {from_h:g} h"
                    if to_h == 0
                    else f"from {from_h:g} h to {to_h:g} h before the window end"
                )
            shown = [pos for pos, key, b in where if key == top_key and (block is None or b == block)]
        direction = self._direction(p.ids, shown)
        words = " ".join(x for x in (name, word, direction, span) if x)
        return Reason(
            kind="sensor",
            name=name,
            risk_drop=drop,
            detail=ReasonDetail(statistic=statistic, block=block, from_h=round(from_h, 3), to_h=round(to_h, 3)),
            text=_cut(words),
        )

    def _direction(self, ids: np.ndarray, positions: list[int]) -> str:
        """``high`` or ``low`` (``rising`` or ``falling`` for a slope) where every reading shown lies at least a bin
        past the machine's usual value, ``missing`` where none is there, else ``""``.

        Readings are scaled per machine around their usual value, so the usual mean, last, minimum and maximum is 0,
        and so is a flat slope; the usual spread is the middle bin's. Bins are cut half where failing windows lie, so
        the middle bin itself is no usual value."""
        if not positions:
            return ""
        chosen = ids[positions]
        bins = self._stat_bin[chosen]
        seen = bins < self._bins
        if not seen.any():
            return "missing"
        offsets = []
        for i, b in zip(chosen[seen].tolist(), bins[seen].tolist(), strict=True):
            key, sensor = self._keys[self._stat_key[i]], int(self._stat_sensor[i])
            statistic = key[1:] if key.startswith("w") else key
            edges = self.tokenizer.state.edges[key][sensor]
            usual = (len(edges) + 1) // 2 if statistic == "std" else int(np.searchsorted(edges, 0.0, side="right"))
            offsets.append(b - usual)
        rising = "rising" if statistic == "slope" else "high"
        falling = "falling" if statistic == "slope" else "low"
        return rising if min(offsets) >= 1 else falling if max(offsets) <= -1 else ""


def _apply(
    ids: np.ndarray, values: np.ndarray | None, edits: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The sequence (and its values) with each edit made: a token replaced (its value becomes 0, a missing reading's
    and every non-statistic token's) or, for :data:`REMOVE`, taken out with its value."""
    if not edits:
        return ids, values
    out = ids.copy()
    vals = None if values is None else values.copy()
    keep = np.ones(len(ids), dtype=bool)
    for pos, new in edits:
        if new == REMOVE:
            keep[pos] = False
        else:
            out[pos] = new
            if vals is not None:
                vals[pos] = 0.0
    return out[keep], None if vals is None else vals[keep]


def explainer_for(scorer: object, settings: ExplainSettings | None = None) -> OcclusionExplainer | None:
    """An explainer for ``scorer``, or None for a scorer occlusion cannot read (a baseline, another tokenizer)."""
    if not isinstance(scorer, LMScorer) or not isinstance(scorer.tokenizer, TelemetryTokenizer):
        return None
    return OcclusionExplainer(scorer, settings)


def _log_odds(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def _probability(log_odds: float) -> float:
    return 1.0 / (1.0 + math.exp(-log_odds))


def _times(count: int) -> str:
    """How often, in words.

    >>> _times(1), _times(2), _times(3), _times(12)
    ('once', 'twice', 'three times', '12 times')
    """
    words = {1: "once", 2: "twice", 3: "three times", 4: "four times", 5: "five times"}
    return words.get(count, f"{count} times")


def _ago(hours: float) -> str:
    """How long ago, in words.

    >>> _ago(0.4), _ago(5.2), _ago(70), _ago(24 * 40)
    ('under an hour ago', '5 h ago', '3 days ago', '40 days ago')
    """
    if hours < 1:
        return "under an hour ago"
    if hours < 48:
        return f"{hours:.0f} h ago"
    return f"{hours / 24:.0f} days ago"


def _cut(text: str) -> str:
    return text if len(text) <= 200 else text[:199] + "…"
