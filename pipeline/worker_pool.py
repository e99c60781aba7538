"""An EXTERNAL worker pool whose SDK workers start in a fraction of a second.

    python -m pipeline.worker_pool --service_port=50000 [--host=127.0.0.1]

Run it on every Flink TaskManager or Spark worker host, and submit with
`--environment_type=EXTERNAL --environment_config=localhost:50000`, as with Beam's own
`python -m apache_beam.runners.worker.worker_pool_main`. Beam's pool starts every SDK worker as
a fresh `python`, which imports Beam before it can run anything: 3 to 9 s on a busy 2-core
host. Flink (batch, on a session cluster) and Spark without `--environment_cache_millis` start
a worker per slot for every stage, about a dozen times per imgrec run, so a run of 36 images
spent most of its 100 s waiting for workers. This pool forks each worker from a process that
has Beam and imgrec's modules imported already (a multiprocessing forkserver: it holds no gRPC
channel or thread, so forking it is safe). Each worker starts as Beam's container boot starts
one, not as Beam's pool does: it asks the runner's provision service for the job's pipeline
options and builds its harness with `sdk_worker_main.create_harness`, so Beam's FileSystems get
the job's store options (S3 endpoint and keys, GCS project...), logs go to the runner, and the
state cache and pickler follow the options; Beam's pool gives its workers none of these.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import logging
import multiprocessing
import signal
import sys
import threading
from typing import Optional, Sequence

import grpc
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_fn_api_pb2_grpc,
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
)
from google.protobuf import json_format, text_format

_LOG = logging.getLogger("imgrec.worker_pool")
# What an SDK worker imports before its first bundle, and the modules imgrec's DoFns need.
PRELOAD = ("apache_beam.runners.worker.sdk_worker_main", "pipeline.convert", "transforms.write.write_shards")
STOP_GRACE = 10.0  # s between SIGTERM and SIGKILL for a worker told to stop
PROVISION_TIMEOUT = 60.0  # s a new worker waits for the runner's provision service


def harness_environment(request: beam_fn_api_pb2.StartWorkerRequest) -> dict[str, str]:
    """What Beam's container boot gives `sdk_worker_main` in its environment, for a worker the
    runner asked for with `request`: its endpoints and, from the runner's provision service, the
    job's pipeline options."""
    environment = {"WORKER_ID": request.worker_id,
                   "CONTROL_API_SERVICE_DESCRIPTOR": text_format.MessageToString(request.control_endpoint)}
    if request.logging_endpoint.url:
        environment["LOGGING_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(request.logging_endpoint)
    if request.provision_endpoint.url:
        with grpc.insecure_channel(request.provision_endpoint.url) as channel:
            info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
                beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", request.worker_id)],
                timeout=PROVISION_TIMEOUT).info
        environment["PIPELINE_OPTIONS"] = json_format.MessageToJson(info.pipeline_options)
        environment["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
        if info.status_endpoint.url:
            environment["STATUS_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(info.status_endpoint)
    return environment


def run_harness(request_bytes: bytes) -> None:
    """One SDK worker, in a forked process: the harness `python -m sdk_worker_main` would run."""
    from apache_beam.runners.worker import sdk_worker_main

    request = beam_fn_api_pb2.StartWorkerRequest.FromString(request_bytes)
    log_handler, harness, _ = sdk_worker_main.create_harness(harness_environment(request))
    try:
        harness.run()
    finally:
        if log_handler:
            log_handler.close()


class ForkingWorkerPool(beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer):
    """StartWorker forks an SDK worker from a forkserver that preloaded PRELOAD; StopWorker ends it."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(PRELOAD))
        self._workers: dict[str, multiprocessing.process.BaseProcess] = {}
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Starts the forkserver (and its imports) now rather than at the first StartWorker."""
        process = self._context.Process(target=int)
        process.start()
        process.join()

    def StartWorker(self, request: beam_fn_api_pb2.StartWorkerRequest, context) -> beam_fn_api_pb2.StartWorkerResponse:
        try:
            process = self._context.Process(
                target=run_harness, args=(request.SerializeToString(),),
                name=f"sdk-worker-{request.worker_id}")
            process.start()
        except Exception as exc:  # the runner reports the error with the worker id
            return beam_fn_api_pb2.StartWorkerResponse(error=f"cannot start SDK worker {request.worker_id}: {exc}")
        with self._lock:
            # Workers a runner never stopped (its TaskManager died) ended with their control stream.
            self._workers = {key: worker for key, worker in self._workers.items() if worker.is_alive()}
            self._workers[request.worker_id] = process
        return beam_fn_api_pb2.StartWorkerResponse()

    def StopWorker(self, request: beam_fn_api_pb2.StopWorkerRequest, context) -> beam_fn_api_pb2.StopWorkerResponse:
        with self._lock:
            process = self._workers.pop(request.worker_id, None)
        if process is not None:
            stop(process)
        return beam_fn_api_pb2.StopWorkerResponse()

    def stop_all(self) -> None:
        with self._lock:
            processes, self._workers = list(self._workers.values()), {}
        for process in processes:
            stop(process)


def stop(process: multiprocessing.process.BaseProcess) -> None:
    process.terminate()
    process.join(STOP_GRACE)
    if process.is_alive():
        process.kill()
        process.join()


def serve(port: int, host: str = "[::]") -> tuple[grpc.Server, ForkingWorkerPool]:
    """Starts the pool's gRPC service on host:port; returns it running."""
    pool = ForkingWorkerPool()
    # Beam's pool sets these too: the runner keeps the connection idle between StartWorker calls.
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(pool, server)
    try:  # a port in use: gRPC raises RuntimeError("Failed to bind ..."); older releases returned 0
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        raise OSError(f"cannot listen on {host}:{port}: is something else (another worker pool) listening there?")
    pool.warm_up()
    server.start()
    _LOG.info("worker pool listening on %s:%s", host, bound)
    return server, pool


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.worker_pool", description=__doc__.split("\n\n")[0])
    parser.add_argument("--service_port", type=int, required=True, help="port of the worker pool service")
    parser.add_argument("--host", default="[::]", help="address to listen on (default: every interface, as Beam's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        server, pool = serve(args.service_port, args.host)
    except OSError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.stop(grace=0)
    pool.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
