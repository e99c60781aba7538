"""TFRecord framing: what TensorFlow's `TFRecordWriter` writes around every record.

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

The masked CRC is TensorFlow's public formula (tensorflow/core/lib/hash/crc32c.h `Mask`):
rotate the CRC-32C right by 15 bits and add 0xa282ead8. No Beam, no TensorFlow needed.
"""
from __future__ import annotations

import struct
from typing import BinaryIO

import crc32c

HEADER_BYTES = 12  # length + its CRC
FOOTER_BYTES = 4  # CRC of the data
_MASK_DELTA = 0xA282EAD8


class CorruptRecord(ValueError):
    """A record whose framing or checksum does not match: the file was damaged or is not a TFRecord."""


def masked_crc32c(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def framed_length(record_length: int) -> int:
    return HEADER_BYTES + record_length + FOOTER_BYTES


def write_record(handle: BinaryIO, record: bytes) -> int:
    """Frames and writes one record; returns the bytes written.

    The header, the data and the footer are written as three pieces so a large record is never
    copied into a joined buffer.
    """
    length = struct.pack("<Q", len(record))
    handle.write(length + struct.pack("<I", masked_crc32c(length)))
    handle.write(record)
    handle.write(struct.pack("<I", masked_crc32c(record)))
    return framed_length(len(record))


def read_record_at(handle: BinaryIO, offset: int, length: int) -> bytes:
    """The data of the framed record at `offset` (`length` framed bytes), checksums verified.

    `offset` and `length` come from an index that may be damaged: the header is read and checked
    first, so no more is read (or allocated) than the record there declares under its checksum."""
    try:
        handle.seek(offset)
    except (ValueError, OverflowError) as exc:  # past what a file offset can be
        raise CorruptRecord(f"no record can start at offset {offset}: {exc}") from None
    header = handle.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        raise CorruptRecord(f"file ends {length - len(header)} bytes into the record at offset {offset}")
    (declared,) = struct.unpack_from("<Q", header)
    if masked_crc32c(header[:8]) != struct.unpack_from("<I", header, 8)[0]:
        raise CorruptRecord(f"no record starts at offset {offset}: record length fails its checksum")
    if framed_length(declared) != length:
        raise CorruptRecord(f"the record at offset {offset} is {framed_length(declared)} bytes long, not {length}")
    rest = handle.read(length - HEADER_BYTES)  # the data and its checksum
    if len(rest) != length - HEADER_BYTES:
        raise CorruptRecord(f"file ends {length - HEADER_BYTES - len(rest)} bytes into the record at offset {offset}")
    data = rest[:declared]
    if masked_crc32c(data) != struct.unpack_from("<I", rest, declared)[0]:
        raise CorruptRecord("record data fails its checksum")
    return data
