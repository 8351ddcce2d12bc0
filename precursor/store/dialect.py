"""Where the store's SQL differs between DuckDB and PostgreSQL, and nowhere else.

The store's questions are written once, in DuckDB's SQL with ``?`` parameters. On PostgreSQL each text is translated
once (sqlglot, then the few rewrites below) and cached; the DuckDB functions PostgreSQL lacks are defined there as
small SQL functions (:data:`POSTGRES_FUNCTIONS`), so the query texts stay as they are.

>>> print(to_postgres("SELECT a, arg_max(b, c) FROM t WHERE x = ? GROUP BY ALL").text)
SELECT a, (ARRAY_AGG(b ORDER BY c DESC NULLS LAST) FILTER(WHERE NOT c IS NULL))[1] FROM t WHERE x = %(p1)s GROUP BY a
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp

# DuckDB functions the store's queries use that PostgreSQL has not, with DuckDB's meaning. time_bucket becomes
# date_bin (sqlglot's translation) without an origin; DuckDB's default origin for sub-month widths is 2000-01-03.
POSTGRES_FUNCTIONS = """
CREATE OR REPLACE FUNCTION epoch_us(ts TIMESTAMPTZ) RETURNS BIGINT LANGUAGE sql IMMUTABLE
    AS $$ SELECT (extract(epoch FROM ts) * 1000000)::BIGINT $$;
CREATE OR REPLACE FUNCTION to_microseconds(us BIGINT) RETURNS INTERVAL LANGUAGE sql IMMUTABLE
    AS $$ SELECT us * INTERVAL '1 microsecond' $$;
CREATE OR REPLACE FUNCTION date_bin(width INTERVAL, ts TIMESTAMPTZ) RETURNS TIMESTAMPTZ LANGUAGE sql IMMUTABLE
    AS $$ SELECT pg_catalog.date_bin(width, ts, TIMESTAMPTZ '2000-01-03 00:00:00+00') $$;
"""


@dataclass(frozen=True)
class Translated:
    """A statement in PostgreSQL's SQL; its parameters are named ``p1``, ``p2``... after the ``?`` they were."""

    statements: tuple[str, ...]
    parameters: int

    @property
    def text(self) -> str:
        return ";\n".join(self.statements)

    def bind(self, params: object) -> dict[str, object] | None:
        values = list(params) if isinstance(params, list | tuple) else []
        if len(values) != self.parameters:
            raise ValueError(f"the statement takes {self.parameters} parameters; {len(values)} were given")
        return {f"p{i}": v for i, v in enumerate(values, 1)} if values else None


_QUESTION_OR_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\?")


def _number_parameters(text: str) -> tuple[str, int]:
    """``?`` -> ``$p1``, ``$p2``... (outside quotes and comments), which sqlglot parses anywhere a value goes."""
    count = 0

    def name(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) != "?":
            return match.group(0)
        count += 1
        return f"$p{count}"

    return _QUESTION_OR_QUOTED.sub(name, text), count


def _arg_max(node: exp.Expression) -> exp.Expression:
    """arg_max(a, b) -> the a of the greatest b, rows with a NULL b left out (as DuckDB does); a FILTER joins in."""
    condition: exp.Expression | None = None
    if isinstance(node, exp.Filter) and isinstance(node.this, exp.ArgMax):
        condition = node.expression.this
        node = node.this
    if not isinstance(node, exp.ArgMax):
        return node
    value, key = node.this, node.expression
    keep = exp.not_(exp.Is(this=key.copy(), expression=exp.null()))
    if condition is not None:
        keep = exp.and_(exp.paren(condition.copy()), keep)
    ordered = exp.Order(expressions=[exp.Ordered(this=key.copy(), desc=True, nulls_first=False)])
    agg = exp.ArrayAgg(this=exp.Order(this=value.copy(), expressions=ordered.expressions))
    filtered = exp.Filter(this=agg, expression=exp.Where(this=keep))
    return exp.Bracket(this=exp.Paren(this=filtered), expressions=[exp.Literal.number(1)], offset=1)


