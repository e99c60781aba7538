"""Per-photo CPU of decode + resize paths on 12-MP JPEGs, and the page faults of fresh buffers.

    python -m benchmarks.research.page_faults [--photos benchmarks/corpus/photos-300] [--mallopt]

glibc serves allocations above its mmap threshold (at most 32 MiB by default) with a fresh mmap
and unmaps them on free, so every 36 MB decode buffer is faulted in again (~9,400 minor faults per
4000x3000 photo). --mallopt raises M_MMAP_THRESHOLD to 256 MiB (and M_TRIM_THRESHOLD to 512 MiB)
first, so freed buffers are reused. One OpenCV thread; thread CPU time (user + sys).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import resource
import time

import cv2
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", default="benchmarks/corpus/photos-300")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--mallopt", action="store_true")
    args = parser.parse_args()
    if args.mallopt:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 28)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 29)  # M_TRIM_THRESHOLD
    cv2.setNumThreads(1)
    paths = sorted(glob.glob(f"{args.photos}/*/*.jpg"))[: args.n]
    datas = [np.fromfile(p, np.uint8) for p in paths]
    rgb4 = cv2.IMREAD_REDUCED_GRAYSCALE_4 | cv2.IMREAD_COLOR_RGB  # reduced 1/4, 3-channel RGB
    area = dict(interpolation=cv2.INTER_AREA)
    chains = {
        "imgrec today: imdecodeWithMetadata(UNCHANGED) + cvtColor full + area": lambda d: cv2.resize(
            cv2.cvtColor(cv2.imdecodeWithMetadata(d, cv2.IMREAD_UNCHANGED)[0], cv2.COLOR_BGR2RGB), (224, 224), **area),
        "imdecode(IMREAD_COLOR_RGB) + area": lambda d: cv2.resize(cv2.imdecode(d, cv2.IMREAD_COLOR_RGB), (224, 224), **area),
        "imdecodeWithMetadata(REDUCED 1/4, RGB) + area": lambda d: cv2.resize(
            cv2.imdecodeWithMetadata(d, rgb4)[0], (224, 224), **area),
    }
    print(f"{len(datas)} photos, mallopt={args.mallopt}")
    for rnd in range(2):  # the first round warms up
        for name, fn in chains.items():
            r0, t = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
            for d in datas:
                fn(d)
            r1, cpu = resource.getrusage(resource.RUSAGE_SELF), time.thread_time() - t
            if rnd:
                print(f"  {1e3 * cpu / len(datas):6.1f} ms CPU/photo ({1e3 * (r1.ru_stime - r0.ru_stime) / len(datas):5.1f}"
                      f" sys), minor faults/photo {(r1.ru_minflt - r0.ru_minflt) / len(datas):6.0f}  {name}")


if __name__ == "__main__":
    main()
