"""Two kinds of JPEG damage that libjpeg decodes without a word: what no library reports.

libjpeg's only sign that it made pixels up is a warning on stderr (transforms/images/decode.py reads
it). Two kinds of damage get past that, and neither OpenCV nor Pillow exposes libjpeg's scan
state to tell them:
- libjpeg prints only the first warning of a decode. Stray bytes between header segments, or
  an unknown JFIF major version, lose no pixels but would take that one warning from damage in
  the scan data: they are taken out of the copy libjpeg decodes (`without_harmless_warnings`).
- A progressive file cut between two scans, with an end marker after the cut, decodes into a
  blurred or colourless picture made of the scans that are there (`progression_gap`).

These walks read markers only. Where they read a file otherwise than libjpeg, that file gets a
wrong verdict, never unbounded time or memory (transforms/images/limits.py bounds every decode).
"""
from __future__ import annotations

import re
import struct
from typing import Iterator, Optional

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RST0-7, SOI: no length field
_EOI, _SOS, _APP0 = 0xD9, 0xDA, 0xE0
# The end of a scan's entropy-coded data: a marker that is neither a stuffed zero, a fill
# byte nor a restart marker.
_SCAN_END = re.compile(rb"\xff(?=[^\x00\xd0-\xd7\xff])")
_ALL_COEFFICIENTS = (1 << 64) - 1


def _segments(data: bytes, pos: int) -> Iterator[tuple[int, int, int]]:
    """(marker, offset of its length field, length) of each segment from `pos` up to and
    including the next start of scan; nothing more at an end marker or the end of the data.
    Bytes between segments, 0xFF fill bytes and stuffed zeros are skipped as libjpeg skips
    them, and so is a segment whose length is under 2 (libjpeg skips nothing more)."""
    while True:
        pos = data.find(b"\xff", pos)
        while 0 <= pos < len(data) and data[pos] == 0xFF:
            pos += 1
        if pos < 0 or pos + 3 > len(data) or data[pos] == _EOI:
            return
        marker, pos = data[pos], pos + 1
        if marker == 0x00 or marker in _STANDALONE:
            continue
        (length,) = struct.unpack_from(">H", data, pos)
        if length >= 2:
            yield marker, pos, length
            if marker == _SOS:
                return
        pos += max(length, 2)


def without_harmless_warnings(data: bytes) -> bytes:
    """The JPEG without what makes libjpeg warn before the scan data while losing no pixels:
    stray bytes between header segments and a JFIF major version other than 1. The same bytes
    when there is nothing to take out."""
    spans, version = [], None  # each segment's (start, end); the first scan runs to the end of the data
    for marker, at, length in _segments(data, 2):
        spans.append((at - 2, len(data) if marker == _SOS else at + length))
        if marker == _APP0 and length >= 9 and data[at + 2:at + 7] == b"JFIF\x00" and data[at + 7] != 1:
            version = at + 7
    ends = [2] + [end for _, end in spans[:-1]]
    if version is None and all(start == end for (start, _), end in zip(spans, ends)):
        return data
    if version is not None:
        data = data[:version] + b"\x01" + data[version + 1:]
    return data[:2] + b"".join(data[start:end] for start, end in spans)


def progression_gap(data: bytes) -> Optional[str]:
    """Why a progressive JPEG's scans cannot make the whole picture: a coefficient of a
    component that no scan brought to full precision (encoders' scan scripts code all 64 down
    to the last bit, so a gap means scans are missing). None for a complete one, and for a JPEG
    that is not progressive."""
    components: list[int] = []
    final: dict[int, int] = {}  # component id -> bit k set once coefficient k reached precision 0
    pos = 2
    while True:  # one scan's segments (the first time, the header's too) per round
        scan = None
        for marker, at, length in _segments(data, pos):
            if marker in _SOF:
                if marker not in _PROGRESSIVE_SOF:
                    return None
                components = list(data[at + 8:at + 8 + 3 * data[at + 7]:3])
            elif marker == _SOS:
                scan = data[at + 2:at + length]
        if scan is None:
            break
        if len(scan) >= 4 and len(scan) == 4 + 2 * scan[0]:
            start, end, approximation = scan[-3:]
            if approximation & 0x0F == 0 and start <= end <= 63:
                for component in scan[1:1 + 2 * scan[0]:2]:
                    final[component] = final.get(component, 0) | ((1 << (end + 1)) - (1 << start))
        after = _SCAN_END.search(data, at + length)
        if after is None:
            break
        pos = after.start()
    missing = [c for c in components if final.get(c, 0) != _ALL_COEFFICIENTS]
    if not missing:
        return None
    return (f"progressive jpeg ends before its last scans: {len(missing)} of {len(components)} components "
            "never reach full precision (cut between scans?)")
