"""Run by the Model Garden venv (make test-detection-readers), not by pytest: decodes every record
of a TFRecord file with Model Garden's own decoders and saves what they return as .npz.

Usage: python tests/modelgarden_decode.py RECORDS LABEL_MAP_CSV OUT.npz
"""
import sys

import numpy as np
import tensorflow as tf
from official.vision.dataloaders.tf_example_decoder import TfExampleDecoder
from official.vision.dataloaders.tf_example_label_map_decoder import TfExampleDecoderLabelMap

DECODED = ("source_id", "height", "width", "image", "groundtruth_classes", "groundtruth_is_crowd",
           "groundtruth_area", "groundtruth_boxes", "groundtruth_instance_masks")


def main(records: str, label_map_csv: str, out: str) -> None:
    by_id = TfExampleDecoder(include_mask=True)
    by_name = TfExampleDecoderLabelMap(label_map_csv)
    arrays = {}
    for i, record in enumerate(tf.data.TFRecordDataset(records)):
        decoded = by_id.decode(record)
        arrays.update({f"{i}/{key}": decoded[key].numpy() for key in DECODED})
        arrays[f"{i}/classes_by_name"] = by_name.decode(record)["groundtruth_classes"].numpy()
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
