"""``python -m flows``: the same commands as ``precursor flows``."""

from flows.cli import flows_app

flows_app(prog_name="precursor flows")
