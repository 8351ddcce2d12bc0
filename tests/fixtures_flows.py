"""A small simulated fleet's history, written as the labeling pipeline's dataset: evidence for the retrain flow.

Seeded, so every run sees the same windows and labels. Test modules that need it say
``pytest_plugins = ["tests.fixtures_flows"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.labeled import write_history
from flows.settings import RetrainSettings
from models.edge.signing import KeyPair, generate_keypair
from models.training.dataset import Fleet, build_windows
from models.training.train import TrainSettings
from precursor.simulator import FleetConfig, write_fleet

HORIZON_H = 24.0
TRAINING = TrainSettings(
    horizon_h=HORIZON_H,
    window_h=12,
    every_h=3,
    blocks=2,
    bins=8,
    max_length=96,
    n_layer=1,
    n_embd=32,
    n_head=2,
    batch_size=32,
    warmup_steps=5,
    max_steps=150,
    eval_every=50,
    min_validation_failures=2,
    threads=1,
    search=[],  # one candidate, not the default search's two
)
"""A model that trains in seconds: the flows' decisions are under test, not the model's quality."""


@dataclass(frozen=True)
class History:
    telemetry: Path
    events: Path
    machines: Path
    dataset: Path
    keys: KeyPair
    training: TrainSettings = TRAINING

    def retrain_settings(self, root: Path, **more: object) -> RetrainSettings:
        """Settings for a retrain on this history into a registry under ``root``; Kafka off unless asked."""
        given: dict[str, object] = {
            "labeled_dataset": self.dataset,
            "telemetry": self.telemetry,
            "events": self.events,
            "machines": self.machines,
            "work_dir": root / "work",
            "registry": root / "registry",
            "signing_key": self.keys.private_key_path,
            "trusted_keys": [self.keys.public_key_path],
            "horizon_h": HORIZON_H,
            "training": self.training,
            "holdout_h": 6 * 24.0,
            "publish": False,
            **more,
        }
        return RetrainSettings(**given)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def flows_history(tmp_path_factory: pytest.TempPathFactory) -> History:
    root = tmp_path_factory.mktemp("flows-history")
    config = FleetConfig(
        machines=12, duration="30d", interval="30m", seed=5, failure_kinds=["bearing", "overheat"], mtbf="5d"
    )
    files = write_fleet(config, root / "fleet")
    fleet = Fleet.load(files.telemetry, files.events, files.machines)
    write_history(build_windows(fleet, TRAINING.window_spec()), root / "labeled", horizon_h=HORIZON_H)
    return History(files.telemetry, files.events, files.machines, root / "labeled", generate_keypair(root / "keys"))
