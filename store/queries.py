"""The questions people ask of the store, without SQL. Each returns plain rows (dicts) for any front end."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from store.db import connect


def _rows(path: str | Path, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    with connect(path, read_only=True) as con:
        cur = con.execute(sql, params)
        names = [d[0] for d in cur.description]
        out = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    for row in out:
        if isinstance(row.get("risk"), str):
            row["risk"] = json.loads(row["risk"])
    return out


def at_risk(path: str | Path, *, limit: int = 10, since: datetime | None = None) -> list[dict[str, Any]]:
    """Each machine's latest prediction (by window end), riskiest first."""
    return _rows(
        path,
        """
        SELECT machine_id, max_risk, top_kind, risk, window_end, model_name, model_version, edge_id
        FROM predictions
        WHERE window_end >= coalesce(?::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
        QUALIFY row_number() OVER (PARTITION BY machine_id ORDER BY window_end DESC, seq DESC) = 1
        ORDER BY max_risk DESC, machine_id
        LIMIT ?
        """,
        [since, limit],
    )


def machine_history(
    path: str | Path, machine_id: str, *, limit: int = 100, since: datetime | None = None
) -> list[dict[str, Any]]:
    """One machine's predictions, newest first."""
    return _rows(
        path,
        """
        SELECT window_start, window_end, max_risk, top_kind, risk, model_name, model_version, edge_id, seq
        FROM predictions
        WHERE machine_id = ? AND window_end >= coalesce(?::TIMESTAMPTZ, '-infinity'::TIMESTAMPTZ)
        ORDER BY window_end DESC, seq DESC
        LIMIT ?
        """,
        [machine_id, since, limit],
    )


def counts_per_edge(path: str | Path) -> list[dict[str, Any]]:
    """How many predictions each edge sent, over how many machines, and when it was last heard of."""
    return _rows(
        path,
        """
        SELECT edge_id, count(*) AS predictions, count(DISTINCT machine_id) AS machines,
               max(window_end) AS latest_window_end, max(seq) AS max_seq
        FROM predictions
        GROUP BY edge_id
        ORDER BY edge_id
        """,
        [],
    )
