"""``python -m precursor`` is the ``precursor`` command."""

from precursor.cli import app

app()
