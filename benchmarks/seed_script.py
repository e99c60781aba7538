"""The seed: the sequential script users ran before imgrec, kept as the baseline to beat.

glob → cv2.imread → resize 224x224 bicubic → RGB → float32 / 255 → one TFRecord file, with
features `train/image` (raw float32 bytes) and `train/label` (int64, sorted class folders).
Benchmarks time it as a whole process; tests check imgrec reproduces its records exactly.

`--dtype=uint8` keeps the pixels as uint8 (raw bytes), `--encoding=jpeg` stores them as a JPEG
(quality 90, uint8): the same loop for the other record layouts imgrec is compared on.
"""
from __future__ import annotations

import argparse
import glob
import os

import cv2
import numpy as np
import tensorflow as tf


def seed_example(path: str, label: int, dtype: str = "float32", encoding: str = "raw") -> bytes:
    img = cv2.imread(path)
    img = cv2.resize(img, (224, 224), interpolation=cv2.INTER_CUBIC)
    if encoding == "jpeg":
        data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        if dtype == "float32":
            img = img.astype(np.float32) / 255.0
        data = img.tobytes()
    feature = {
        "train/image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
        "train/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("input", help="folder of class folders")
    parser.add_argument("output", help="TFRecord file to write")
    parser.add_argument("--dtype", choices=("float32", "uint8"), default="float32")
    parser.add_argument("--encoding", choices=("raw", "jpeg"), default="raw")
    args = parser.parse_args()
    classes = sorted(d for d in os.listdir(args.input) if os.path.isdir(os.path.join(args.input, d)))
    with tf.io.TFRecordWriter(args.output) as writer:
        for label, name in enumerate(classes):
            for path in sorted(glob.glob(os.path.join(args.input, name, "*"))):
                writer.write(seed_example(path, label, args.dtype, args.encoding))


if __name__ == "__main__":
    main()
