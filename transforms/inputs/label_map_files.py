"""The label map as the detection frameworks read it, written beside the shards.

`label_map.pbtxt` is the TF Object Detection API's StringIntLabelMap text proto
(object_detection/protos/string_int_label_map.proto), which its configs' `label_map_path` and
`label_map_util.load_labelmap` read; `label_map.csv` is the `id,name` file Model Garden's
TfExampleDecoderLabelMap reads. metadata.json keeps imgrec's own copy ({name: id}).
"""
from __future__ import annotations

import csv
import io
from typing import Mapping

from google.protobuf import text_encoding

from transforms import files
from transforms.dataset_format import LABEL_MAP_FILES, join

PBTXT_FILE, CSV_FILE = LABEL_MAP_FILES


def _by_id(label_map: Mapping[str, int]) -> list[tuple[int, str]]:
    return sorted((label_id, name) for name, label_id in label_map.items())


def label_map_pbtxt(label_map: Mapping[str, int]) -> str:
    """One `item { id name }` per class, by id; names escaped as protobuf text format escapes them."""
    return "".join(f'item {{\n  id: {label_id}\n  name: "{text_encoding.CEscape(name, as_utf8=True)}"\n}}\n'
                   for label_id, name in _by_id(label_map))


def write_label_maps(folder: str, label_map: Mapping[str, int]) -> None:
    """Both files into `folder` (a run's staging: published with the shards)."""
    for name, text in ((PBTXT_FILE, label_map_pbtxt(label_map)), (CSV_FILE, label_map_csv(label_map))):
        files.write_atomically(join(folder, name), text.encode("utf-8"))


def label_map_csv(label_map: Mapping[str, int]) -> str:
    """`id,name` rows by id, quoted where a name needs it, without a header (Model Garden's reader
    takes every row as a class)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(_by_id(label_map))
    return out.getvalue()
