"""Prefect flows that retrain on evidence and push signed models to the edge.

- :mod:`flows.retrain`: labeled evidence -> candidate -> judged against the champion -> int8 ONNX, signed,
  registered -> staged rollout (canaries, then the fleet, or back to the champion).
- :mod:`flows.drift_check`: runs ``retrain`` when the monitored recall falls or the inputs drift.
- :mod:`flows.serve`: both flows on cron schedules against a Prefect server (the local one is
  :mod:`infra.prefect_server`).
- ``precursor flows ...`` (:mod:`precursor.flows_cli`) runs them from the command line.
"""