def _qualify(node: exp.Expression) -> exp.Expression:
    """``QUALIFY row_number() OVER (PARTITION BY k ORDER BY o) = 1 [AND c]`` -> ``DISTINCT ON (k) ... ORDER BY k,
    o``, with ``c``, the statement's own ORDER BY and LIMIT around it (the store's queries use QUALIFY only so)."""
    if not isinstance(node, exp.Select) or node.args.get("qualify") is None:
        return node
    condition = node.args["qualify"].this
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    firsts = [p for p in parts if _is_first_row(p)]
    if len(firsts) != 1:
        raise ValueError(f"QUALIFY {condition.sql()}: only row_number() OVER (PARTITION BY ...) = 1 translates")
    window = firsts[0].this
    rest = [p.copy() for p in parts if p is not firsts[0]]
    inner = node.copy()
    inner.set("qualify", None)
    outer_args = {k: inner.args.get(k) for k in ("order", "limit", "offset")}
    for k in outer_args:
        inner.set(k, None)
    partition = [e.copy() for e in window.args["partition_by"]]
    order = window.args.get("order")
    inner.set("distinct", exp.Distinct(on=exp.Tuple(expressions=partition)))
    keys = [exp.Ordered(this=e.copy(), desc=False) for e in partition]
    inner.set("order", exp.Order(expressions=keys + ([o.copy() for o in order.expressions] if order else [])))
    if not rest and not any(outer_args.values()):
        return inner
    if rest:
        # The condition may read columns the statement does not select: the first rows keep all their columns, and
        # the statement's own selection is made from them.
        projection = [_unqualified(e.copy()) for e in inner.expressions]
        inner.set("expressions", [exp.Star()])
        outer = exp.select(*projection).from_(inner.subquery("_q")).where(*[_unqualified(p) for p in rest])
    else:
        outer = exp.select("*").from_(inner.subquery("_q"))
    if outer_args["order"] is not None:
        outer.set("order", _unqualified(outer_args["order"].copy()))
    for k in ("limit", "offset"):
        if outer_args[k] is not None:
            outer.set(k, outer_args[k].copy())
    return outer


def _is_first_row(condition: exp.Expression) -> bool:
    window = condition.this if isinstance(condition, exp.EQ) else None
    return (
        isinstance(window, exp.Window)
        and isinstance(window.this, exp.RowNumber)
        and condition.expression.sql() == "1"
        and bool(window.args.get("partition_by"))
    )


def _unqualified(tree: exp.Expression) -> exp.Expression:
    """Column references as the outer query sees them: by output name, without the inner query's table names."""
    for column in tree.find_all(exp.Column):
        column.set("table", None)
    return tree


def _group_by_all(node: exp.Expression) -> exp.Expression:
    """GROUP BY ALL -> GROUP BY each selected expression that is not an aggregate."""
    if not isinstance(node, exp.Select):
        return node
    group = node.args.get("group")
    if group is None or not group.args.get("all"):
        return node
    keys = [
        (e.this if isinstance(e, exp.Alias) else e).copy()
        for e in node.expressions
        if not e.find(exp.AggFunc, exp.Window) and e.find(exp.Column)  # constants are not grouped by
    ]
    node.set("group", exp.Group(expressions=keys))
    return node


def _lateral_aliases(node: exp.Expression) -> exp.Expression:
    """DuckDB lets a selected expression use an aggregate named earlier in the same list (``tp / (tp + fp)``);
    PostgreSQL does not, so the name is replaced by its expression."""
    if not isinstance(node, exp.Select):
        return node
    named: dict[str, exp.Expression] = {}
    for item in node.expressions:
        for column in list(item.find_all(exp.Column)):
            if not column.table and column.name in named and column.find_ancestor(exp.Select) is node:
                column.replace(exp.paren(named[column.name].copy()))
        if isinstance(item, exp.Alias) and item.this.find(exp.AggFunc):
            named[item.alias] = item.this
    return node


def _alias_subqueries(tree: exp.Expression) -> None:
    """PostgreSQL before 16 wants a name for each subquery in FROM or JOIN."""
    for i, sub in enumerate(list(tree.find_all(exp.Subquery)), 1):
        if not sub.alias and isinstance(sub.parent, exp.From | exp.Join):
            sub.set("alias", exp.TableAlias(this=exp.to_identifier(f"_s{i}")))


@lru_cache(maxsize=2048)
def to_postgres(text: str) -> Translated:
    """One statement of the store's DuckDB SQL as PostgreSQL runs it (cached: the store asks the same few texts)."""
    numbered, count = _number_parameters(text)
    trees = [t for t in sqlglot.parse(numbered, read="duckdb") if t is not None]
    out = []
    for tree in trees:
        tree = tree.transform(_lateral_aliases).transform(_group_by_all).transform(_arg_max).transform(_qualify)
        _alias_subqueries(tree)
        out.append(tree.sql("postgres"))
    # sqlglot writes $p1 as %(p1)s for PostgreSQL; a % that is an operator must be doubled for psycopg.
    return Translated(tuple(re.sub(r"%(?!\(p\d+\)s)", "%%", s) for s in out), count)
