"""Label maps: label text ↔ integer id."""
from __future__ import annotations

from typing import Iterable, Optional, Sequence


def build_label_map(labels: Iterable[str], class_names: Optional[Sequence[str]] = None,
                    integer_ids: bool = False) -> dict[str, int]:
    """Label text → id.

    A fixed `class_names` list wins (ids by position). Otherwise, with `integer_ids` (manifests)
    and every label an integer from 0 to 2**63 - 1, the integers are the ids; else ids follow the
    names sorted as strings, the order of Keras `image_dataset_from_directory`'s class_names (so
    class folders `0, 1, 10, 2` get ids 0, 1, 2, 3, as in Keras).
    """
    if class_names:
        return {name: i for i, name in enumerate(class_names)}
    distinct = set(labels)
    if integer_ids and distinct and all(_is_int(label) for label in distinct):
        return {label: int(label) for label in sorted(distinct, key=int)}
    return {name: i for i, name in enumerate(sorted(distinct))}


MAX_LABEL_ID = 2**63 - 1  # an int64 feature

# A multi-label image's label text: its labels joined (`cat|dog`), so everything keyed by label
# text (duplicate reports, fingerprints, part digests) sees a change of its labels.
LABEL_SEPARATOR = "|"


def label_list(joined: str) -> tuple[str, ...]:
    """A multi-label image's labels from its label text: stripped, blank ones dropped, each once, sorted."""
    return tuple(sorted({label.strip() for label in joined.split(LABEL_SEPARATOR)} - {""}))


def _is_int(text: str) -> bool:
    """Canonical integers that fit an int64 id: "1" and "01" can never share an id, and "-1"
    (a common class name: labels -1/1) or 2**63 would not be a valid one."""
    try:
        return str(int(text)) == text and 0 <= int(text) <= MAX_LABEL_ID
    except ValueError:  # not an integer, or one of over 4300 digits
        return False
