"""A local Apache Flink cluster: one JobManager and several TaskManagers as processes of their own, no distribution.

The Flink runner's jars (resolved from Maven Central by ``precursor pipeline engines --install flink``) hold
``flink-runtime`` and ``flink-clients`` of the same Flink version as the job server, so the cluster runs from them:
no tarball, no Docker. Beside them runs one Python SDK worker pool (:mod:`infra.beam_worker_pool`) that the task
managers start their Beam workers from (environment ``EXTERNAL``), as a worker pool sidecar would on each host of a
real cluster::

    <state>/flink-cluster/conf/flink-conf.yaml     written on every start
    <state>/flink-cluster/logs/<process>.log       jobmanager, taskmanager-1.., worker-pool
    <state>/flink-cluster/<process>.pid

A job submitted to it (``PRECURSOR_ENGINE_FLINK_MASTER``, ``..._ENVIRONMENT=EXTERNAL``,
``..._ENVIRONMENT_CONFIG``: what :meth:`LocalFlinkCluster.engine_environment` returns) runs with its parallelism
spread over the task managers' slots. Sized for a laptop or a 2-core runner.

>>> cluster = LocalFlinkCluster(state_dir="/tmp/s", flink_jars="/tmp/j", rest_port=18081)
>>> cluster.master, cluster.engine_environment()["PRECURSOR_ENGINE_FLINK_ENVIRONMENT"]
('127.0.0.1:18081', 'EXTERNAL')
"""

from __future__ import annotations

import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from infra.maven_jars import find_executable
from infra.processes import BackgroundProcess, log_tail, port_in_use
from infra.service_settings import AbsolutePath

log = logging.getLogger(__name__)

Report = Callable[[str], None]

_JOBMANAGER_MAIN = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
_TASKMANAGER_MAIN = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
_POOL_MODULE = "infra.beam_worker_pool"
# Flink on Java 17 reflects into JDK internals (Kryo, its memory manager); the openings its own launcher adds.
_JAVA17_OPENS = [
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in ("java.lang", "java.util", "java.io", "java.nio", "java.net", "java.lang.reflect", "java.text")
]
FLINK_CLUSTER_LOGGING_POM = Path(__file__).parent / "maven" / "flink-cluster" / "pom.xml"


class FlinkClusterError(RuntimeError):
    """The local Flink cluster could not be started or stopped; the message says why and where the logs are."""


class FlinkClusterStatus(BaseModel):
    rest: str
    jobmanager: int | None = Field(description="pid, when running")
    taskmanagers: list[int | None] = Field(description="pid of each task manager, None where it is not running")
    worker_pool: int | None
    registered_taskmanagers: int = Field(0, description="task managers the job manager knows (its REST answer)")
    slots_total: int = 0
    slots_available: int = 0
    jobs_running: int = 0

    @property
    def running(self) -> bool:
        return self.jobmanager is not None and all(p is not None for p in self.taskmanagers)


