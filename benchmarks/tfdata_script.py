"""A user's tf.data script: parallel map (read_file → decode_jpeg → resize bicubic in TF), then a
Python loop serializing tf.train.Example into one TFRecord file. uint8 224x224 RGB, stretched.

    python benchmarks/tfdata_script.py INPUT_DIR OUTPUT_FILE [--float32] [--jpeg]
"""
import argparse
import glob
import os

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("input")
parser.add_argument("output")
parser.add_argument("--float32", action="store_true", help="float32 x/255 instead of uint8")
parser.add_argument("--jpeg", action="store_true", help="JPEG-encoded records, quality 90")
parser.add_argument("--interpolation", choices=("bicubic", "area", "bilinear"), default="bicubic")
args = parser.parse_args()

classes = sorted(d.name for d in os.scandir(args.input) if d.is_dir())
files = [(p, label) for label, c in enumerate(classes) for p in sorted(glob.glob(f"{args.input}/{c}/*"))]


def load(path, label):
    img = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    img = tf.image.resize(img, (224, 224), method=args.interpolation)  # float32, not clipped
    img = tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)
    if args.jpeg:
        return tf.io.encode_jpeg(img, quality=90), label
    if args.float32:
        return tf.cast(img, tf.float32) / 255.0, label
    return img, label


ds = tf.data.Dataset.from_tensor_slices(([p for p, _ in files], [label for _, label in files]))
ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
with tf.io.TFRecordWriter(args.output) as writer:
    for img, label in ds.as_numpy_iterator():
        data = img if args.jpeg else img.tobytes()
        feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
