"""Resolve the runtime jars of a Maven project into a folder named after the pom's hash.

The folder name is the stamp: ``<jars_root>/<first 16 hex digits of sha256(pom)>/`` exists only when a resolution
finished, because Maven copies into a temporary sibling that is renamed into place at the end. A second call with the
same pom returns at once, a changed pom resolves into a new folder, and a broker still running from the old folder
keeps its jars. Maven downloads into its usual cache (``~/.m2``), so a fresh state folder costs a copy, not a download.

>>> kafka_pom = Path(__file__).parent / "maven" / "kafka" / "pom.xml"
>>> len(pom_digest(kafka_pom)), pom_digest(kafka_pom) == pom_digest(kafka_pom)
(16, True)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

_DIGEST_CHARS = 16


class MissingToolError(RuntimeError):
    """A program the local services need (java, mvn) is not installed or not where the settings point."""


class JarResolutionError(RuntimeError):
    """Maven ran but could not resolve the jars; the message carries Maven's own output."""


def pom_digest(pom: Path) -> str:
    """A short content hash of the pom: the name of the folder its jars resolve into."""
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:_DIGEST_CHARS]


def find_executable(executable: str, *, purpose: str, install_hint: str, setting: str) -> str:
    """The full path of ``executable``, or a :class:`MissingToolError` that says what to install or configure."""
    found = shutil.which(executable)
    if found is None:
        raise MissingToolError(
            f"{executable!r} not found, but it is needed {purpose}: {install_hint}, "
            f"or point {setting} at the executable"
        )
    return found


def resolve_runtime_jars(
    pom: Path,
    jars_root: Path,
    *,
    maven_executable: str = "mvn",
    report: Callable[[str], None] = lambda _line: None,
) -> Path:
    """The folder holding every runtime jar of ``pom``; runs Maven only when no finished folder exists yet.

    Concurrent callers (two test sessions, a test session and ``precursor kafka up``) serialise on a lock file, so
    Maven runs once and nobody sees a half-copied folder.
    """
    if not pom.is_file():
        raise FileNotFoundError(f"pom={str(pom)!r}: no such file")
    target = jars_root / pom_digest(pom)
    if target.is_dir():
        return target
    jars_root.mkdir(parents=True, exist_ok=True)
    with (jars_root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():  # another process finished while this one waited for the lock
            return target
        mvn = find_executable(
            maven_executable,
            purpose=f"once to resolve the jars of {pom.name} from Maven Central",
            install_hint="install Maven 3.8+ (e.g. `apt-get install maven`)",
            setting="PRECURSOR_LOCAL_KAFKA_MAVEN_EXECUTABLE",
        )
        report(f"resolving jars from {pom} into {target} (Maven cache: ~/.m2)")
        staging = jars_root / f".{target.name}.{os.getpid()}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        command = [
            mvn,
            "--batch-mode",
            "--quiet",
            "--file",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging.absolute()}",  # Maven resolves a relative one against the pom's folder
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            output = (done.stdout + done.stderr).strip()[-4000:]
            raise JarResolutionError(f"mvn exited with {done.returncode} resolving {pom}:\n{output}")
        if not any(staging.glob("*.jar")):
            shutil.rmtree(staging, ignore_errors=True)
            raise JarResolutionError(f"mvn resolved no jars from {pom}")
        staging.rename(target)
    return target
