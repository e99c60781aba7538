"""The Python API behind `import imgrec`: the command line's commands as functions."""
from __future__ import annotations

import sys
from typing import Any, Optional, TextIO, Union

Setting = Union[str, int, float, bool, list, tuple, None]


def as_flags(settings: dict[str, Setting]) -> list[str]:
    """Keyword arguments as command-line flags: `height=160` → `--height=160`, `overwrite=True`
    → `--overwrite`, `overwrite=False` → `--no_overwrite`, a list → its comma-separated items;
    None leaves the setting out."""
    flags = []
    for name, value in settings.items():
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no_{name}")
        elif isinstance(value, (list, tuple)):
            flags.append(f"--{name}={','.join(map(str, value))}")
        else:
            flags.append(f"--{name}={value}")
    return flags


def convert(input: str, output: str, *, config: Optional[str] = None, **settings: Setting) -> Any:
    """Converts `input` (a folder of class folders, a glob or a CSV/JSONL manifest) into a
    published dataset in `output`, as `imgrec run` does; returns the `Conversion` (its `metadata`
    is the published metadata.json, None when the dataset was kept unchanged). Raises a
    `UsageError` or `RunFailed` (`ImgrecError`s) where the command would exit with 2 or 1."""
    from pipeline.run import configure_logging
    from pipeline.run import convert as run_conversion

    if settings.pop("verbose", None):  # `-v`/`--verbose`, which `imgrec run` reads before parsing
        configure_logging(verbose=True)
    argv = [f"--input={input}", f"--output={output}", *([f"--config={config}"] if config else []),
            *as_flags(settings)]
    return run_conversion(argv)


def verify(output: str, samples: int = 8, out_dir: Optional[str] = None, stream: Optional[TextIO] = None) -> bool:
    """Checks a finished dataset end to end as `imgrec verify` does (report to `stream`, stdout by
    default; contact sheet and class counts as PNGs); True when every check passed."""
    from pipeline.read.verify import verify_dataset

    return verify_dataset(output, samples, out_dir, stream or sys.stdout)


def export_tfds(output: str, name: Optional[str] = None) -> Any:
    """Makes a dataset loadable with `tfds.builder_from_directory(output)`, as `imgrec export-tfds`."""
    from pipeline.read.tfds_export import export

    return export(output, name)
