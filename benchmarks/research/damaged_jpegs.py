"""Does imgrec refuse JPEGs cut inside their scan data (with an end marker appended after the
cut), and does it keep complete ones? Every source image is encoded in several ways (baseline,
quality 60, progressive, restart markers, 4:4:4, grey, grey progressive), then:

- complete: each encoding as is, and with bytes appended after its end marker;
- damaged: each cut at 30, 60, 90 and 99% of its length with an end marker appended, and each
  progressive one cut just before its last scan.

    python -m benchmarks.research.damaged_jpegs [--sources data/sample] [--complete 'GLOB' ...]
                                                [--cost_corpus benchmarks/corpus/10000 --rounds 6]

`--complete` adds existing JPEG files, decoded as they are. Prints one JSON line: per kind, how
many were written (decoded) and how many refused, and every complete file refused. With
`--cost_corpus`, also what the checks cost: the time to decode its first 1,000 files with the
checks over the time without them (the checks swapped out in this process), per round,
interleaved, one OpenCV thread.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import time

import cv2
import numpy as np

from transforms.images import decode
from transforms.images.decode import decode_image
from transforms.images.image_header import check_header
from transforms.rejections import InputRejected
from transforms.specs import ImageSpec

ENCODINGS = {
    "baseline": [cv2.IMWRITE_JPEG_QUALITY, 90],
    "quality60": [cv2.IMWRITE_JPEG_QUALITY, 60],
    "progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
    "restart8": [cv2.IMWRITE_JPEG_RST_INTERVAL, 8],
    "restart1_progressive": [cv2.IMWRITE_JPEG_RST_INTERVAL, 1, cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
    "444": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
    "grey": [],
    "grey_progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
}
CUTS = (0.3, 0.6, 0.9, 0.99)
END = b"\xff\xd9"


def encodings(bgr: np.ndarray) -> dict[str, bytes]:
    found = {}
    for name, params in ENCODINGS.items():
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY) if "grey" in name else bgr, params)
        assert ok, name
        found[name] = buf.tobytes()
    return found


def damaged(name: str, data: bytes) -> dict[str, bytes]:
    cut = {f"{name}_cut{round(100 * f)}": data[:int(len(data) * f)] + END for f in CUTS}
    if "progressive" in name:
        cut[f"{name}_before_last_scan"] = data[:data.rfind(b"\xff\xda")] + END
    return cut


def written(data: bytes, spec: ImageSpec) -> tuple[bool, str]:
    try:
        decode_image(data, check_header(data, spec), spec)
        return True, ""
    except InputRejected as exc:
        return False, str(exc)


# What the checks add to a decode, and what stands in for each without them.
UNCHECKED = {"call_capturing_stderr": lambda decode, on_raise=None: (decode(), ""),
             "refuse_made_up_pixels": lambda header, printed, source: None,
             "progression_gap": lambda data: None,
             "without_harmless_warnings": lambda data: data}


def check_cost(corpus: str, rounds: int) -> list[float]:
    """Decode time with the damage checks over the time without them, per round."""
    cv2.setNumThreads(1)
    files = sorted(glob.glob(f"{corpus}/**/*.jp*g", recursive=True))[:1000]
    datas = [open(path, "rb").read() for path in files]
    spec, checked = ImageSpec(), {name: getattr(decode, name) for name in UNCHECKED}

    headers = [check_header(data, spec) for data in datas]

    def seconds(functions: dict) -> float:
        for name, function in functions.items():
            setattr(decode, name, function)
        start = time.perf_counter()
        for data, header in zip(datas, headers):
            decode_image(data, header, spec)
        return time.perf_counter() - start

    try:
        return [seconds(checked) / seconds(UNCHECKED) for _ in range(rounds)]
    finally:
        for name, function in checked.items():
            setattr(decode, name, function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="data/sample", help="folder of images to encode (searched recursively)")
    parser.add_argument("--complete", nargs="*", default=[], help="globs of existing JPEGs, kept as they are")
    parser.add_argument("--cost_corpus", help="folder of JPEGs to time the checks on")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    spec = ImageSpec(max_pixels=10**9, max_decoded_bytes=2**34)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    refused_complete = []
    sources = sorted(p for p in glob.glob(f"{args.sources}/**/*", recursive=True)
                     if cv2.haveImageReader(p) and cv2.imread(p) is not None)
    for path in sources:
        for name, data in encodings(cv2.imread(path)).items():
            for kind, variant in (("complete", data), ("complete", data + b"appended after the end")):
                ok, why = written(variant, spec)
                counts[kind]["written" if ok else "refused"] += 1
                if not ok:
                    refused_complete.append(f"{path} {name}: {why}")
            for cut_name, cut in damaged(name, data).items():
                ok, _ = written(cut, spec)
                counts["damaged"]["written" if ok else "refused"] += 1
                if ok:
                    counts["damaged written"][cut_name.split("_cut")[0]] += 1
    existing = sorted({p for pattern in args.complete for p in glob.glob(pattern, recursive=True)})
    for path in existing:
        with open(path, "rb") as handle:
            ok, why = written(handle.read(), spec)
        counts["existing"]["written" if ok else "refused"] += 1
        if not ok:
            refused_complete.append(f"{path}: {why}")
    cost = {}
    if args.cost_corpus:
        ratios = check_cost(args.cost_corpus, args.rounds)
        cost = {"checked_over_unchecked": [round(r, 3) for r in ratios], "median": round(statistics.median(ratios), 3)}
    print(json.dumps({"sources": len(sources), "existing_files": len(existing),
                      **{kind: dict(counter) for kind, counter in counts.items()},
                      "refused_complete": refused_complete, **cost}))


if __name__ == "__main__":
    main()
