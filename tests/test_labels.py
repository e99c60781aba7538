"""transforms.inputs.labels.build_label_map: class folders sort as strings (as Keras does); integer ids
only for manifests; a fixed class list wins."""
from __future__ import annotations

import pytest

from transforms.inputs.labels import build_label_map

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("labels,class_names,integer_ids,expected", [
    (["dog", "cat", "Zebra", "apple", "cat"], None, False, {"Zebra": 0, "apple": 1, "cat": 2, "dog": 3}),
    # class folders named by numbers: string order, like Keras's image_dataset_from_directory
    (["0", "1", "10", "2"], None, False, {"0": 0, "1": 1, "10": 2, "2": 3}),
    # manifests with integer labels: the integers are the ids
    (["10", "2", "0", "2"], None, True, {"0": 0, "2": 2, "10": 10}),
    # ids must fit int64 and not be negative ("-1"/"1" are names of two classes)
    (["-1", "5"], None, True, {"-1": 0, "5": 1}),
    ([str(2**63), "1"], None, True, {"1": 0, str(2**63): 1}),
    ([str(2**63 - 1), "1"], None, True, {"1": 1, str(2**63 - 1): 2**63 - 1}),
    # "01" is not canonical, so "1" and "01" can never share an id: names, sorted
    (["1", "01"], None, True, {"01": 0, "1": 1}),
    (["1", "cat"], None, True, {"1": 0, "cat": 1}),
    (["cat", "dog", "bird"], ("dog", "cat"), False, {"dog": 0, "cat": 1}),
    (["3", "7"], ("7", "3"), True, {"7": 0, "3": 1}),
    ([], None, False, {}),
    ([], None, True, {}),
], ids=["names", "int-folders-sort-as-strings", "manifest-ints", "negative-int", "over-int64", "int64-max",
        "non-canonical-int", "mixed",
        "class-names", "class-names-beat-ints", "empty", "empty-manifest"])
def test_build_label_map(labels, class_names, integer_ids, expected):
    label_map = build_label_map(labels, class_names, integer_ids=integer_ids)
    assert label_map == expected
    assert list(label_map.values()) == sorted(label_map.values())  # built in id order


def test_label_map_order_is_python_sorted_like_keras():
    names = ["b", "B", "a_1", "a-1", "a", "Ä", "10", "9x"]
    assert list(build_label_map(names)) == sorted(names)
    assert list(build_label_map(names).values()) == list(range(len(names)))
