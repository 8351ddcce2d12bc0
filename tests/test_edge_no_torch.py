"""The edge process scores with onnxruntime, numpy and tokenizers: it never imports torch, nor needs transformers.

A fresh interpreter loads the runtime, verifies and loads a real exported artifact and scores windows, with an import
hook that records (and refuses) any attempt to import a cloud-only package, even one a module would have tolerated
failing. Its risks must equal the test process's own, so the check is about the real scoring path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from models.edge.runtime import LMScorer
from models.edge.scoring import Window
from models.edge.signing import generate_keypair, load_public_keys
from models.training.export import export_artifact
from precursor.contracts.outcomes import ANY_FAILURE
from tests.test_export import train_checkpoint, validation_ids, windows

REPO_ROOT = Path(__file__).resolve().parents[1]
CLOUD_ONLY = ("torch", "transformers", "onnx", "sklearn", "apache_beam", "prefect")

EDGE_SCRIPT = """
import json, sys
from importlib.abc import MetaPathFinder

CLOUD_ONLY = set(json.loads(sys.argv[1])["cloud_only"])
attempts = []

class RefuseCloudPackages(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in CLOUD_ONLY:
            attempts.append(name)
            raise ImportError(f"the edge process must not import {name}")
        return None

sys.meta_path.insert(0, RefuseCloudPackages())

from datetime import datetime
import numpy as np
from models.edge.runtime import LMScorer
from models.edge.scoring import Window
from models.edge.signing import load_public_keys

args = json.loads(sys.argv[1])
scorer = LMScorer.load(args["artifact"], load_public_keys(args["keys"]))
windows = [
    Window(w["machine_id"], datetime.fromisoformat(w["start"]), datetime.fromisoformat(w["end"]),
           np.array(w["timestamps"], dtype=np.int64), tuple(w["sensors"]), np.array(w["values"], dtype=np.float32))
    for w in json.loads(open(args["windows"]).read())
]
risks = scorer.score_many(windows)
print(json.dumps({
    "risks": risks,
    "one": scorer.score(windows[0]),
    "attempts": attempts,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in CLOUD_ONLY),
    "version": scorer.version,
}))
"""


def window_json(window: Window) -> dict[str, object]:
    return {
        "machine_id": window.machine_id,
        "start": window.start.isoformat(),
        "end": window.end.isoformat(),
        "timestamps": window.timestamps.tolist(),
        "sensors": list(window.sensors),
        "values": window.values.tolist(),
    }


@pytest.fixture(scope="module")
def edge_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("edge")
    checkpoint = train_checkpoint(root / "checkpoint")
    keys = root / "keys"
    generate_keypair(keys)
    artifact = export_artifact(
        checkpoint, root / "artifact", "1.2.3", keys / "precursor.key", validation_ids(checkpoint)
    )
    return artifact, keys


def run_edge(
    artifact: Path, keys: Path, test_windows: list[Window], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    window_file = tmp_path / "windows.json"
    window_file.write_text(json.dumps([window_json(w) for w in test_windows]))
    args = {"artifact": str(artifact), "keys": str(keys), "windows": str(window_file), "cloud_only": CLOUD_ONLY}
    return subprocess.run(
        [sys.executable, "-c", EDGE_SCRIPT, json.dumps(args)],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_edge_process_scores_without_torch_or_transformers(edge_files: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, keys = edge_files
    test_windows, _ = windows(range(800, 812))

    done = run_edge(artifact, keys, test_windows, tmp_path)

    assert done.returncode == 0, done.stderr[-3000:]
    edge = json.loads(done.stdout.strip().splitlines()[-1])
    assert edge["attempts"] == [], f"the edge runtime tried to import {edge['attempts']}"
    assert edge["loaded"] == []
    assert edge["version"] == "1.2.3"
    here = LMScorer.load(artifact, load_public_keys(keys)).score_many(test_windows)
    assert edge["risks"] == here  # same artifact, same bytes in, same risks out
    assert all(ANY_FAILURE in r for r in edge["risks"])  # type: ignore[union-attr]


def test_edge_process_refuses_a_tampered_artifact(edge_files: tuple[Path, Path], tmp_path: Path) -> None:
    artifact, keys = edge_files
    copy = tmp_path / "artifact"
    copy.mkdir()
    for path in artifact.iterdir():
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    model = bytearray((copy / "model.onnx").read_bytes())
    model[-100] ^= 0xFF
    (copy / "model.onnx").write_bytes(bytes(model))

    done = run_edge(copy, keys, windows(range(1))[0], tmp_path)

    assert done.returncode != 0
    assert "TamperedArtifactError" in done.stderr
    assert "model.onnx has sha256" in done.stderr
