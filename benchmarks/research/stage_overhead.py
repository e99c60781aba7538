"""Fixed and per-element costs of Beam on the in-process FnApiRunner, and the coders imgrec uses.

    python -m benchmarks.research.stage_overhead [--sizes 1000,10000] [--repeat 3]

1. Import times (fresh interpreter each, median of --repeat): python itself, apache_beam, cv2,
   tensorflow, pipeline.run.
2. The coder Beam picks for each PCollection of imgrec's pipeline (built, not run).
3. Bare pipelines on the FnApiRunner: Create(n elements) → [Reshuffle → Map] x k → count, with
   elements as frozen dataclasses (Beam's default coder for them), as plain tuples, and as
   dataclasses with a registered compact coder. The per-element cost of one stage boundary is the
   slope over n and k.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import time


def import_times(repeat: int) -> None:
    snippets = {"python -c pass": "pass", "import apache_beam": "import apache_beam", "import cv2": "import cv2",
                "import numpy": "import numpy", "import tensorflow": "import tensorflow",
                "import pipeline.run": "import pipeline.run",
                "apache_beam + Pipeline() + FnApiRunner 1 element":
                    "import apache_beam as beam\n"
                    "from apache_beam.runners.portability.fn_api_runner import FnApiRunner\n"
                    "p = beam.Pipeline(runner=FnApiRunner()); _ = p | beam.Create([1]) | beam.Map(str)\n"
                    "p.run().wait_until_finish()"}
    results = {k: [] for k in snippets}
    for _ in range(repeat):
        for name, code in snippets.items():  # interleaved
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            results[name].append(time.perf_counter() - start)
    print("# 1. wall seconds of a fresh interpreter running each snippet (median of "
          f"{repeat}; includes ~the 'python -c pass' start-up)")
    for name, values in results.items():
        print(f"  {statistics.median(values):6.2f}  {name}")


def pipeline_coders() -> None:
    import apache_beam as beam
    from apache_beam.coders import coders as beam_coders

    from pipeline.convert import ConvertToTFRecords
    from pipeline.options import ImgrecOptions, build_spec

    options = ImgrecOptions(["--input=benchmarks/corpus/400", "--output=/tmp/unused", "--normalize=none"])
    spec = build_spec({}, options)
    p = beam.Pipeline()
    _ = p | ConvertToTFRecords(spec, "/tmp/unused-staging", {"run_id": "x"}, None)
    proto = p.to_runner_api()
    from apache_beam.runners.pipeline_context import PipelineContext
    context = PipelineContext(proto.components)
    seen = {}
    for pcoll_id, pcoll in proto.components.pcollections.items():
        coder = context.coders.get_by_id(pcoll.coder_id)
        label = pcoll.unique_name
        if any(s in label for s in ("ReadAndCheck", "AttachLabelId", "KeyByContent", "GroupCopies", "ToSplitUnits",
                                    "HashSplit", "KeyByShard", "GroupShards", "SpreadCandidates", "KeepImageFiles")):
            seen[label] = repr(coder)[:140]
    print("\n# 2. coders of imgrec's main PCollections (Beam picks them from type hints)")
    for label, coder in sorted(seen.items()):
        print(f"  {label[:70]:70s} {coder}")
    del beam_coders


@dataclasses.dataclass(frozen=True)
class Item:
    """Shaped like imgrec's SourceImage."""

    path: str
    label: str
    content_hash: str
    format: str
    width: int
    height: int


def make_items(n: int) -> list[Item]:
    return [Item(f"/data/corpus/10000/class_{i % 8}/image_{i:06d}.jpg", f"class_{i % 8}", f"{i:064x}", "jpeg",
                 500, 400) for i in range(n)]


