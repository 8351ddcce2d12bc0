"""Where a pipeline runs: the in-process runner, Beam's portable Prism runner, Apache Flink, or any Beam runner.

- ``local`` (the default): Beam's in-process ``FnApiRunner``. Offline, no Java, no Docker, starts in a second. We name
  it ourselves rather than leave it to ``DirectRunner``, which would first try to download Prism from GitHub.
- ``prism``: Beam's portable reference runner (a Go program). It takes the same portable path as Flink (the pipeline
  is translated to Beam's runner API, submitted to a job service and executed by SDK workers over the Fn API, with
  state, timers and watermarks done by the runner), so a pipeline that gives the local result on Prism is portable.
  The binary is built at install time from the Go module of the same Beam version (``go install``; needs Go).
- ``flink``: Beam's ``FlinkRunner``. With ``flink_master = "[local]"`` it starts an embedded Flink mini-cluster in the
  job server's JVM; with ``host:port`` it submits to a real Flink cluster (the job server still runs locally, the
  SDK workers run where ``--environment_type`` says: ``LOOPBACK`` for this process, ``PROCESS`` or ``EXTERNAL`` on the
  task managers). The job server jar (``org.apache.beam:beam-runners-flink-<flink>-job-server``, the same Beam
  version as the Python SDK) is resolved from Maven Central at install time by ``infra/maven/flink/pom.xml``.
- Any other name (``DataflowRunner``, ``PortableRunner``, ...) is handed to Beam with the extra ``beam_args``
  unchanged, e.g. ``--runner DataflowRunner --beam-arg=--project=P --beam-arg=--region=R
  --beam-arg=--temp_location=gs://B/tmp``.

Nothing is downloaded when a pipeline runs: a missing binary or jar is an error that names the install command.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PipelineOptionsT
from apache_beam.runners.portability.flink_runner import FlinkRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, worker_handlers
from apache_beam.runners.runner import PipelineResult
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.flink_cluster import FLINK_CLUSTER_LOGGING_POM
from infra.go_tools import GoInstallError, go_install
from infra.maven_jars import pom_digest, resolve_runtime_jars
from precursor.contracts.settings import PrecursorSettings

LOCAL = "local"
PRISM = "prism"
FLINK = "flink"
ENGINES = (LOCAL, PRISM, FLINK)

BEAM_VERSION = beam.__version__
PRISM_MODULE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
FLINK_POM = Path(__file__).resolve().parents[1] / "infra" / "maven" / "flink" / "pom.xml"
FLINK_LAUNCHER = "job-server-launcher.jar"
FLINK_JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"

# Flink on Java 17 reflects into JDK internals (Kryo, its memory manager); these are the openings its own launcher adds.
_JAVA17_OPENS = [
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in ("java.lang", "java.util", "java.io", "java.nio", "java.net", "java.lang.reflect", "java.text")
]


class EngineError(RuntimeError):
    """An engine that cannot run here as configured; the text says what to install or set."""


class EngineSettings(BaseSettings):
    """Where the engines' installed parts are, and how Flink is reached. ``PRECURSOR_ENGINE_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="PRECURSOR_ENGINE_", extra="forbid")

    root: Path | None = Field(None, description="install folder; default <state_dir>/engines")
    prism_binary: Path | None = Field(None, description="a Prism binary to use instead of the installed one")
    flink_job_server_jar: Path | None = Field(None, description="a Flink job server jar instead of the resolved one")
    flink_master: str = Field("[local]", description="[local] for an embedded cluster, or host:port of a cluster")
    flink_environment: str = Field("LOOPBACK", description="where SDK workers run: LOOPBACK, PROCESS or EXTERNAL")
    flink_environment_config: str | None = Field(
        None, description="host:port of the SDK worker pool for EXTERNAL (`precursor flink up` starts one)"
    )
    parallelism: int = Field(2, ge=1)

    @property
    def install_root(self) -> Path:
        return self.root or PrecursorSettings().state_dir / "engines"

    @property
    def prism_path(self) -> Path:
        return self.prism_binary or self.install_root / "prism" / f"v{BEAM_VERSION}" / "prism"

    @property
    def flink_jars_root(self) -> Path:
        return self.install_root / "flink"

    @property
    def flink_cluster_jars_root(self) -> Path:
        return self.install_root / "flink-cluster"

    def flink_jar(self) -> Path:
        """The job server jar: the configured one, else the one the install step resolved (never resolved here)."""
        if self.flink_job_server_jar is not None:
            if not self.flink_job_server_jar.is_file():
                raise EngineError(f"flink_job_server_jar={str(self.flink_job_server_jar)!r}: no such file")
            return self.flink_job_server_jar
        launcher = self.flink_jars_root / pom_digest(FLINK_POM) / FLINK_LAUNCHER
        if not launcher.is_file():
            raise EngineError(
                f"no Flink job server at {launcher}: run `precursor pipeline engines --install flink` once "
                "(resolves it from Maven Central), or set PRECURSOR_ENGINE_FLINK_JOB_SERVER_JAR"
            )
        return launcher


