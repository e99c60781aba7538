"""The `imgrec` command: `imgrec run|verify|export-tfds ...`.

Each subcommand is the module entry point of the same name, so `imgrec run ARGS` and
`python -m pipeline.run ARGS` are the same command with the same exit codes.
"""
from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

from pipeline.interrupts import exit_quietly, exit_until_handled
from pipeline.standard_streams import open_closed_standard_streams

USAGE = """usage: imgrec COMMAND [ARGS]

commands:
  run          convert images + labels into sharded TFRecords (python -m pipeline.run)
  verify       check a finished dataset end to end (python -m pipeline.read.verify)
  export-tfds  make a dataset loadable with tfds.builder_from_directory (python -m pipeline.read.tfds_export)

`imgrec COMMAND --help` lists a command's options; `imgrec run --config=seed` uses a shipped config."""


# The other commands: their module, whose main(argv, prog) is imported only when the command runs.
MODULES = {"verify": "pipeline.read.verify", "export-tfds": "pipeline.read.tfds_export"}
COMMANDS = ("run", *MODULES)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, *rest = argv
    if command not in COMMANDS:
        print(f"imgrec: error: unknown command {command!r}; expected one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command != "run":
        return importlib.import_module(MODULES[command]).main(rest, prog=f"imgrec {command}")
    if {"-h", "--help", "--help-all"} & set(rest):  # answered before Beam's imports, which take a second or more
        from pipeline.flags import help_text

        print(help_text(all_flags="--help-all" in rest), end="")
        return 0
    exit_until_handled()
    from pipeline.run import main as run_main

    return run_main(rest)


def entry_point(argv: Optional[Sequence[str]] = None) -> None:
    """The `imgrec` console script (and `python -m pipeline.run`, with argv ["run", ...])."""
    open_closed_standard_streams()
    exit_quietly(main(argv))


if __name__ == "__main__":
    entry_point()
