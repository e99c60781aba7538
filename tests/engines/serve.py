"""Starts Flink or Spark the way the engine tests do and keeps it up until Ctrl-C (or SIGTERM).

    python -m tests.engines.serve flink|spark [WORK_DIR]

Prints the cluster's endpoints and, where `make engines` built Beam's job server for it, starts
the job server and imgrec's worker pool too and prints the imgrec command to run against them.
Everything it started is stopped on the way out. It runs in this host's network namespace (the
tests use a private one): Beam's job server listens on every interface. (Prism needs no server: `--runner=PrismRunner
--prism_location=...` starts one per run; see docs/runners.md.)
"""
from __future__ import annotations

import contextlib
import pathlib
import signal
import sys
import tempfile

from tests.engines.engines import cluster, job_server, job_server_jar


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("flink", "spark"):
        print(__doc__, file=sys.stderr)
        return 2
    engine = argv[0]
    work = pathlib.Path(argv[1]) if len(argv) > 1 else pathlib.Path(tempfile.mkdtemp(prefix=f"imgrec-{engine}-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(cluster(engine, work))
        print(f"{engine}: master {running.master}, {running.workers()} worker(s); logs and config in {work}")
        jar = job_server_jar(engine)
        if jar is None:
            print(f"no Beam {engine} job-server jar: run `make engines`; cluster only")
        else:
            served = stack.enter_context(job_server(engine, jar, running, work / "job-server"))
            print("run imgrec on it with:\n  python -m pipeline.run "
                  f"--config=configs/{engine}.yaml --input=data/sample --output=out/{engine} --overwrite "
                  + " ".join(served.runner_flags()[1:]))
        print("Ctrl-C stops everything", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