class _FlinkRunnerStoppingItsJobServer(FlinkRunner):
    """Beam's ``FlinkRunner`` starts a job server JVM for every pipeline and stops it only when the interpreter exits,
    so a process that runs pipelines back to back (``pipeline run --follow``, a flows worker) kept one more JVM per run
    (hundreds of MB each, a failed run's too). This one stops a pipeline's job server once the pipeline has finished
    or failed and its metrics have been read (they are asked of the job server)."""

    def __init__(self) -> None:
        super().__init__()
        self._job_servers: list[Any] = []

    def default_job_server(self, options: PipelineOptions) -> Any:
        server = super().default_job_server(options)
        self._job_servers.append(server)
        return server

    def _stop_job_servers(self) -> None:
        servers, self._job_servers = self._job_servers, []
        for server in servers:
            server.stop()

    def run_pipeline(self, pipeline: beam.Pipeline, options: PipelineOptions) -> PipelineResult:
        try:
            result = super().run_pipeline(pipeline, options)
        except BaseException:
            self._stop_job_servers()
            raise
        wait = result.wait_until_finish

        def wait_then_stop(duration: int | None = None) -> Any:
            if duration:  # a bounded wait: the pipeline may still run, and needs its job server
                return wait(duration)
            try:
                state = wait()
                result.metrics()  # read (and kept by the result) while the job server still answers
                return state
            finally:
                self._stop_job_servers()

        result.wait_until_finish = wait_then_stop  # type: ignore[method-assign]
        return result


class OptionViewsOnce(PipelineOptions):
    """Pipeline options that make each view (``view_as(TypeOptions)`` and the like) once and hand out the same one
    after. Beam asks the pipeline's options for views several times for every transform it applies, and each new view
    parses the flags again with a new argparse parser: that was most of building an ingest pipeline (about 0.4 CPU-s
    a run). Every view reads and writes the options' one store of values (``_all_options``), so the same view again
    is the same answer."""

    def view_as(self, cls: type[PipelineOptionsT]) -> PipelineOptionsT:
        views = self.__dict__.get("_views")
        if views is None:
            views = {}
            object.__setattr__(self, "_views", views)  # PipelineOptions.__setattr__ takes option names only
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state.pop("_views", None)  # views are made again where the options are unpickled
        return state


@dataclass(frozen=True)
class Engine:
    """A runner and its options, ready for ``beam.Pipeline(runner=..., options=...)``."""

    name: str
    runner: beam.runners.PipelineRunner | str
    options: PipelineOptions
    bundle_per_key: bool = False
    """The engine hands a stateful stage's output on one bundle per key (Flink in batch mode does): a sink that writes
    once per bundle should regroup first, or it writes once per machine."""

    def pipeline(self) -> beam.Pipeline:
        return beam.Pipeline(runner=self.runner, options=self.options)


def engine(name: str, beam_args: list[str] | None = None, settings: EngineSettings | None = None) -> Engine:
    """The engine called ``name`` (``local``, ``prism``, ``flink`` or a Beam runner name) with ``beam_args`` added."""
    settings = settings or EngineSettings()
    extra = list(beam_args or [])
    if name == LOCAL:
        # The in-process worker sizes every user-state write for its cache by walking all loaded modules (about
        # 1.5 ms a write: most of a run with many machines). A bounded run never revisits a key in a later bundle,
        # so the cache buys nothing here; size 0 turns it off for this process's in-process workers.
        worker_handlers.STATE_CACHE_SIZE_MB = 0
        return Engine(name, FnApiRunner(), OptionViewsOnce(extra))
    if name == PRISM:
        binary = settings.prism_path
        if not binary.is_file():
            raise EngineError(
                f"no Prism binary at {binary}: run `precursor pipeline engines --install prism` once "
                "(builds it with Go), or set PRECURSOR_ENGINE_PRISM_BINARY"
            )
        args = ["--runner=PrismRunner", f"--prism_location={binary}", "--environment_type=LOOPBACK"]
        return Engine(name, "PrismRunner", OptionViewsOnce(args + extra))
    if name == FLINK:
        args = [
            "--runner=FlinkRunner",
            f"--flink_master={settings.flink_master}",
            f"--flink_job_server_jar={settings.flink_jar()}",
            f"--environment_type={settings.flink_environment}",
            *(
                [f"--environment_config={settings.flink_environment_config}"]
                if settings.flink_environment_config
                else []
            ),
            f"--parallelism={settings.parallelism}",
            *(f"--job_server_jvm_properties={opening}" for opening in _JAVA17_OPENS),
        ]
        return Engine(name, _FlinkRunnerStoppingItsJobServer(), OptionViewsOnce(args + extra), bundle_per_key=True)
    return Engine(name, name, OptionViewsOnce([f"--runner={name}", *extra]))


