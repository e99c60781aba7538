"""Where one imgrec run's time goes, on the DirectRunner's FnApiRunner: the import, building
the job, each fused stage (start and duration), and the rest.

    python -m benchmarks.stages --input=benchmarks/corpus/10000 --output=/tmp/out --normalize=none [...]

Every flag goes to `python -m pipeline.run`. Stages under --min_ms (default 40) are summed, not
listed. It times the FnApiRunner's bundles by wrapping its `_execute_bundle`, a Beam internal:
a profiling aid, not part of imgrec.
"""
from __future__ import annotations

import sys
import time

START = time.perf_counter()

from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: E402

import pipeline.run as imgrec_run  # noqa: E402
from pipeline import interrupts  # noqa: E402


def short_name(stage: str) -> str:
    """A fused stage's first and last steps, without Beam's prefixes: enough to recognise it."""
    steps = [step.strip("()") for step in stage.split(")+(")]
    for prefix in ("ref_AppliedPTransform_", "ConvertToTFRecords/", "ConvertToTFRecords-"):
        steps = [step.replace(prefix, "") for step in steps]
    return steps[0] if len(steps) == 1 else f"{steps[0]} ... {steps[-1]}"


def main(argv: list[str]) -> None:
    min_ms = 40.0
    if argv and argv[0].startswith("--min_ms="):
        min_ms, argv = float(argv[0].split("=", 1)[1]), argv[1:]
    imported = time.perf_counter() - START
    bundles: list[tuple[float, float, str]] = []
    execute = fn_runner.FnApiRunner._execute_bundle

    def timed(self, context, manager, *args, **kwargs):
        began = time.perf_counter()
        try:
            return execute(self, context, manager, *args, **kwargs)
        finally:
            bundles.append((began - START, time.perf_counter() - began, manager.stage.name))

    fn_runner.FnApiRunner._execute_bundle = timed
    code = 1
    try:
        code = imgrec_run.main(argv)
    finally:
        end = time.perf_counter() - START
        print(f"\nimports until pipeline.run was loaded: {imported:.2f} s", file=sys.stderr)
        if bundles:
            print(f"first stage starts at {bundles[0][0]:.2f} s", file=sys.stderr)
        small = sum(seconds for _, seconds, _ in bundles if seconds * 1e3 < min_ms)
        for began, seconds, name in bundles:
            if seconds * 1e3 >= min_ms:
                print(f"  at {began:6.2f} s  {seconds:6.2f} s  {short_name(name)[:120]}", file=sys.stderr)
        print(f"stages under {min_ms:g} ms: {small:.2f} s in all", file=sys.stderr)
        if bundles:
            last = bundles[-1][0] + bundles[-1][1]
            print(f"after the last stage until main returned: {end - last:.2f} s (total {end:.2f} s)",
                  file=sys.stderr)
    interrupts.exit_quietly(code)


if __name__ == "__main__":
    main(sys.argv[1:])
