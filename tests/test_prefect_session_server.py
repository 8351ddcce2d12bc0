"""The tests' Prefect server leaves nothing for Prefect to send at interpreter exit.

The reproduction: a run logger used after the session's server had stopped made Prefect start a temporary server at
exit to post that one line (PREFECT_API_URL was unset by then): seconds of delay, and tracebacks after the last test
when that server or the event loop was gone first. The process here stands for a pytest session: it runs a flow
against ``session_server`` as the ``prefect_server`` fixture does, then logs once more with the run's logger.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

SESSION = """
import sys
from pathlib import Path

from prefect import flow, get_run_logger

from tests.fixtures_prefect import session_server

kept = []


@flow
def speaks() -> None:
    kept.append(get_run_logger())
    kept[0].info("inside the run")


with session_server(Path(sys.argv[1])):
    speaks()
kept[0].info("after the server stopped")
print("session over", flush=True)
"""


def test_nothing_is_sent_to_an_api_after_the_session_server_stopped(tmp_path: Path) -> None:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", SESSION, str(tmp_path / "state")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "session over" in output
    after = output[output.index("session over") :]
    assert "temporary server" not in after and "Error logging to API" not in after and "Traceback" not in after, after
    assert "after the server stopped" in output  # still on the console: only the API handler went
