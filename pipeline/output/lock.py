"""One run at a time per output folder: `OUTPUT/.imgrec.lock`.

The driver takes the lock before it converts anything and removes it after publishing (or
failing). The lock file records its owner (run id, host, pid, start time) and a heartbeat the
driver refreshes while the run goes on. Right before publishing, the pipeline's last step checks
that the lock is still this run's and, on the driver's host, that the driver is alive
(`check_publisher`).

On a local (or NFS) folder the lock is an exclusive `flock` on the file: the kernel releases it
when the driver dies, however it dies, so a killed run never blocks the next one. On S3 and GCS
the lock file is created with the store's own atomic create-if-absent (S3's conditional write
`If-None-Match: *`, GCS's precondition `ifGenerationMatch=0`: transforms/object_stores.py), so
of two runs starting together exactly one gets it. A lock whose owner is known dead is taken
over: its driver ran on this host and its process is gone, or its heartbeat is older than
`STALE_AFTER` (a driver on another host, which this one cannot see). Taking over (and any store
without an atomic create) writes the lock, reads it back after a pause and must still find it
ours: two runs taking over the same dead lock within that pause could both proceed; the check
before publishing still stops the second one from replacing a dataset published meanwhile. To
clear a lock by hand, delete the file (only when no run is alive).
"""
from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import socket
import threading
import time
from typing import Optional

from pipeline.errors import OutputLocked, RunFailed
from pipeline.reaper import driver_alive, driver_marker, process_started_at
from transforms import files, object_stores
from transforms.dataset_format import LOCK_FILE, join

HEARTBEAT_SECONDS = 30.0
STALE_AFTER = datetime.timedelta(minutes=10)
_SETTLE_SECONDS = 2.0  # object stores: pause between writing the lock and reading it back


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class LockOwner:
    run_id: str
    host: str
    pid: int
    started: str
    heartbeat: str
    process: str = ""  # pid and process start time, so a reused pid is not taken for the driver

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "LockOwner":
        return cls(**json.loads(text))

    def is_stale(self, now: datetime.datetime) -> bool:
        return now - datetime.datetime.fromisoformat(self.heartbeat) > STALE_AFTER

    def alive_here(self) -> bool:
        """This host's owner process still runs: the same process (pid and start time), or, for
        a lock that only names a pid, a process with that pid that is older than the lock."""
        if self.process and ":" in self.process and self.process.split(":")[1]:
            return driver_alive(self.process)
        started = process_started_at(self.pid)
        return started is not None and started <= datetime.datetime.fromisoformat(self.started).timestamp() + 1

    def describe(self) -> str:
        return (f"run {self.run_id} (host {self.host}, pid {self.pid}, started {self.started}, "
                f"last heartbeat {self.heartbeat})")


def _read(path: str) -> Optional[LockOwner]:
    try:
        return LockOwner.from_json(files.read_bytes(path).decode("utf-8"))
    except Exception:  # gone, or half-written by a dying run: treat as absent / unreadable
        return None


def _same_file(path: str, descriptor: int) -> bool:
    """Whether the open `descriptor` is still the file at `path` (not unlinked or replaced)."""
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def run_alive(output: str) -> bool:
    """Whether the run `output`'s lock file names may be alive, judged from the file alone (taking
    the lock to see would refuse a run starting there): its driver runs on this host, or, on
    another, its heartbeat is recent. An unreadable owner (a run that has just created the file)
    may be alive."""
    owner = _read(join(output, LOCK_FILE))
    if owner is None:
        return True
    if owner.host == socket.gethostname():
        return owner.alive_here()
    return not owner.is_stale(_now())


def check_publisher(output: str, run_id: str) -> None:
    """Run where the dataset is published (the pipeline's last step, on a worker): the lock must
    still belong to this run and, when the driver runs on this host, the driver must be alive, so
    a killed run never publishes. Workers on other hosts (Dataflow) cannot see the driver and
    publish as the job's last step even if the launcher was stopped, as Dataflow jobs do."""
    path = join(output, LOCK_FILE)
    owner = _read(path)
    if owner is None or owner.run_id != run_id:
        raise RunFailed(f"{path} no longer belongs to this run (now: {owner.describe() if owner else 'nobody'}); "
                        "nothing was published")
    if owner.host == socket.gethostname() and not driver_alive(owner.process or str(owner.pid)):
        raise RunFailed(f"the driver of run {run_id} (pid {owner.pid}) is gone; nothing was published")


