"""Deterministic split, shard and order assignment from stable hashes.

Everything here is a pure function of (key, salt/seed): re-running the same input gives every
image the same split, shard and position on any runner, with no global state or randomness.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from typing import Iterable, Sequence

from transforms.specs import MAX_SHARDS, ImageSpec, OutputSpec, SplitSpec

# Bytes a record costs beyond its pixels (feature keys, label, path, hash, framing).
_RECORD_OVERHEAD_BYTES = 512
# Typical compression of a 224x224 photo; only used to pick a shard count.
_ENCODED_FRACTION = {"raw": 1.0, "jpeg": 0.12, "png": 0.6}


def stable_hash(*parts: str) -> int:
    """A 64-bit hash that is the same in every process (unlike `hash()`)."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big")


def unit_fraction(*parts: str) -> float:
    """Maps parts uniformly to [0, 1)."""
    return stable_hash(*parts) / 2.0**64


def assign_split(key: str, spec: SplitSpec) -> str:
    """Hash split: the same key (content hash or path) always lands in the same split, the first
    whose cumulative ratio is above the key's fraction (the last when rounding leaves it short)."""
    index = bisect.bisect_right(list(itertools.accumulate(spec.ratios)), unit_fraction(spec.salt, key))
    return spec.names[min(index, len(spec.names) - 1)]


# How `split_counts` rounds; part of the input fingerprint of stratified runs, so that
# --skip_unchanged re-converts a dataset an older rounding cut.
STRATIFIED_ROUNDING = "systematic, per-label offset"


def split_counts(total: int, ratios: Sequence[float], offset: float) -> list[int]:
    """Integer counts, each within 1 of `total * ratio`, that add up to `total`.

    Split i ends at floor(total * cumulative ratio + offset), systematic sampling. With `offset`
    drawn uniformly from [0, 1) for each label, every split's expected count is exactly its share,
    also for labels smaller than the number of splits: rounding every label the same way would send
    every one-image label to the same split. Ratios are rescaled to sum to exactly 1, since specs
    accept a small rounding error, and float noise is rounded away (100 * (0.7 + 0.2) is 90).
    """
    scale = sum(ratios)
    ends = [min(total, math.floor(round(total * cumulative / scale, 9) + offset))
            for cumulative in itertools.accumulate(ratios[:-1])]
    ends.append(total)
    return [end - start for start, end in zip([0, *ends], ends)]


def stratified_splits(keys: Iterable[str], spec: SplitSpec) -> dict[str, str]:
    """Splits one label's keys so each split gets its share of that label, within one key.

    Keys are ordered by their salted hash, so which keys go where is as random as the hash split
    but the per-label proportions are as exact as whole keys allow. The rounding offset comes from
    the hash of the label's first key, so it is as independent between labels as their keys are.
    """
    ordered = sorted(set(keys), key=lambda k: (stable_hash(spec.salt, k), k))
    offset = unit_fraction(spec.salt, "offset", ordered[0]) if ordered else 0.0
    counts = split_counts(len(ordered), spec.ratios, offset)
    return dict(zip(ordered, (name for name, count in zip(spec.names, counts) for _ in range(count))))


def record_bytes_estimate(image: ImageSpec, width: int, height: int) -> int:
    """What one record of a `width x height` stored image is expected to take, to pick a shard
    count: its pixels at the output size (its own under resize_mode none: COCO's and VOC's
    default), compressed as a photo typically is."""
    pixel_bytes = image.output_bytes if image.resizes else width * height * image.pixel_bytes
    return int(pixel_bytes * _ENCODED_FRACTION[image.encoding]) + _RECORD_OVERHEAD_BYTES


def num_shards_for(num_examples: int, estimated_bytes: int, output: OutputSpec) -> int:
    """The configured shard count, or enough shards that each is about `target_shard_bytes`
    (but not more shards than examples: a tiny target must not create millions of files)."""
    if output.num_shards:
        return output.num_shards
    return max(1, min(math.ceil(estimated_bytes / output.target_shard_bytes), num_examples, MAX_SHARDS))


def shard_for(key: str, seed: int, num_shards: int) -> int:
    return stable_hash("shard", str(seed), key) % num_shards


def order_in_shard(key: str, seed: int) -> int:
    """Sort key that shuffles records within a shard reproducibly for a given seed."""
    return stable_hash("order", str(seed), key)
