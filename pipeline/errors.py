"""Why a run stops, and the exit code each reason gets (schedulers rely on them).

    0  a finished dataset is in the output (written now, or kept because nothing changed)
    1  the run failed: the pipeline failed, the error budget was exceeded, no images, ...
    2  usage: bad flags or config, or refused before any work (output not a dataset, ...)
    3  the output is locked by another run that is still going
  130  interrupted by SIGINT or SIGTERM (the message says what the output holds)
"""
from __future__ import annotations

import argparse
from typing import NoReturn


class ImgrecError(Exception):
    exit_code = 1


class RunFailed(ImgrecError):
    """The run did its work but must not publish: too many errors, no images, counts off."""


class OutOfSpace(ImgrecError):
    """The output's filesystem is full or over quota: the machine's state, not a bug, so one
    line and no traceback."""


class UsageError(ImgrecError):
    """Bad flags, config or input layout; also refusals before any work is done."""

    exit_code = 2


class OutputLocked(ImgrecError):
    exit_code = 3


class Interrupted(ImgrecError):
    exit_code = 130


class CommandLineParser(argparse.ArgumentParser):
    """argparse for imgrec's commands: a bad argument is a UsageError (one `imgrec: error:`
    line, exit 2) instead of the usage text and a second line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
