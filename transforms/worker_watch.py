"""Worker processes exit when the imgrec driver that started them is gone.

The DirectRunner's multi_processing workers are started (through `sh -c`) by the driver and do
not notice when it is killed: they would go on converting images for a run that can no longer
publish. The driver names this module in Beam's `--beam_plugins`, which every SDK worker imports
at start-up, before it runs any step, and exports its pid and start time; importing the module
starts a thread that ends the worker as soon as that process no longer exists.

Importing it in any other process (a cluster worker, the driver itself) does nothing.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

DRIVER_ENV = "IMGREC_DRIVER"  # "<pid>:<start time>" of the driver, set by pipeline/run.py
_INTERVAL = 0.5


def process_start_time(pid: int) -> Optional[str]:
    """A live process's start time (Linux /proc), which tells a pid apart from a later reuse of
    it; None for a process that is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def driver_marker() -> str:
    return f"{os.getpid()}:{process_start_time(os.getpid()) or ''}"


def driver_alive(marker: str) -> bool:
    pid, _, started = marker.partition(":")
    if started and os.path.exists("/proc/self/stat"):
        return process_start_time(int(pid)) == started
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(marker: str) -> None:
    while driver_alive(marker):
        threading.Event().wait(_INTERVAL)
    os._exit(3)


def start() -> None:
    marker = os.environ.get(DRIVER_ENV)
    if marker and marker.partition(":")[0] != str(os.getpid()):
        threading.Thread(target=_watch, args=(marker,), name="imgrec-driver-watch", daemon=True).start()


start()
