"""What goes wrong with the store itself (not with a question put to it), on either backend."""

from __future__ import annotations


class StoreBusy(RuntimeError):
    """Another process held the store for longer than we were willing to wait."""


class StoreUnreachable(StoreBusy, ConnectionError):
    """The store's PostgreSQL server did not take a connection in time (down, or it refused the login)."""
