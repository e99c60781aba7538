"""Which installed packages differ from the lock: what moved when a venv of other releases
(`make test-newest`, `make test-oldest`) behaves differently from the locked one.

    python -m tests.lock_drift [--failed] requirements.lock
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys

from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#]+)")


def locked_versions(text: str) -> dict[str, str]:
    """{canonical name: version} of every `name==version` line of a pip requirements lock."""
    return {canonicalize_name(m.group(1)): m.group(2) for m in map(PIN.match, text.splitlines()) if m}


def installed_versions() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"]}


def drift(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package whose version differs, that only one side has; sorted by name."""
    lines = []
    for name in sorted(set(locked) | set(installed)):
        before, now = locked.get(name), installed.get(name)
        if before != now and name != "imgrec":
            lines.append(f"  {name}: {before or 'not locked'} -> {now or 'not installed'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock")
    parser.add_argument("--failed", action="store_true", help="say that the checks failed on these versions")
    args = parser.parse_args(argv)
    with open(args.lock, encoding="utf-8") as handle:
        lines = drift(locked_versions(handle.read()), installed_versions())
    if args.failed:
        print(f"imgrec failed on releases other than {args.lock}'s; these packages differ from the lock "
              "(the likeliest cause is among them):", file=sys.stderr)
    else:
        print(f"{len(lines)} packages differ from {args.lock}:")
    print("\n".join(lines) or "  none", file=sys.stderr if args.failed else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
