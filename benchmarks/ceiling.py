"""The ceiling: imgrec's per-image work in a bare loop, one process per core, no framework.

Each process takes an interleaved slice of the sorted input files and, for every file, does what
the pipeline does per image with the same functions: read the bytes, sha256 them, decode, resize,
normalize, encode, build the Example, and frame it into its own TFRecord file. There is no
planning, grouping, shuffling or metadata: whatever the pipeline costs beyond this loop is
framework overhead. (The pipeline also reads and hashes each file a second time, up front, to
plan splits by content; that is not part of this loop.)

    python -m benchmarks.ceiling INPUT_DIR OUTPUT_DIR [--config configs/seed.yaml] [--processes 2]
                                 [imgrec's image flags: --normalize=none --encoding=jpeg --quality=90 ...]

Prints one JSON line: images, per-process loop seconds, wall seconds, output bytes.
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import time
from typing import Sequence

import cv2

from pipeline.options import ImgrecOptions, build_spec, read_config
from transforms.files import content_hash, read_input
from transforms.images.image_header import check_header
from transforms.images.process import image_to_record
from transforms.inputs.discover import label_from_parent
from transforms.inputs.labels import build_label_map
from transforms.write.example import RecordFields
from transforms.write.tfrecord import write_record


def list_images(input_dir: str) -> list[tuple[str, str]]:
    """(path, label) pairs of a class-folder tree, sorted by path."""
    return [(p, label_from_parent(p))
            for p in sorted(glob.glob(os.path.join(input_dir, "*", "*"))) if os.path.isfile(p)]


def convert_slice(args: tuple) -> dict:
    """One worker: files[index::count] → OUTPUT_DIR/part-<index>.tfrecord."""
    files, label_ids, spec, keys, max_file_bytes, output_dir, index, count, cv2_threads = args
    cv2.setNumThreads(cv2_threads)
    path = os.path.join(output_dir, f"part-{index:05d}-of-{count:05d}.tfrecord")
    start, cpu_start = time.perf_counter(), time.process_time()
    images = num_bytes = 0
    with open(path, "wb") as handle:
        for source, label in files[index::count]:
            data = read_input(source, max_file_bytes)
            fields = RecordFields(label_ids[label], label, source, content_hash(data))
            record = image_to_record(data, check_header(data, spec), fields, spec, keys).data
            write_record(handle, record)
            images += 1
            num_bytes += len(record)
    return {"index": index, "images": images, "record_bytes": num_bytes,
            "loop_seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start}


def run_ceiling(input_dir: str, output_dir: str, config: str, processes: int,
                cv2_threads: int = 1, image_flags: Sequence[str] = ()) -> dict:
    flags = [f"--input={input_dir}", f"--output={output_dir}", *image_flags]
    spec = build_spec(read_config(config), ImgrecOptions(flags))
    files = list_images(input_dir)
    label_ids = build_label_map(label for _, label in files)
    os.makedirs(output_dir, exist_ok=True)
    start = time.perf_counter()
    jobs = [(files, label_ids, spec.image, spec.features, spec.input.max_file_bytes, output_dir, i, processes,
             cv2_threads)
            for i in range(processes)]
    if processes == 1:
        parts = [convert_slice(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            parts = pool.map(convert_slice, jobs, chunksize=1)
    wall = time.perf_counter() - start
    images = sum(p["images"] for p in parts)
    return {"images": images, "processes": processes, "cv2_threads": cv2_threads,
            "loop_seconds": [round(p["loop_seconds"], 3) for p in parts], "pool_seconds": round(wall, 3),
            "steady_images_per_s": round(images / max(p["loop_seconds"] for p in parts), 1),
            "cpu_ms_per_image": round(1e3 * sum(p["cpu_seconds"] for p in parts) / max(images, 1), 3),
            "record_bytes": sum(p["record_bytes"] for p in parts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--config", default="configs/seed.yaml")
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--cv2_threads", type=int, default=1,
                        help="OpenCV threads per process (1: one process per core does all the work)")
    args, image_flags = parser.parse_known_args()
    print(json.dumps(run_ceiling(args.input, args.output, args.config, args.processes, args.cv2_threads,
                                 image_flags)))


if __name__ == "__main__":
    main()
