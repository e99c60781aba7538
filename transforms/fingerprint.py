"""An order-independent fingerprint of a run's inputs and config, for skipping unchanged re-runs.

Each input row hashes to a 256-bit number and the fingerprint is their sum modulo 2**256: a
commutative, associative combine, so it needs no sort and no single worker sees every row.
"""
from __future__ import annotations

import hashlib
import json

import apache_beam as beam

from transforms.specs import ConversionSpec

_MODULUS = 2**256


def row_hash(row: str) -> int:
    return int.from_bytes(hashlib.sha256(row.encode("utf-8")).digest(), "big")


def config_fingerprint(spec: ConversionSpec) -> str:
    """Everything that shapes the records; where they are written and how is left out."""
    config = spec.to_dict()
    for field in ("path", "overwrite", "skip_unchanged"):
        config["output"].pop(field)
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode("utf-8")).hexdigest()


class FingerprintFn(beam.CombineFn):
    """Rows → hex fingerprint, seeded with the config's fingerprint."""

    def __init__(self, config: str):
        super().__init__()
        self._config = config

    def create_accumulator(self) -> int:
        return 0

    def add_input(self, accumulator: int, row: str) -> int:
        return (accumulator + row_hash(row)) % _MODULUS

    def merge_accumulators(self, accumulators) -> int:
        return sum(accumulators) % _MODULUS

    def extract_output(self, accumulator: int) -> str:
        return hashlib.sha256(f"{self._config}:{accumulator:064x}".encode("ascii")).hexdigest()
