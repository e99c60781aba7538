"""Plain-text tables for the terminal: the run summary, the verifier and the benchmarks."""
from __future__ import annotations

import re
from typing import Sequence

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(value: object) -> str:
    """A cell on one line: control characters (a class folder named "a\nb") are shown escaped."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(value))


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Columns sized to their widest cell; the first column left-aligned, the others right-aligned,
    a dashed rule under the header."""
    cells = [[_one_line(c) for c in header], *([_one_line(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return indent + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                  for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join([line(cells[0]), indent + "  ".join("-" * w for w in widths),
                      *(line(row) for row in cells[1:])])


def format_bytes(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"


def counted(n: int, noun: str) -> str:
    """"1 shard", "2 shards": a count and its noun in the right number."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