def bare_pipelines(sizes: list[int], boundaries: list[int], repeat: int) -> None:
    import apache_beam as beam
    from apache_beam import coders
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    class ItemCoder(coders.Coder):
        _tuple = coders.TupleCoder([coders.StrUtf8Coder()] * 4 + [coders.VarIntCoder()] * 2)

        def encode(self, value):
            return self._tuple.encode(dataclasses.astuple(value))

        def decode(self, encoded):
            return Item(*self._tuple.decode(encoded))

        def is_deterministic(self):
            return True

    def to_tuple(item):
        return dataclasses.astuple(item)

    def run(kind: str, n: int, k: int) -> float:
        if kind == "dataclass, compact coder":
            coders.registry.register_coder(Item, ItemCoder)
        else:
            coders.registry._coders.pop(Item, None)
        elements = make_items(n)
        if kind == "tuple":
            elements = [to_tuple(e) for e in elements]
        p = beam.Pipeline(runner=FnApiRunner())
        pc = p | beam.Create(elements, reshuffle=False)
        for i in range(k):
            pc = (pc | f"Reshuffle{i}" >> beam.Reshuffle()
                  | f"Touch{i}" >> beam.Map(lambda x: x).with_output_types(type(elements[0]) if kind != "tuple" else tuple))
        _ = pc | beam.combiners.Count.Globally()
        start = time.perf_counter()
        p.run().wait_until_finish()
        return time.perf_counter() - start

    kinds = ("dataclass, default coder", "tuple", "dataclass, compact coder")
    times = {}
    for _ in range(repeat):
        for kind in kinds:
            for n in sizes:
                for k in boundaries:
                    times.setdefault((kind, n, k), []).append(run(kind, n, k))
    print(f"\n# 3. FnApiRunner, Create(n) → (Reshuffle → Map) x k → Count; wall s, median of {repeat}")
    for kind in kinds:
        for k in boundaries:
            row = "  ".join(f"n={n}: {statistics.median(times[(kind, n, k)]):6.2f}" for n in sizes)
            print(f"  {kind:26s} k={k}  {row}")
        n0, n1 = sizes[0], sizes[-1]
        k0, k1 = boundaries[0], boundaries[-1]
        med = {key: statistics.median(v) for key, v in times.items() if key[0] == kind}
        slope_k1 = (med[(kind, n1, k1)] - med[(kind, n0, k1)]) / (n1 - n0)
        slope_k0 = (med[(kind, n1, k0)] - med[(kind, n0, k0)]) / (n1 - n0)
        per_boundary = (slope_k1 - slope_k0) / (k1 - k0)
        print(f"  {kind:26s} per element: {1e6 * slope_k0:6.1f} µs with k={k0}, {1e6 * slope_k1:6.1f} µs with k={k1};"
              f" {1e6 * per_boundary:6.1f} µs per element per (Reshuffle → Map)")


def coder_micro() -> None:
    from apache_beam import coders

    items = make_items(10_000)
    tuples = [dataclasses.astuple(i) for i in items]
    fast = coders.registry.get_coder(Item)
    pickle_coder = coders.PickleCoder()
    tuple_coder = coders.TupleCoder([coders.StrUtf8Coder()] * 4 + [coders.VarIntCoder()] * 2)
    print("\n# 4. coder round trip (encode + decode) per element, µs; encoded size, bytes")
    for name, coder, values in (("registry coder for the dataclass: " + type(fast).__name__, fast, items),
                                ("PickleCoder, dataclass", pickle_coder, items),
                                ("FastPrimitivesCoder, tuple", coders.FastPrimitivesCoder(), tuples),
                                ("TupleCoder(StrUtf8 x4, VarInt x2), tuple", tuple_coder, tuples)):
        impl = coder.get_impl()
        start = time.perf_counter()
        for v in values:
            impl.decode(impl.encode(v))
        us = 1e6 * (time.perf_counter() - start) / len(values)
        print(f"  {us:6.2f} µs  {len(impl.encode(values[0])):4d} B  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--boundaries", default="1,3")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip_imports", action="store_true")
    args = parser.parse_args()
    if not args.skip_imports:
        import_times(args.repeat)
    pipeline_coders()
    coder_micro()
    bare_pipelines([int(s) for s in args.sizes.split(",")], [int(b) for b in args.boundaries.split(",")], args.repeat)


if __name__ == "__main__":
    main()