class LocalFlinkCluster(BaseModel):
    """A JobManager, ``taskmanagers`` TaskManagers of ``slots`` slots each, and the SDK worker pool they use."""

    model_config = ConfigDict(extra="forbid")

    state_dir: AbsolutePath = Path(".state")
    flink_jars: AbsolutePath = Field(description="the Flink runner's resolved jars (flink-runtime and the rest)")
    logging_jars: AbsolutePath | None = Field(None, description="a folder with an SLF4J backend; quiet without one")
    taskmanagers: int = Field(2, ge=1, le=8)
    slots: int = Field(1, ge=1, le=8, description="slots per task manager")
    host: str = "127.0.0.1"
    rest_port: int = Field(8081, ge=1, le=65535)
    rpc_port: int = Field(6123, ge=1, le=65535)
    worker_pool_port: int = Field(50000, ge=1, le=65535)
    jobmanager_heap_mb: int = Field(384, ge=128)
    taskmanager_heap_mb: int = Field(384, ge=192, description="task plus framework heap of each task manager")
    network_mb: int = Field(192, ge=64, description="network buffers per task manager: batch shuffles need many")
    java_executable: str = "java"
    # One object per process for this cluster's lifetime: the one that launched a process can poll it, which needs
    # no look at its command line.
    _processes: dict[str, BackgroundProcess] = PrivateAttr(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.state_dir / "flink-cluster"

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def master(self) -> str:
        return f"{self.host}:{self.rest_port}"

    def engine_environment(self) -> dict[str, str]:
        """The ``PRECURSOR_ENGINE_*`` settings that send the flink engine's jobs to this cluster."""
        return {
            "PRECURSOR_ENGINE_FLINK_MASTER": self.master,
            "PRECURSOR_ENGINE_FLINK_ENVIRONMENT": "EXTERNAL",
            "PRECURSOR_ENGINE_FLINK_ENVIRONMENT_CONFIG": f"{self.host}:{self.worker_pool_port}",
            "PRECURSOR_ENGINE_PARALLELISM": str(self.taskmanagers * self.slots),
        }

    # Processes ----------------------------------------------------------------------------------------------------

    def _process(self, name: str, marker: str) -> BackgroundProcess:
        if name in self._processes:
            return self._processes[name]
        conf = str(self.conf_dir)
        self._processes[name] = BackgroundProcess(
            self.home / f"{name}.pid",
            is_ours=lambda cmdline: (
                marker in cmdline and (conf in cmdline or f"--port {self.worker_pool_port}" in cmdline)
            ),
            name=f"Flink {name}",
            error=FlinkClusterError,
        )
        return self._processes[name]

    def jobmanager(self) -> BackgroundProcess:
        return self._process("jobmanager", _JOBMANAGER_MAIN)

    def taskmanager(self, index: int) -> BackgroundProcess:
        return self._process(f"taskmanager-{index}", _TASKMANAGER_MAIN)

    def worker_pool(self) -> BackgroundProcess:
        return self._process("worker-pool", _POOL_MODULE)

    def _all(self) -> list[BackgroundProcess]:
        return [self.jobmanager(), *(self.taskmanager(i) for i in range(1, self.taskmanagers + 1)), self.worker_pool()]

    # Verbs ---------------------------------------------------------------------------------------------------------

    def up(self, timeout_s: float = 120.0, report: Report | None = None) -> FlinkClusterStatus:
        """Start whatever of the cluster is not running, then wait until every task manager has registered."""
        say = report or log.info
        started = time.monotonic()
        if not any(self.flink_jars.glob("flink-runtime-*.jar")):
            raise FlinkClusterError(
                f"no flink-runtime jar in {self.flink_jars}: run `precursor pipeline engines --install flink` once"
            )
        java = find_executable(
            self.java_executable,
            purpose="to run the local Flink cluster",
            install_hint="install a Java 17 runtime (e.g. `apt-get install openjdk-17-jre-headless`)",
            setting="--java",
        )
        self._write_config()
        jobmanager = self.jobmanager()
        if jobmanager.running_pid() is None:
            self._refuse_busy(self.rest_port, "rest_port")
            self._refuse_busy(self.rpc_port, "rpc_port")
            say(f"starting the Flink job manager at {self.master} (log {self.logs_dir / 'jobmanager.log'})")
            jobmanager.launch(
                self._jvm(java, self.jobmanager_heap_mb, "jobmanager", _JOBMANAGER_MAIN),
                output=self.logs_dir / "jobmanager.out",
                cwd=self.home,
            )
        pool = self.worker_pool()
        if pool.running_pid() is None:
            self._refuse_busy(self.worker_pool_port, "worker_pool_port")
            say(f"starting the SDK worker pool at {self.host}:{self.worker_pool_port}")
            pool.launch(
                [sys.executable, "-m", _POOL_MODULE, "--port", str(self.worker_pool_port), "--host", self.host],
                output=self.logs_dir / "worker-pool.log",
                cwd=Path.cwd(),  # jobs name files relative to where they were submitted from
            )
        for index in range(1, self.taskmanagers + 1):
            taskmanager = self.taskmanager(index)
            if taskmanager.running_pid() is None:
                say(f"starting Flink task manager {index} of {self.taskmanagers} ({self.slots} slots)")
                taskmanager.launch(
                    self._taskmanager_command(java, index),
                    output=self.logs_dir / f"taskmanager-{index}.out",
                    cwd=self.home,
                )
        status = self._wait_until_registered(started + timeout_s)
        say(
            f"Flink cluster ready at {self.master} in {time.monotonic() - started:.1f} s: "
            f"{status.registered_taskmanagers} task managers, {status.slots_total} slots"
        )
        return status

    def down(self, timeout_s: float = 30.0, report: Report | None = None) -> int:
        """Stop every process of the cluster, all at once; how many were running."""
        say = report or log.info
        processes = self._all()
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:
            stopped = list(pool.map(lambda p: p.stop(timeout_s, say, absent=f"no {p.name} running"), processes))
        return sum(stopped)

    def status(self) -> FlinkClusterStatus:
        overview = self._overview()
        return FlinkClusterStatus(
            rest=f"http://{self.master}",
            jobmanager=self.jobmanager().running_pid(),
            taskmanagers=[self.taskmanager(i).running_pid() for i in range(1, self.taskmanagers + 1)],
            worker_pool=self.worker_pool().running_pid(),
            registered_taskmanagers=int(overview.get("taskmanagers", 0)),
            slots_total=int(overview.get("slots-total", 0)),
            slots_available=int(overview.get("slots-available", 0)),
            jobs_running=int(overview.get("jobs-running", 0)),
        )

    def kill_taskmanager(self, index: int) -> int:
        """SIGKILL one task manager, as a crash would; its pid (failure drills)."""
        import os
        import signal

        process = self.taskmanager(index)
        pid = process.running_pid()
        if pid is None:
            raise FlinkClusterError(f"task manager {index} is not running")
        os.kill(pid, signal.SIGKILL)
        process.wait_for_exit(pid, 30)
        process.forget()
        return pid

    # Helpers -------------------------------------------------------------------------------------------------------

    def _overview(self) -> dict[str, object]:
        try:
            with urllib.request.urlopen(f"http://{self.master}/overview", timeout=2) as answer:
                return dict(json.load(answer))
        except (OSError, urllib.error.URLError, ValueError):
            return {}

    def _refuse_busy(self, port: int, name: str) -> None:
        if port_in_use(self.host, port):
            raise FlinkClusterError(f"{name}={port} on {self.host} is in use by another process: choose another port")

    def _wait_until_registered(self, deadline: float) -> FlinkClusterStatus:
        while True:
            status = self.status()
            dead = [p.name for p in self._all() if p.running_pid() is None]
            if dead:
                self.down()
                tails = "\n".join(
                    f"--- {name}:\n{log_tail(self.logs_dir / (name + '.log'), 20)}"
                    for name in ("jobmanager", *(f"taskmanager-{i}" for i in range(1, self.taskmanagers + 1)))
                )
                raise FlinkClusterError(f"{', '.join(dead)} exited during start-up; logs in {self.logs_dir}:\n{tails}")
            # A task manager is counted a moment before its slots are: wait for both, so "ready" means jobs fit.
            if (
                status.registered_taskmanagers >= self.taskmanagers
                and status.slots_total >= self.taskmanagers * self.slots
            ):
                return status
            if time.monotonic() > deadline:
                self.down()
                raise FlinkClusterError(
                    f"only {status.registered_taskmanagers} of {self.taskmanagers} task managers "
                    f"({status.slots_total} of {self.taskmanagers * self.slots} slots) registered in time; "
                    f"the cluster was stopped. Logs in {self.logs_dir}"
                )
            time.sleep(0.5)

    def _classpath(self) -> str:
        jars = sorted(p for p in self.flink_jars.glob("*.jar") if p.name != "job-server-launcher.jar")
        if self.logging_jars is not None:
            jars += sorted(self.logging_jars.glob("*.jar"))
        return ":".join(str(p) for p in jars)

    def _jvm(self, java: str, heap_mb: int, name: str, main: str, extra: list[str] | None = None) -> list[str]:
        return [
            java,
            f"-Xmx{heap_mb}m",
            f"-Xms{heap_mb}m",
            *(extra or []),
            *_JAVA17_OPENS,
            f"-Dlog.file={self.logs_dir / (name + '.log')}",
            f"-Dlog4j.configuration=file:{self.conf_dir / 'log4j.properties'}",
            "-cp",
            self._classpath(),
            main,
            "--configDir",
            str(self.conf_dir),
        ]

    def _taskmanager_command(self, java: str, index: int) -> list[str]:
        # What Flink's launcher script would compute from the memory settings: the JVM's limits must match them.
        direct_mb = 128 + self.network_mb  # framework off-heap + network
        return self._jvm(
            java,
            self.taskmanager_heap_mb,
            f"taskmanager-{index}",
            _TASKMANAGER_MAIN,
            [f"-XX:MaxDirectMemorySize={direct_mb}m", "-XX:MaxMetaspaceSize=256m"],
        )

    def flink_config(self) -> dict[str, str]:
        framework_heap = 128
        return {
            "jobmanager.rpc.address": self.host,
            "jobmanager.rpc.port": str(self.rpc_port),
            "jobmanager.bind-host": self.host,
            "jobmanager.memory.process.size": f"{self.jobmanager_heap_mb + 384}m",
            "rest.address": self.host,
            "rest.bind-address": self.host,
            "rest.port": str(self.rest_port),
            "taskmanager.host": self.host,
            "taskmanager.bind-host": self.host,
            "taskmanager.numberOfTaskSlots": str(self.slots),
            "parallelism.default": str(self.taskmanagers * self.slots),
            # Started without Flink's launcher script, a task manager needs every memory part stated.
            "taskmanager.cpu.cores": str(float(self.slots)),
            "taskmanager.memory.framework.heap.size": f"{framework_heap}m",
            "taskmanager.memory.task.heap.size": f"{self.taskmanager_heap_mb - framework_heap}m",
            "taskmanager.memory.managed.size": "64m",
            "taskmanager.memory.framework.off-heap.size": "128m",
            "taskmanager.memory.task.off-heap.size": "0m",
            "taskmanager.memory.network.min": f"{self.network_mb}m",
            "taskmanager.memory.network.max": f"{self.network_mb}m",
            "taskmanager.memory.jvm-metaspace.size": "256m",
            "taskmanager.memory.jvm-overhead.min": "192m",
            "taskmanager.memory.jvm-overhead.max": "192m",
        }

    def _write_config(self) -> None:
        for folder in (self.conf_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}: {value}" for key, value in self.flink_config().items()]
        (self.conf_dir / "flink-conf.yaml").write_text(
            "# Written by precursor on every start; edits are overwritten.\n" + "\n".join(lines) + "\n"
        )
        (self.conf_dir / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, file\n"
            "log4j.appender.file=org.apache.log4j.RollingFileAppender\n"
            "log4j.appender.file.File=${log.file}\n"
            "log4j.appender.file.MaxFileSize=10MB\n"
            "log4j.appender.file.MaxBackupIndex=2\n"
            "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.file.layout.ConversionPattern=%d %p %c{1} %m%n\n"
        )
