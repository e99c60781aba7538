"""A user's multiprocessing script: 2 processes, each converting every 2nd file into its own
TFRecord file (cv2 → tf.train.Example → TFRecordWriter). uint8 224x224 RGB, bicubic stretch.

    python benchmarks/pool_script.py INPUT_DIR OUTPUT_DIR [--float32] [--jpeg] [--processes 2]
"""
import argparse
import glob
import os
from multiprocessing import Pool

import cv2
import numpy as np
import tensorflow as tf

INTERPOLATION = {"cubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA, "linear": cv2.INTER_LINEAR}


def convert(job):
    index, files, args = job
    with tf.io.TFRecordWriter(os.path.join(args.output, f"part-{index}.tfrecord")) as writer:
        for path, label in files:
            img = cv2.resize(cv2.imread(path), (224, 224), interpolation=INTERPOLATION[args.interpolation])
            if args.jpeg:
                data = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
            else:
                img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
                data = (img.astype(np.float32) / 255.0 if args.float32 else img).tobytes()
            feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--float32", action="store_true", help="float32 x/255 instead of uint8")
    parser.add_argument("--jpeg", action="store_true", help="JPEG-encoded records, quality 90")
    parser.add_argument("--interpolation", choices=sorted(INTERPOLATION), default="cubic")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    classes = sorted(d.name for d in os.scandir(args.input) if d.is_dir())
    files = [(p, label) for label, c in enumerate(classes) for p in sorted(glob.glob(f"{args.input}/{c}/*"))]
    os.makedirs(args.output, exist_ok=True)
    with Pool(args.processes) as pool:
        pool.map(convert, [(i, files[i::args.processes], args) for i in range(args.processes)])