def counters(result: PipelineResult, namespace: str) -> dict[str, int]:
    """Our counters of a finished pipeline, by name (committed values where the runner has them)."""
    out: dict[str, int] = {}
    for c in result.metrics().query()["counters"]:
        if c.key.metric.namespace == namespace:
            value = c.committed if c.committed is not None else c.attempted
            out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return out


def install_prism(settings: EngineSettings | None = None, *, report: Callable[[str], None] = print) -> Path:
    """Build the Prism binary of this Beam version with ``go install`` (once; later calls return at once)."""
    settings = settings or EngineSettings()
    try:
        return go_install(
            PRISM_MODULE, f"v{BEAM_VERSION}", settings.prism_path, purpose=f"Beam's Prism runner {BEAM_VERSION}",
            report=report,
        )  # fmt: skip
    except GoInstallError as err:
        raise EngineError(str(err)) from None


def install_flink(settings: EngineSettings | None = None, *, report: Callable[[str], None] = print) -> Path:
    """Resolve Beam's Flink runner and its jars from Maven Central, and write the job server's launcher (once)."""
    settings = settings or EngineSettings()
    folder = resolve_runtime_jars(FLINK_POM, settings.flink_jars_root, report=report)
    # The logging backend of a local Flink cluster (`precursor flink up`), so that starting one downloads nothing.
    resolve_runtime_jars(FLINK_CLUSTER_LOGGING_POM, settings.flink_cluster_jars_root, report=report)
    launcher = folder / FLINK_LAUNCHER
    if not launcher.is_file():
        write_launcher_jar(launcher, FLINK_JOB_SERVER_MAIN, sorted(p.name for p in folder.glob("*.jar")))
    return launcher


def write_launcher_jar(path: Path, main_class: str, class_path: list[str]) -> None:
    r"""An executable jar holding only a manifest: ``java -jar path`` runs ``main_class`` over ``class_path``.

    Class path entries are relative to the launcher's folder, so the folder can move. Written to a temporary name and
    renamed, so a reader never sees half a jar.

    >>> import tempfile, zipfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     jar = Path(folder) / "launcher.jar"
    ...     write_launcher_jar(jar, "org.example.Main", [f"dependency-number-{i}.jar" for i in range(3)])
    ...     manifest = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF").decode()
    >>> max(len(line) for line in manifest.split("\r\n")) <= 72
    True
    >>> manifest.replace("\r\n ", "").splitlines()[2]
    'Class-Path: dependency-number-0.jar dependency-number-1.jar dependency-number-2.jar'
    """
    attributes = {
        "Manifest-Version": "1.0",
        "Main-Class": main_class,
        "Class-Path": " ".join(class_path),
        # Flink reflects into JDK internals; an executable jar may open them itself (Java 9+), flags or not.
        "Add-Opens": " ".join(o.removeprefix("--add-opens=").removesuffix("=ALL-UNNAMED") for o in _JAVA17_OPENS),
    }
    manifest = "".join(_manifest_lines(f"{key}: {value}") for key, value in attributes.items()) + "\r\n"
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    with zipfile.ZipFile(staging, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", manifest)
    staging.replace(path)


def _manifest_lines(header: str) -> str:
    """A manifest header folded as the jar format wants: lines of at most 72 bytes, continued with one space."""
    raw = header.encode()
    lines, rest = [raw[:72]], raw[72:]
    while rest:
        lines.append(b" " + rest[:71])
        rest = rest[71:]
    return "".join(line.decode() + "\r\n" for line in lines)
