"""Precursor's HTTP API and dashboard: ``precursor serve``."""

from api.app import create_app

__all__ = ["create_app"]
