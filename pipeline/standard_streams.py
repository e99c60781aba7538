"""Standard streams: those a command was started without, and writing to those it has.

A command started without a standard descriptor (`2>&-`, `>&-`, `<&-`): Python then sets
`sys.stderr` (or stdout, stdin) to None, and the descriptor is free: the next file the process
opens gets it, and whatever C code or a child process writes to "stderr" (libjpeg's warnings)
lands in that file, which may be a shard. The entry points call `open_closed_standard_streams`
first, which points each missing one at /dev/null. `say` writes what a command prints, and
`quiet_tensorflow` keeps TensorFlow's start-up lines out of what the commands that read datasets print.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Optional, TextIO

_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def open_closed_standard_streams() -> None:
    """Opens /dev/null on each of descriptors 0-2 that is closed, and gives Python a stream for it."""
    for descriptor, name, flags, mode in _STREAMS:
        with contextlib.suppress(OSError):  # open: nothing to do
            os.fstat(descriptor)
            continue
        null = os.open(os.devnull, flags)
        if null != descriptor:
            os.dup2(null, descriptor)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(descriptor, mode, closefd=False))


def quiet_tensorflow() -> None:
    """Before TensorFlow's import: its C++ logs (TF_CPP_MIN_LOG_LEVEL) and the oneDNN notice it
    prints twice even then (TF_ENABLE_ONEDNN_OPTS; these commands parse and compare records, no
    arithmetic that oneDNN changes) would precede every report and every one-line usage error.
    A user's own settings of either variable win."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def say(text: str, stream: Optional[TextIO] = None) -> None:
    """Progress, notes and errors go to stderr, with the logs: a scheduler reading stdout to the
    end (Airflow does) must never find stderr full; the summary goes to stdout. Best effort: the
    reader may be gone (`| head`) or the disk full, and the exit code says what happened anyway.
    After a failed write the stream's descriptor points at /dev/null, so Python's last flush
    does not fail again and change the exit code."""
    stream = stream or sys.stderr
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
