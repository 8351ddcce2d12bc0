"""Precursor's HTTP API and dashboard: ``precursor serve``."""

from precursor.api.app import create_app

__all__ = ["create_app"]
