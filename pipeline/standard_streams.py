"""Standard descriptors a command was started without (`2>&-`, `>&-`, `<&-`).

Python then sets `sys.stderr` (or stdout, stdin) to None, and the descriptor is free: the next
file the process opens gets it, and whatever C code or a child process writes to "stderr"
(libjpeg's warnings) lands in that file, which may be a shard. The entry points call
`open_closed_standard_streams` first, which points each missing one at /dev/null.
"""
from __future__ import annotations

import os
import sys

_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def open_closed_standard_streams() -> None:
    """Opens /dev/null on each of descriptors 0-2 that is closed, and gives Python a stream for it."""
    for descriptor, name, flags, mode in _STREAMS:
        try:
            os.fstat(descriptor)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)
        if null != descriptor:
            os.dup2(null, descriptor)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(descriptor, mode, closefd=False))
