"""Where the prediction store is: a DuckDB file (a path) or a PostgreSQL database (a ``postgresql://`` URL), and how
to show a URL without its password.

>>> is_postgres("postgresql://precursor@db:5432/store"), is_postgres(Path("store.duckdb"))
(True, False)
>>> redact("postgresql://precursor:hunter2@db:5432/store")
'postgresql://precursor:***@db:5432/store'
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

POSTGRES_SCHEMES = ("postgresql://", "postgres://")

StoreLocation = str | Path
"""A DuckDB file (a path) or a PostgreSQL server (a ``postgresql://`` URL)."""


def is_postgres(location: StoreLocation) -> bool:
    """Whether ``location`` names a PostgreSQL database rather than a DuckDB file."""
    return isinstance(location, str) and location.startswith(POSTGRES_SCHEMES)


def redact(location: StoreLocation) -> str:
    """The location as it may be shown or logged: a URL's password replaced by ``***``."""
    text = str(location)
    if not is_postgres(text):
        return text
    parts = urlsplit(text)
    if parts.password is None:
        return text
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
