"""Where the plain command's wall time goes, stage by stage, on the in-process FnApiRunner.

    python -m benchmarks.research.stage_timeline --input=benchmarks/corpus/10000 --output=/tmp/out \
        [--normalize=none ...]   # any pipeline.run flags; --runner=DirectRunner is added

Runs `pipeline.run.main` in this process with light wrappers (nothing in pipeline/ or
transforms/ is edited) and prints a timeline: imports, pipeline construction, the DirectRunner's
Prism attempt, every fused stage's bundles (wall seconds, by stage name) and, inside them, the
time spent in the per-element functions: ReadAndCheck (read + sha256 + header), the write stage's
per-shard DoFn call and its conversion threads, and publishing.
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import collections  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

marks: list[tuple[float, float, str]] = [(0.0, 0.0, "start")]
totals: collections.Counter = collections.Counter()
cpu_totals: collections.Counter = collections.Counter()
counts: collections.Counter = collections.Counter()
first_last: dict[str, list[float]] = {}
lock = threading.Lock()


def mark(label: str) -> None:
    marks.append((time.perf_counter() - T0, time.process_time(), label))


def account(name: str, seconds: float, start: float, cpu: float = 0.0) -> None:
    with lock:
        totals[name] += seconds
        cpu_totals[name] += cpu
        counts[name] += 1
        span = first_last.setdefault(name, [start, start + seconds])
        span[0], span[1] = min(span[0], start), max(span[1], start + seconds)


def timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            account(name, time.perf_counter() - start, start - T0, time.thread_time() - cpu)
    return wrapper


def timed_generator(name: str, fn):
    """Times a generator function, including the consumer's work between yields (the time this
    call occupies the stage), and separately the time inside the generator itself."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start, cpu_start = time.perf_counter(), time.thread_time()
        inside = inside_cpu = 0.0
        gen = fn(*args, **kwargs)
        while True:
            t, c = time.perf_counter(), time.thread_time()
            try:
                item = next(gen)
            except StopIteration:
                inside += time.perf_counter() - t
                inside_cpu += time.thread_time() - c
                break
            inside += time.perf_counter() - t
            inside_cpu += time.thread_time() - c
            yield item
        account(name + " (inside, this thread)", inside, start - T0, inside_cpu)
        account(name + " (call incl. downstream, this thread)", time.perf_counter() - start, start - T0,
                time.thread_time() - cpu_start)
    return wrapper


def main() -> None:
    import apache_beam  # noqa: F401
    mark("import apache_beam")
    import cv2  # noqa: F401
    mark("import cv2")
    import pipeline.run as run_module
    mark("import pipeline.run (and transforms)")

    from apache_beam.runners.direct import direct_runner
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    import pipeline.convert as convert
    import transforms.read as read
    import transforms.write_shards as write_shards
    import transforms.decode as decode
    import transforms.example as example
    import transforms.resize as resize
    import transforms.normalize as normalize
    import transforms.process as process

    read.ReadAndCheck.process = timed_generator("ReadAndCheck.process", read.ReadAndCheck.process)
    read.read_file = timed("read_file", read.read_file)
    write_shards.read_file = timed("read_file (write stage)", write_shards.read_file)
    write_shards.convert_planned_image = timed("convert_planned_image (threads)", write_shards.convert_planned_image)
    write_shards.write_tfrecord = timed("write_tfrecord (framing + write)", write_shards.write_tfrecord)
    write_shards._WriteShardFn.process = timed_generator("_WriteShardFn.process", write_shards._WriteShardFn.process)
    process.decode_image = timed("decode_image", process.decode_image)
    process.resize_image = timed("resize_image", process.resize_image)
    process.normalize_image = timed("normalize_image", process.normalize_image)
    process.encode_pixels = timed("encode_pixels", process.encode_pixels)
    process.build_example = timed("build_example", process.build_example)
    convert.finalize_dataset = timed("finalize_dataset", convert.finalize_dataset)
    convert.publish = timed("publish", convert.publish)

    original_run_pipeline = direct_runner.SwitchingDirectRunner.run_pipeline

    def run_pipeline(self, pipeline, options):
        mark("pipeline constructed; SwitchingDirectRunner.run_pipeline")
        return original_run_pipeline(self, pipeline, options)
    direct_runner.SwitchingDirectRunner.run_pipeline = run_pipeline

    original_fn_run = fn_runner.FnApiRunner.run_pipeline

    def fn_run(self, pipeline, options):
        mark("FnApiRunner.run_pipeline (after any Prism attempt)")
        return original_fn_run(self, pipeline, options)
    fn_runner.FnApiRunner.run_pipeline = fn_run

    original_stages = fn_runner.FnApiRunner.run_stages

    def run_stages(self, *args, **kwargs):
        mark("FnApiRunner.run_stages (graph optimized, executing)")
        try:
            return original_stages(self, *args, **kwargs)
        finally:
            mark("FnApiRunner.run_stages done")
    fn_runner.FnApiRunner.run_stages = run_stages

    stage_time: collections.Counter = collections.Counter()
    stage_cpu: collections.Counter = collections.Counter()
    stage_bundles: collections.Counter = collections.Counter()
    stage_span: dict[str, list[float]] = {}
    original_execute = fn_runner.FnApiRunner._execute_bundle

    def execute_bundle(self, context, bundle_context_manager, bundle_input):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return original_execute(self, context, bundle_context_manager, bundle_input)
        finally:
            name = bundle_context_manager.stage.name
            stage_time[name] += time.perf_counter() - start
            stage_cpu[name] += time.process_time() - cpu
            stage_bundles[name] += 1
            span = stage_span.setdefault(name, [start - T0, 0.0])
            span[1] = time.perf_counter() - T0
    fn_runner.FnApiRunner._execute_bundle = execute_bundle

    argv = ["--runner=DirectRunner", *sys.argv[1:]]
    mark("patched; calling pipeline.run.main")
    code = run_module.main(argv)
    mark(f"pipeline.run.main returned {code}")

    print("\n# timeline: wall s since this script started (+ delta), process CPU s (+ delta)")
    previous = previous_cpu = 0.0
    for t, cpu, label in marks:
        print(f"{t:8.2f} (+{t - previous:6.2f})  cpu {cpu:7.2f} (+{cpu - previous_cpu:6.2f})  {label}")
        previous, previous_cpu = t, cpu
    print("\n# fused stages, by wall time in their bundles (wall s, process CPU s, bundles, first start → last end)")
    for name, seconds in stage_time.most_common():
        if seconds >= 0.05:
            span = stage_span[name]
            print(f"{seconds:8.2f} {stage_cpu[name]:8.2f}  {stage_bundles[name]:5d}  {span[0]:7.2f} → {span[1]:7.2f}  "
                  f"{name[:150]}")
    print(f"{sum(stage_time.values()):8.2f} {sum(stage_cpu.values()):8.2f}  total in bundles;"
          f" process CPU overall {time.process_time():.2f} s")
    print("\n# functions (wall s and thread CPU s summed over calls/threads, calls, first start → last end, per call)")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        span = first_last[name]
        print(f"{seconds:8.2f} {cpu_totals[name]:8.2f}  {counts[name]:6d}  {span[0]:7.2f} → {span[1]:7.2f}  "
              f"{1e3 * seconds / counts[name]:8.3f} ms wall {1e3 * cpu_totals[name] / counts[name]:8.3f} ms CPU /call  {name}")


if __name__ == "__main__":
    main()
