"""The Python SDK worker pool that a Flink cluster's task managers start their Beam workers from (``EXTERNAL``).

Beam's own pool (``apache_beam.runners.worker.worker_pool_main``) keys workers by the id the runner gives them. Every
task manager numbers its workers from ``1-1`` alike, so with two task managers on one pool the second ``StartWorker``
replaced the first one's worker and the first ``StopWorker`` stopped the other task manager's worker mid-bundle
("SDK harness closed connection"). This pool keys workers by the caller's connection as well: a task manager starts and
stops a worker over the same channel, so ``(peer, worker id)`` names one worker of one task manager.

Each worker is a process of its own (this interpreter, so the project's venv): two task managers work on two cores
instead of sharing one interpreter lock.

    python -m infra.beam_worker_pool --port 50000
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
from concurrent import futures
from typing import Any

import grpc
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc

log = logging.getLogger("precursor.worker_pool")

_WORKER = (
    "import sys; from apache_beam.runners.worker.sdk_worker import SdkHarness; "
    "SdkHarness(sys.argv[1], worker_id=sys.argv[2], state_cache_size=0).run()"
)


class WorkerPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    """Starts one SDK worker process per ``StartWorker`` and stops it on the matching ``StopWorker``."""

    def __init__(self) -> None:
        self._workers: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def StartWorker(
        self, request: beam_fn_api_pb2.StartWorkerRequest, context: Any
    ) -> beam_fn_api_pb2.StartWorkerResponse:
        key = (context.peer(), request.worker_id)
        try:
            worker = subprocess.Popen(
                [sys.executable, "-c", _WORKER, request.control_endpoint.url, request.worker_id],
                stdin=subprocess.DEVNULL,
            )
        except OSError as err:
            return beam_fn_api_pb2.StartWorkerResponse(error=f"cannot start an SDK worker: {err}")
        with self._lock:
            self._workers[key] = worker
        log.info("started worker %s for %s (pid %d)", request.worker_id, key[0], worker.pid)
        return beam_fn_api_pb2.StartWorkerResponse()

    def StopWorker(
        self, request: beam_fn_api_pb2.StopWorkerRequest, context: Any
    ) -> beam_fn_api_pb2.StopWorkerResponse:
        with self._lock:
            worker = self._workers.pop((context.peer(), request.worker_id), None)
        if worker is not None:
            _stop(worker)
        return beam_fn_api_pb2.StopWorkerResponse()

    def stop_all(self) -> None:
        with self._lock:
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            _stop(worker)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def serve(port: int, host: str = "127.0.0.1") -> tuple[grpc.Server, WorkerPool, int]:
    """Start the pool's gRPC server; the server, the pool and the port it listens on."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pool = WorkerPool()
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"the SDK worker pool cannot listen on {host}:{port}")
    server.start()
    return server, pool, bound


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=50000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server, pool, port = serve(args.port, args.host)
    log.info("SDK worker pool listening at %s:%d", args.host, port)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.stop(5)
    pool.stop_all()


if __name__ == "__main__":
    main()
