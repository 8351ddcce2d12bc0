"""Go programs this project builds once with ``go install`` (Beam's Prism runner, a local S3 server): nothing is
downloaded when they run, and a second call finds the binary at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from infra.maven_jars import MissingToolError


class GoInstallError(RuntimeError):
    """``go install`` failed; the text holds the end of its output."""


def go_install(module: str, version: str, target: Path, *, purpose: str, report: Callable[[str], None] = print) -> Path:
    """Build ``module@version`` into ``target`` (the binary's path) unless it is there. Concurrent callers serialise
    on a lock file beside it, so the build runs once and nobody sees half a binary."""
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise MissingToolError(f"'go' not found, but it is needed once to build {purpose}: install Go 1.22+")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        staging = target.parent / f".build.{os.getpid()}"
        report(f"building {purpose} into {target} (go install {module}@{version}; the first time takes a while)")
        # go refuses a relative GOBIN, and the state folder is relative by default.
        env = os.environ | {"GOBIN": str(staging.absolute()), "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
        done = subprocess.run(
            [go, "install", f"{module}@{version}"], env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise GoInstallError(
                f"go install of {module}@{version} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
            )
        (staging / module.rsplit("/", 1)[-1]).rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return target
