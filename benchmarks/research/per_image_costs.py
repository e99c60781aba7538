"""Cost of every per-image step of imgrec's conversion, one thread, on the ImageNet-like corpus.

    python -m benchmarks.research.per_image_costs [--corpus benchmarks/corpus/10000] [--n 1000]

For each image the whole chain runs --repeat times back to back (so each step sees the cache state
it has in the pipeline: the decoded image is hot when it is resized), each step timed in thread
CPU time (robust to other load on a shared machine); per step, the fastest repeat of each image
is kept and the mean over images reported. Plain command settings: 224x224 stretch, cubic, raw
uint8; float32 (unit) and JPEG q90 steps, and alternatives, are timed on the same images.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import os
import pathlib
import tempfile
import time

import cv2
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="benchmarks/corpus/10000")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cv2.setNumThreads(1)

    import tensorflow as tf
    from apache_beam.io.filesystems import FileSystems

    from transforms.decode import apply_orientation, to_rgb
    from transforms.example import RecordFields, build_example, encode_pixels
    from transforms.image_header import jpeg_has_eoi, read_header
    from transforms.normalize import normalize_image
    from transforms.resize import resize_image
    from transforms.specs import FeatureKeys, ImageSpec
    from transforms.write_shards import write_tfrecord

    paths = sorted(str(p) for p in pathlib.Path(args.corpus).glob("*/*.jpg"))
    paths = paths[:: max(1, len(paths) // args.n)][: args.n]
    uint8, unit = ImageSpec(normalize="none"), ImageSpec(normalize="unit")
    jpeg = ImageSpec(normalize="none", encoding="jpeg", quality=90)
    keys = FeatureKeys()
    best: dict[str, list[float]] = collections.defaultdict(list)
    order: list[str] = []

    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "a.tfrecord"), "wb") as handle, \
            tf.io.TFRecordWriter(os.path.join(tmp, "b.tfrecord")) as tf_writer:
        for index, path in enumerate(paths):
            times: dict[str, float] = {}

            def step(name, fn, *a):
                start = time.thread_time()
                out = fn(*a)
                seconds = time.thread_time() - start
                times[name] = min(times.get(name, float("inf")), seconds)
                if name not in best:
                    order.append(name)
                    best[name] = []
                return out

            for rep in range(args.repeat):
                def read_plain(p):
                    with open(p, "rb") as f:
                        return f.read()

                def read_beam(p):
                    with FileSystems.open(p, compression_type="uncompressed") as f:
                        return f.read()
                data = step("read: open().read()", read_plain, path)
                step("read: FileSystems.open().read() (imgrec)", read_beam, path)
                digest = step("sha256 hexdigest", lambda d: hashlib.sha256(d).hexdigest(), data)
                step("read_header (header parse)", read_header, data)
                step("jpeg_has_eoi", jpeg_has_eoi, data)
                buf = np.frombuffer(data, np.uint8)
                img, _, _ = step("imdecodeWithMetadata(IMREAD_UNCHANGED) (imgrec)", cv2.imdecodeWithMetadata, buf,
                                 cv2.IMREAD_UNCHANGED)
                rgb = step("to_rgb: cvtColor BGR2RGB at full size (imgrec)", to_rgb, img, uint8)
                step("apply_orientation (1: no-op)", apply_orientation, rgb, 1)
                small = step("resize_image 224 stretch cubic (RGB)", resize_image, rgb, uint8)
                step("normalize none", normalize_image, small, uint8)
                pixels = step("encode_pixels raw uint8 (tobytes)", encode_pixels, small, uint8)
                fields = RecordFields(index % 8, "class", path, digest)
                record = step("build_example uint8, 8 features (imgrec)", build_example, pixels, fields, uint8, keys)
                if rep == 0:
                    step("write_tfrecord: crc32c x2 + 3 writes (imgrec)", write_tfrecord, handle, record)
                    step("tf.io.TFRecordWriter.write (peers)", tf_writer.write, record)
                floats = step("float32: normalize unit (x/255)", normalize_image, small, unit)
                fpixels = step("float32: encode_pixels (tobytes)", encode_pixels, floats, unit)
                step("float32: build_example (imgrec)", build_example, fpixels, fields, unit, keys)
                step("jpeg: encode_pixels q90", encode_pixels, small, jpeg)
                # alternatives
                step("alt: imdecode(IMREAD_COLOR)", cv2.imdecode, buf, cv2.IMREAD_COLOR)
                step("alt: imdecode(IMREAD_COLOR_RGB)", cv2.imdecode, buf, cv2.IMREAD_COLOR_RGB)
                bgr_small = step("alt: resize BGR first (cubic 224)", cv2.resize, img, (224, 224), None, 0, 0,
                                 cv2.INTER_CUBIC)
                step("alt: then cvtColor at 224x224", cv2.cvtColor, bgr_small, cv2.COLOR_BGR2RGB)

                def tf_example(p, label):
                    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[p])),
                               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
                    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
                step("alt: tf.train.Example(image, label) serialize (peers)", tf_example, pixels, index % 8)
            for name, seconds in times.items():
                best[name].append(seconds)

    print(f"# per-image step costs: thread CPU ms/image, mean over {len(paths)} images of {args.corpus} "
          f"(fastest of {args.repeat} per image), 1 OpenCV thread")
    for name in order:
        print(f"  {1e3 * float(np.mean(best[name])):7.3f}  {name}")


if __name__ == "__main__":
    main()