def check_run_goes_on(output: str, run_id: str) -> None:
    """Run by workers as each part finishes: the lock must still name this run. A driver that a
    signal stopped cancels its job and releases the lock, but Beam's Flink job server does not
    stop a batch job it was asked to cancel (it only stops waiting for it), so the job would
    convert every image and write the staging folder back; it fails here instead."""
    path = join(output, LOCK_FILE)
    owner = _read(path)
    if owner is None or owner.run_id != run_id:
        raise RunFailed(f"run {run_id} was stopped: {path} no longer belongs to it (now: "
                        f"{owner.describe() if owner else 'nobody'}); this job stops converting")


class OutputLock:
    """Held while a run converts and publishes into `output`."""

    def __init__(self, output: str, run_id: str):
        self.path = join(output, LOCK_FILE)
        self._run_id = run_id
        self._host = socket.gethostname()
        self._started = _now().isoformat(timespec="seconds")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._descriptor: Optional[int] = None  # local: the open, flocked lock file
        self._written = 0  # its length

    def _owner(self) -> LockOwner:
        return LockOwner(self._run_id, self._host, os.getpid(), self._started, _now().isoformat(timespec="seconds"),
                         driver_marker())

    def _lock_local(self, path: str) -> bool:
        """flock the file at `path`; False if a live process holds it. The file must still be the
        one at `path` once locked (a releasing run unlinks it before unlocking)."""
        while True:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                return False
            same = _same_file(path, descriptor)
            if same and not self._held_by_another_run():
                self._descriptor = descriptor
                try:
                    self._write()
                except OSError:  # a full disk: the flock must not outlive this failure (until the process exits)
                    os.unlink(path)
                    self._descriptor = None
                    os.close(descriptor)
                    raise
                return True
            os.close(descriptor)
            if same:
                return False

    def _held_by_another_run(self) -> bool:
        """The flock is ours, but the file may name a live run on this host that holds it some
        other way (a filesystem without flock, an older imgrec): then it is still taken."""
        owner = _read(self.path)
        return owner is not None and owner.run_id != self._run_id and owner.host == self._host and not self._dead(owner)

    def _lock_remote(self) -> bool:
        owner = _read(self.path)
        if owner is None:
            created = object_stores.create_exclusive(self.path, self._owner().to_json().encode("utf-8"))
            if created is not None:
                return created
        elif not self._dead(owner):
            return False
        self._write()
        time.sleep(_SETTLE_SECONDS)
        return self.holds()

    def _dead(self, owner: LockOwner) -> bool:
        """The owner can no longer be running: on this host its process is gone, elsewhere its
        heartbeat stopped long ago."""
        return owner.is_stale(_now()) or (owner.host == self._host and not owner.alive_here())

    def _write(self) -> None:
        text = self._owner().to_json().encode("utf-8")
        if self._descriptor is not None:
            # Overwritten in place, never emptied first: a reader (check_publisher, a run refused
            # the lock) sees a whole owner at every moment. JSON allows the trailing spaces that
            # pad a shorter text over the longer one.
            text = text.ljust(self._written)
            os.pwrite(self._descriptor, text, 0)
            os.ftruncate(self._descriptor, len(text))
            self._written = len(text)
            return
        with files.create(self.path) as handle:
            handle.write(text)

    def acquire(self) -> "OutputLock":
        """Takes the lock; raises OutputLocked if a live run holds it."""
        local = files.local_path(self.path)
        if not (self._lock_local(local) if local is not None else self._lock_remote()):
            # The owner, given a moment to appear: a run that has just taken the lock has created
            # the file but may not have written into it yet.
            deadline = time.monotonic() + 1.0
            while (owner := _read(self.path)) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            raise OutputLocked(
                f"{self.path} is held by {owner.describe() if owner else 'another run'}; wait for that run "
                f"to finish, or, if no such run is alive, delete {self.path}")
        self._thread = threading.Thread(target=self._beat, name="imgrec-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if self._descriptor is not None or self.holds():
                self._write()

    def holds(self) -> bool:
        if self._descriptor is not None:
            return _same_file(files.local_path(self.path), self._descriptor)
        owner = _read(self.path)
        return owner is not None and owner.run_id == self._run_id

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.holds():
            files.delete([self.path])
        if self._descriptor is not None:
            os.close(self._descriptor)  # unlocks, after the unlink: see _lock_local
            self._descriptor = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()
