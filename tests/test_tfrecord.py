"""transforms.write.tfrecord: the framing and masked CRC-32C, checked against TensorFlow's own writer
and reader."""
from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf

from transforms.write import tfrecord
from transforms.write.tfrecord import CorruptRecord

pytestmark = pytest.mark.unit

RECORDS = [b"", b"x", b"hello tfrecord", bytes(range(256)) * 3,
           np.random.default_rng(0).bytes(1 << 20)]  # one large record


def write_ours(path, records) -> list[int]:
    with open(path, "wb") as handle:
        return [tfrecord.write_record(handle, record) for record in records]


def test_tensorflow_reads_what_we_write(tmp_path):
    path = tmp_path / "ours.tfrecord"
    lengths = write_ours(path, RECORDS)
    assert lengths == [tfrecord.framed_length(len(r)) for r in RECORDS] == [len(r) + 16 for r in RECORDS]
    assert path.stat().st_size == sum(lengths)
    assert [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(path))] == RECORDS


def test_our_bytes_equal_tensorflows_writer(tmp_path):
    """Same framing and the same masked CRCs, byte for byte, as tf.io.TFRecordWriter."""
    write_ours(tmp_path / "ours.tfrecord", RECORDS)
    with tf.io.TFRecordWriter(str(tmp_path / "tf.tfrecord")) as writer:
        for record in RECORDS:
            writer.write(record)
    assert (tmp_path / "ours.tfrecord").read_bytes() == (tmp_path / "tf.tfrecord").read_bytes()


def test_masked_crc_of_known_values():
    """CRC-32C("123456789") is 0xE3069283 (RFC 3720); the mask rotates right 15 and adds 0xA282EAD8."""
    crc = 0xE3069283
    expected = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert tfrecord.masked_crc32c(b"123456789") == expected
    assert tfrecord.masked_crc32c(b"") == 0xA282EAD8  # CRC 0, masked


def test_read_record_at_each_offset(tmp_path):
    path = tmp_path / "ours.tfrecord"
    lengths = write_ours(path, RECORDS)
    offsets = np.cumsum([0, *lengths[:-1]]).tolist()
    with open(path, "rb") as handle:
        for offset, length, record in reversed(list(zip(offsets, lengths, RECORDS))):  # any order
            assert tfrecord.read_record_at(handle, offset, length) == record


def framed(record: bytes) -> bytearray:
    buffer = io.BytesIO()
    tfrecord.write_record(buffer, record)
    return bytearray(buffer.getvalue())


@pytest.mark.parametrize("position,message", [
    (0, "length fails its checksum"),  # the length field
    (9, "length fails its checksum"),  # the length's CRC
    (12, "data fails its checksum"),  # first data byte
    (-5, "data fails its checksum"),  # last data byte
    (-1, "data fails its checksum"),  # the data's CRC
])
def test_a_flipped_byte_is_a_corrupt_record(position, message):
    data = framed(b"some record data")
    data[position] ^= 0x01
    with pytest.raises(CorruptRecord, match=message):
        tfrecord.read_record_at(io.BytesIO(bytes(data)), 0, len(data))


def test_a_flipped_byte_fails_tensorflow_and_us_alike(tmp_path):
    path = tmp_path / "damaged.tfrecord"
    lengths = write_ours(path, RECORDS[:3])
    data = bytearray(path.read_bytes())
    data[lengths[0] + 12] ^= 0xFF  # first data byte of the second record
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))
    with open(path, "rb") as handle:
        assert tfrecord.read_record_at(handle, 0, lengths[0]) == RECORDS[0]  # its neighbour is intact
        with pytest.raises(CorruptRecord, match="data fails"):
            tfrecord.read_record_at(handle, lengths[0], lengths[1])


def test_truncated_files_and_frames(tmp_path):
    data = bytes(framed(b"0123456789"))
    with pytest.raises(CorruptRecord, match="file ends 16 bytes into the record at offset 0"):
        tfrecord.read_record_at(io.BytesIO(data[:10]), 0, len(data))  # inside the header
    with pytest.raises(CorruptRecord, match="file ends 4 bytes into the record at offset 0"):
        tfrecord.read_record_at(io.BytesIO(data[:-4]), 0, len(data))


@pytest.mark.parametrize("offset, length, why", [
    (10**24, 26, "no record can start at offset"),
    (0, 10**13, "is 26 bytes long, not 10000000000000"),  # never allocated: the header says 26
    (3, 26, "no record starts at offset 3"),
], ids=["offset_past_any_file", "length_past_the_record", "offset_inside_a_record"])
def test_a_damaged_index_entry_is_a_corrupt_record_not_a_crash(offset, length, why):
    data = bytes(framed(b"0123456789"))
    with pytest.raises(CorruptRecord, match=why):
        tfrecord.read_record_at(io.BytesIO(data * 2), offset, length)
