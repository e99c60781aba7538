"""No process of a killed run survives its driver (Linux).

The DirectRunner's multi_processing workers are started through `sh -c` by the driver and do
not notice when it dies: killed at the wrong moment (before they even connected), they wait
forever. The driver therefore starts this small watcher (`python -m pipeline.reaper MARKER`) and
exports MARKER (its pid and start time) to everything it starts. When the driver is gone, the
reaper kills every process that carries the marker in its environment, whatever started it,
and exits. After a normal run nothing carries it any more and the reaper simply exits.

Its pid-and-start-time helpers also tell the publisher whether the driver is still alive.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterator, Optional

DRIVER_ENV = "IMGREC_DRIVER"  # "<pid>:<start time>" of the driver
_POLL = 0.25


def process_start_time(pid: int) -> Optional[str]:
    """A live process's start time (/proc), which tells a pid apart from a later reuse of it;
    None for a process that is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def process_started_at(pid: int) -> Optional[float]:
    """When a live process started (seconds since the epoch, from /proc), or None."""
    ticks = process_start_time(pid)
    if ticks is None:
        return None
    with open("/proc/stat") as handle:
        boot = next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    return boot + int(ticks) / os.sysconf("SC_CLK_TCK")


def driver_marker() -> str:
    """This process's marker: its pid and start time."""
    return f"{os.getpid()}:{process_start_time(os.getpid()) or ''}"


def driver_alive(marker: str) -> bool:
    pid, _, started = marker.partition(":")
    if started and os.path.exists("/proc/self/stat"):
        return process_start_time(int(pid)) == started
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, as another user
        pass
    return True


def kill_marked(marker: str, also: bytes = b"") -> bool:
    """SIGKILLs the processes whose environment carries the driver's marker (and a variable
    starting with `also`, when given); False if there were none."""
    needle, found = f"{DRIVER_ENV}={marker}".encode(), False
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                variables = handle.read().split(b"\0")
            if needle in variables and (not also or any(v.startswith(also) for v in variables)):
                os.kill(int(entry), signal.SIGKILL)
                found = True
        except OSError:  # gone meanwhile
            continue
    return found


def wait_for_exit(marker: str) -> None:
    pid = int(marker.partition(":")[0])
    try:
        descriptor = os.pidfd_open(pid)
    except (AttributeError, OSError):
        descriptor = None
    if descriptor is not None and driver_alive(marker):
        select.select([descriptor], [], [])  # readable when the process exits
        os.close(descriptor)
    while driver_alive(marker):
        time.sleep(_POLL)


_started: set[str] = set()


@contextlib.contextmanager
def reaped() -> Iterator[None]:
    """While the block runs, every process the driver starts carries its marker; one reaper per
    driver process (a notebook or scheduler that runs many conversions starts one) kills them all
    if the driver dies. After the block, processes the driver starts are not marked."""
    if not os.path.exists("/proc/self/environ"):
        yield
        return
    marker = driver_marker()
    if marker not in _started:
        subprocess.Popen([sys.executable, "-m", "pipeline.reaper", marker], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         env={k: v for k, v in os.environ.items() if k != DRIVER_ENV})
        _started.add(marker)
    previous = os.environ.get(DRIVER_ENV)
    os.environ[DRIVER_ENV] = marker
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(DRIVER_ENV, None)
        else:
            os.environ[DRIVER_ENV] = previous


def main() -> None:
    """Once the driver is gone, kills what it left, until nothing is left (at most 2 s)."""
    marker = sys.argv[1]
    wait_for_exit(marker)
    for _ in range(20):
        if not kill_marked(marker):
            return
        time.sleep(0.1)


if __name__ == "__main__":
    main()
