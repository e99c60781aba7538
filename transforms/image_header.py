"""Read an image's format and declared size from its header bytes alone.

This runs before any decoder so that a decompression bomb (a tiny file that declares billions of
pixels) is refused without allocating memory for its pixels; nothing here reads pixel data.
"""
from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Callable, Iterator, Optional

from transforms.rejections import CorruptImage, EmptyFile, NotAnImage, UnsupportedImage


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """What the file says about itself: format (jpeg, png, gif, bmp, webp, tiff), size, and the
    channels and bytes per sample the decoder will produce (an upper bound where the header
    cannot tell, e.g. palettes that may gain alpha)."""

    format: str
    width: int
    height: int
    channels: int = 3
    bytes_per_sample: int = 1
    buffer_bytes: int = 0  # what the decoder holds besides the image: a tiled TIFF's tile, an animation's frames

    @property
    def decoded_bytes(self) -> int:
        return self.width * self.height * self.channels * self.bytes_per_sample


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXIF_PREFIX = b"Exif\x00\x00"
_TIFF_WIDTH, _TIFF_HEIGHT, _EXIF_ORIENTATION = 256, 257, 0x0112
_TIFF_BITS_PER_SAMPLE, _TIFF_SAMPLES_PER_PIXEL = 258, 277
_TIFF_EXTRA_SAMPLES, _ASSOCIATED_ALPHA = 338, 1
_TIFF_ALPHA_SAMPLES = (1, 2)  # ExtraSamples: associated, unassociated alpha (0: not alpha)
_TIFF_PHOTOMETRIC, _TIFF_GREY = 262, (0, 1)  # WhiteIsZero, BlackIsZero
_TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH = 322, 323
_RGBA = 4
_WEBP_ANIMATED = 0x02  # VP8X flags bit
_TIFF_COMPRESSION, _TIFF_JPEG_COMPRESSIONS = 259, (6, 7)  # old-style and new-style JPEG
_TIFF_STRIP_OFFSETS, _TIFF_TILE_OFFSETS = 273, 324
_TIFF_SIZE_TAGS = {_TIFF_WIDTH: "ImageWidth", _TIFF_HEIGHT: "ImageLength", _TIFF_BITS_PER_SAMPLE: "BitsPerSample",
                   _TIFF_SAMPLES_PER_PIXEL: "SamplesPerPixel"}
# PNG colour type → channels as OpenCV decodes them (palettes may gain alpha from tRNS; grey+alpha is BGRA).
_PNG_GREY = 0
_PNG_CHANNELS = {0: 1, 2: 3, 3: 4, 4: 4, 6: 4}
# TIFF integer field types (BYTE, SHORT, LONG, SBYTE, SSHORT, SLONG, IFD, LONG8, SLONG8, IFD8) as
# struct codes: libtiff takes a size tag of any of them, though the standard names SHORT or LONG.
_TIFF_INTEGERS = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 13: "I", 16: "Q", 17: "q", 18: "Q"}
_TIFF_MAX_VALUES = 64  # of one tag: enough for every tag read here, whatever a tag's count claims
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7,
                       0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# Markers without a length field: TEM, RST0-7, SOI, EOI.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8), 0xD8, 0xD9})
_JPEG_SOS, _JPEG_EOI, _JPEG_APP0 = 0xDA, 0xD9, 0xE0
_JPEG_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Segments libjpeg parses, and refuses with a bogus length: frame, scan and table headers.
_JPEG_PARSED = _JPEG_SOF | {0xC4, 0xCC, _JPEG_SOS, 0xDB, 0xDC, 0xDD}  # + DHT, DAC, SOS, DQT, DNL, DRI
_JPEG_APP1 = 0xE1
_ALL_COEFFICIENTS = (1 << 64) - 1
MAX_JPEG_SCANS = 500  # libjpeg-turbo's fuzzers and djpeg -maxscans use limits of this order


def _jpeg_markers(data: bytes, pos: int = 2) -> Iterator[tuple[int, int]]:
    """Yield (marker, offset of its payload) from `pos` (just after SOI, or after a scan's data)
    up to and including the next SOS, after which the entropy-coded data starts and no more
    headers can be read. Bytes between segments that are not 0xFF are skipped as libjpeg does
    ("extraneous bytes"), and so are 0xFF fill bytes and 0xFF00 pairs."""
    while True:
        pos = data.find(b"\xff", pos)
        while 0 <= pos < len(data) and data[pos] == 0xFF:
            pos += 1
        if pos < 0 or pos >= len(data):
            raise CorruptImage(f"jpeg header truncated at byte {len(data)}: no start-of-scan marker")
        marker = data[pos]
        pos += 1
        if marker == 0x00:  # a stuffed zero, not a marker: libjpeg discards it
            continue
        if marker in _JPEG_STANDALONE:
            if marker == _JPEG_EOI:
                raise CorruptImage(f"jpeg ends (EOI at byte {pos - 2}) before any image data")
            continue
        if pos + 2 > len(data):
            raise CorruptImage(f"jpeg header truncated inside marker 0x{marker:02X} at byte {pos - 2}")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            if marker in _JPEG_PARSED:
                raise CorruptImage(f"jpeg marker 0x{marker:02X} at byte {pos - 2} has length {length}")
            pos += 2  # libjpeg skips a segment it does not parse by its length: here, nothing more
            continue
        yield marker, pos + 2
        if marker == _JPEG_SOS:
            return
        pos += length


_Size = tuple[int, int, int, int]  # width, height, channels, bytes per sample


def _bytes_per_sample(bits: int) -> int:
    return max(1, -(-bits // 8))


def _jpeg(data: bytes) -> _Size:
    for marker, payload in _jpeg_markers(data):
        if marker in _JPEG_SOF:
            precision, height, width, components = struct.unpack_from(">BHHB", data, payload)
            return width, height, max(3, components), _bytes_per_sample(precision)
    raise CorruptImage("jpeg has a start-of-scan marker but no start-of-frame (SOFn) before it")


def jpeg_has_eoi(data: bytes) -> bool:
    """True when an end-of-image marker follows the first scan.

    libjpeg treats truncation as a warning and fills the missing rows with grey; OpenCV 5.1
    happens to refuse such files, but the check does not depend on that. 0xFFD9 cannot occur inside entropy-coded data,
    so any occurrence after the start of the scan is the EOI. Searching (rather than requiring it
    to be the last bytes) accepts files with data appended after EOI, such as motion photos.
    """
    scan_start = next(pos for marker, pos in _jpeg_markers(data) if marker == _JPEG_SOS)
    return data.rfind(b"\xff\xd9", scan_start) >= 0


def jpeg_without_harmless_warnings(data: bytes) -> bytes:
    """The JPEG without what makes libjpeg warn before the scan data while losing no pixels:
    stray bytes between header segments (a sloppy writer's) and a JFIF major version other than
    1. libjpeg prints only the first warning of a decode, and that one must be left for damage
    in the scan data. The same bytes when there is nothing to take out."""
    segments, jfif_version = [], None  # (start, end); the first scan runs to the end of the data
    for marker, payload in _jpeg_markers(data):
        (length,) = struct.unpack_from(">H", data, payload - 2)
        segments.append((payload - 4, len(data) if marker == _JPEG_SOS else payload - 2 + length))
        if marker == _JPEG_APP0 and length >= 9 and data[payload:payload + 5] == b"JFIF\x00" and data[payload + 5] != 1:
            jfif_version = payload + 5
    ends = [2] + [end for _, end in segments[:-1]]
    if jfif_version is None and all(start == end for (start, _), end in zip(segments, ends)):
        return data
    if jfif_version is not None:
        data = data[:jfif_version] + b"\x01" + data[jfif_version + 1:]
    return data[:2] + b"".join(data[start:end] for start, end in segments)


def _end_of_scan(data: bytes, pos: int) -> int:
    """Where the entropy-coded data that starts at `pos` ends: the next marker that is neither a
    stuffed 0xFF00, a fill byte nor a restart marker (len(data) when there is none)."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            return len(data)
        following = data[pos + 1]
        if following != 0x00 and following != 0xFF and not 0xD0 <= following <= 0xD7:
            return pos
        pos += 1 if following == 0xFF else 2


def progressive_jpeg_problem(data: bytes) -> Optional[str]:
    """For a progressive JPEG, why it cannot be decoded faithfully and promptly: a coefficient no
    scan brought to full precision, or more than `MAX_JPEG_SCANS` scans. None for a sound one,
    and for JPEGs that are not progressive.

    A progressive file cut between two scans, with an end-of-image marker after the cut, decodes
    without a warning from libjpeg into a blurred or colourless picture made of the scans that
    are there. Encoders' scan scripts code all 64 coefficients of every component down to the
    last bit, so a gap means scans are missing. libjpeg decodes a scan repeated thousands of
    times without complaint, each time over the whole image: 900 extra scans (105 kB) made an
    8000x8000 decode take 4.3 s instead of 0.4 s. Reads only markers, not pixels.
    """
    components: list[int] = []
    final: dict[int, int] = {}  # component id -> bit k set when coefficient k reached precision 0
    pos, scans = 2, 0
    try:
        while True:  # one scan's segments (the first time, the header's too) per round
            for marker, payload in _jpeg_markers(data, pos):
                if marker in _JPEG_SOF:
                    if marker not in _JPEG_PROGRESSIVE_SOF:
                        return None
                    components = list(data[payload + 6:payload + 6 + 3 * data[payload + 5]:3])
            scans += 1
            if scans > MAX_JPEG_SCANS:
                return (f"progressive jpeg has more than {MAX_JPEG_SCANS} scans (encoders write about 10): "
                        "each one decodes over the whole image")
            (length,) = struct.unpack_from(">H", data, payload - 2)
            segment = data[payload:payload - 2 + length]  # the SOS's
            if len(segment) >= 4 and len(segment) == 4 + 2 * segment[0]:
                start, end, approximation = segment[-3:]
                if approximation & 0x0F == 0 and start <= end <= 63:
                    for component in segment[1:1 + 2 * segment[0]:2]:
                        final[component] = final.get(component, 0) | ((1 << (end + 1)) - (1 << start))
            pos = _end_of_scan(data, payload - 2 + length)
    except CorruptImage:  # the end-of-image marker, or the end of the data: no more scans
        pass
    missing = [c for c in components if final.get(c, 0) != _ALL_COEFFICIENTS]
    if not missing:
        return None
    return (f"progressive jpeg ends before its last scans: {len(missing)} of {len(components)} components "
            "never reach full precision (cut between scans?)")


def _png(data: bytes) -> _Size:
    length, chunk_type, width, height, depth, color_type = struct.unpack_from(">I4sIIBB", data, 8)
    if length != 13 or chunk_type != b"IHDR":
        raise CorruptImage(f"png first chunk is {chunk_type!r} of length {length}, not a 13-byte IHDR")
    (crc,) = struct.unpack_from(">I", data, 29)
    if zlib.crc32(data[12:29]) != crc:
        raise CorruptImage("png IHDR chunk fails its CRC check")
    # A grey PNG with a transparent grey is decoded to grey + alpha (transforms/decode.py).
    channels = 4 if color_type == _PNG_GREY and png_grey_key(data) is not None else _PNG_CHANNELS.get(color_type, 4)
    return width, height, channels, _bytes_per_sample(depth)


def _gif(data: bytes) -> _Size:
    width, height = struct.unpack_from("<HH", data, 6)  # logical screen descriptor
    return width, height, 4, 1


def _bmp(data: bytes) -> _Size:
    (dib_size,) = struct.unpack_from("<I", data, 14)
    if dib_size == 12:  # BITMAPCOREHEADER: unsigned 16-bit sizes
        width, height, _, bits = struct.unpack_from("<HHHH", data, 18)
        return width, height, 3, 1
    if dib_size < 40:
        raise CorruptImage(f"bmp info header size {dib_size} is neither 12 (core) nor >= 40 (info)")
    width, height, _, bits = struct.unpack_from("<iiHH", data, 18)
    if width < 0:
        raise CorruptImage(f"bmp declares negative width {width}")
    return width, abs(height), 4 if bits == 32 else 3, 1  # negative height marks a top-down bitmap


def _webp(data: bytes) -> _Size:
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: 3-byte frame tag, start code, 14-bit sizes
        width, height = struct.unpack_from("<HH", data, 26)
        if data[23:26] != b"\x9d\x01\x2a":
            raise CorruptImage("webp VP8 chunk lacks the key-frame start code")
        return width & 0x3FFF, height & 0x3FFF, 3, 1
    if chunk == b"VP8L":  # lossless: signature byte, then 14-bit (size - 1) fields
        (bits,) = struct.unpack_from("<I", data, 21)
        if data[20] != 0x2F:
            raise CorruptImage("webp VP8L chunk lacks its 0x2F signature")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 4, 1
    if chunk == b"VP8X":  # extended: 24-bit (canvas size - 1) fields after flags
        w0, w1, w2, h0, h1, h2 = struct.unpack_from("<6B", data, 24)
        return (w0 | w1 << 8 | w2 << 16) + 1, (h0 | h1 << 8 | h2 << 16) + 1, 4, 1
    raise CorruptImage(f"webp first chunk is {chunk!r}, not VP8, VP8L or VP8X")


def _ifd0_span(tiff: bytes, clipped: bool = False) -> tuple[str, range]:
    """A TIFF-structured blob's byte order and where each of IFD0's 12-byte entries starts.
    `clipped`: only the entries whose tag, type, count and first value bytes are there, as
    OpenCV reads EXIF; otherwise an entry count that runs past the end is corrupt."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or struct.unpack_from(order + "H", tiff, 2)[0] != 42:
        raise CorruptImage(f"tiff structure has no II*/MM* byte-order mark: {tiff[:4].hex(' ')}")
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd < 8 or ifd + 2 > len(tiff):
        raise CorruptImage(f"tiff IFD0 offset {ifd} points into the header or past the end of the file "
                           f"({len(tiff)} bytes)")
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    if clipped:
        return order, range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 9), 12)
    if ifd + 2 + 12 * count > len(tiff):
        raise CorruptImage(f"tiff IFD0 at byte {ifd} lists {count} entries, more than the file's {len(tiff)} bytes "
                           "hold")
    return order, range(ifd + 2, ifd + 2 + 12 * count, 12)


def _ifd0_entries(tiff: bytes, limit: Optional[int] = _TIFF_MAX_VALUES) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(tag, values) of each integer entry of IFD0 in a TIFF-structured blob (TIFF files and EXIF
    share this layout), in file order; at most `limit` values of each (None: all). Values that do
    not fit the entry are read at their offset."""
    order, entries = _ifd0_span(tiff)
    for entry in entries:
        tag, kind, n = struct.unpack_from(order + "HHI", tiff, entry)
        code = _TIFF_INTEGERS.get(kind)
        if n < 1 or code is None:
            continue
        size, values = struct.calcsize(code), n if limit is None else min(n, limit)
        where = entry + 8 if n * size <= 4 else struct.unpack_from(order + "I", tiff, entry + 8)[0]
        if where + values * size > len(tiff):
            raise CorruptImage(f"tiff tag {tag} lists {n} values, more than the file's {len(tiff)} bytes hold")
        yield tag, struct.unpack_from(f"{order}{values}{code}", tiff, where)


def _tiff_all_values(tiff: bytes, wanted: int) -> tuple[int, ...]:
    """Every value of one tag of IFD0 (strip or tile offsets: as many as the file holds)."""
    return next((values for tag, values in _ifd0_entries(tiff, limit=None) if tag == wanted), ())


def _ifd0(tiff: bytes) -> dict[int, tuple[int, ...]]:
    """Each integer tag's values in IFD0; a tag listed twice keeps its first entry, as libtiff does."""
    values: dict[int, tuple[int, ...]] = {}
    for tag, value in _ifd0_entries(tiff):
        values.setdefault(tag, value)
    return values


def _tiff(data: bytes) -> _Size:
    tags: dict[int, tuple[int, ...]] = {}  # the size tags, each by its first entry (libtiff's)
    for tag, values in _ifd0_entries(data):
        if tag in _TIFF_SIZE_TAGS and values != tags.setdefault(tag, values):
            raise CorruptImage(f"tiff IFD0 lists {_TIFF_SIZE_TAGS[tag]} twice, as {tags[tag][0]} and {values[0]}: "
                               "its size cannot be checked")
    if _TIFF_WIDTH not in tags or _TIFF_HEIGHT not in tags:
        raise CorruptImage("tiff IFD0 lacks ImageWidth (256) or ImageLength (257)")
    channels = max(3, tags.get(_TIFF_SAMPLES_PER_PIXEL, (1,))[0])
    bits = tags.get(_TIFF_BITS_PER_SAMPLE, (8,))[0]
    return tags[_TIFF_WIDTH][0], tags[_TIFF_HEIGHT][0], channels, _bytes_per_sample(bits)


def _tiff_tile_bytes(data: bytes) -> int:
    """The buffer OpenCV allocates for one tile of a tiled TIFF: a tile much larger than the image
    (a 16x16 image in one 8192x8192 tile) costs its whole size, whatever the image's. 8-bit tiles
    come through libtiff's RGBA interface (4 samples), deeper ones as stored."""
    tags = _ifd0(data)
    tile = max(0, tags.get(_TIFF_TILE_WIDTH, (0,))[0]) * max(0, tags.get(_TIFF_TILE_LENGTH, (0,))[0])
    depth = _bytes_per_sample(tags.get(_TIFF_BITS_PER_SAMPLE, (8,))[0])
    samples = _RGBA if depth == 1 else max(1, tags.get(_TIFF_SAMPLES_PER_PIXEL, (1,))[0])
    return tile * samples * depth


def tiff_progressive_jpeg(data: bytes) -> bool:
    """Whether a JPEG-compressed TIFF holds a progressive JPEG stream in a strip or tile. libtiff
    calls that "normally not legal" and decodes it anyway, and a progressive stream taller than
    its strip (libtiff accepts one in the last strip, with a warning) makes libjpeg buffer the
    whole stream: a 1-row image took 257 MiB. Only the declared size is checked before decoding."""
    tags = _ifd0(data)
    if tags.get(_TIFF_COMPRESSION, (1,))[0] not in _TIFF_JPEG_COMPRESSIONS:
        return False
    offsets = _tiff_all_values(data, _TIFF_TILE_OFFSETS) or _tiff_all_values(data, _TIFF_STRIP_OFFSETS)
    for offset in offsets:
        if data[offset:offset + 2] != b"\xff\xd8":
            continue
        try:
            if any(marker in _JPEG_PROGRESSIVE_SOF for marker, _ in _jpeg_markers(data, offset + 2)):
                return True
        except CorruptImage:
            continue
    return False


def tiff_alpha_is_associated(data: bytes) -> bool:
    """Whether a TIFF's first extra sample is associated alpha (colours stored premultiplied)."""
    return _ifd0(data).get(_TIFF_EXTRA_SAMPLES, (0,))[0] == _ASSOCIATED_ALPHA


def tiff_grey_with_alpha(data: bytes) -> bool:
    """Whether a TIFF is grey with an alpha among its extra samples, which OpenCV decodes as
    grey (multiplied by the alpha when the samples are stored in planes)."""
    tags = _ifd0(data)
    extra = tags.get(_TIFF_EXTRA_SAMPLES, ())
    photometric = tags.get(_TIFF_PHOTOMETRIC)
    grey = photometric[0] in _TIFF_GREY if photometric else tags.get(_TIFF_SAMPLES_PER_PIXEL, (1,))[0] - len(extra) == 1
    return grey and any(sample in _TIFF_ALPHA_SAMPLES for sample in extra)


def _png_chunks_before_idat(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(type, offset, length) of each PNG chunk before the image data (the ancillary ones that
    change how it decodes come there)."""
    pos = 8
    while pos + 8 <= len(data):
        length, chunk_type = struct.unpack_from(">I4s", data, pos)
        if chunk_type in (b"IDAT", b"IEND"):
            return
        yield chunk_type, pos, length
        pos += 12 + length


def png_grey_key(data: bytes) -> Optional[int]:
    """The grey a grey PNG's tRNS chunk makes transparent (OpenCV decodes such a PNG as opaque
    grey), as OpenCV decodes it: 1, 2 and 4-bit grey widened to 8 bits by replication
    (x * 255 / (2^d - 1)). None when the PNG is not grey or has no tRNS that makes a pixel
    transparent in libpng: the first tRNS of 2 bytes with a good CRC, before the image data,
    with a key within the bit depth (libpng discards the others and reads on)."""
    _, _, _, _, depth, color_type = struct.unpack_from(">I4sIIBB", data, 8)
    if color_type != _PNG_GREY:
        return None
    for chunk_type, pos, length in _png_chunks_before_idat(data):
        if (chunk_type == b"tRNS" and length == 2 and pos + 14 <= len(data)
                and zlib.crc32(data[pos + 4:pos + 10]) == struct.unpack_from(">I", data, pos + 10)[0]):
            (key,) = struct.unpack_from(">H", data, pos + 8)
            if key >= 1 << depth:
                return None  # libpng takes it, and it matches no pixel
            return key * 255 // ((1 << depth) - 1) if depth < 8 else key
    return None


def _animation_bytes(fmt: str, data: bytes, width: int, height: int, bytes_per_sample: int) -> int:
    """What OpenCV's animation readers hold besides the first frame: an APNG's previous and
    current RGBA frames, an animated WebP's RGBA canvas (measured: up to 1.8x and 1.13x the
    still image's estimate without this)."""
    if fmt == "png" and any(chunk_type == b"acTL" for chunk_type, _, _ in _png_chunks_before_idat(data)):
        return 2 * width * height * _RGBA * bytes_per_sample
    if fmt == "webp" and data[12:16] == b"VP8X" and data[20] & _WEBP_ANIMATED:
        return width * height * _RGBA
    return 0


_Reader = Callable[[bytes], _Size]
_READERS: tuple[tuple[tuple[bytes, ...], str, _Reader], ...] = (
    ((b"\xff\xd8\xff",), "jpeg", _jpeg),
    ((_PNG_SIGNATURE,), "png", _png),
    ((b"GIF87a", b"GIF89a"), "gif", _gif),
    ((b"BM",), "bmp", _bmp),
    ((b"II*\x00", b"MM\x00*"), "tiff", _tiff),
)


def _sniff(data: bytes) -> tuple[str, _Reader]:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp", _webp
    if data[:4] in (b"II+\x00", b"MM\x00+"):
        raise UnsupportedImage("tiff in the BigTIFF layout is not supported: its size cannot be checked before "
                               "decoding")
    for magics, fmt, reader in _READERS:
        if data.startswith(magics):
            return fmt, reader
    raise NotAnImage(f"unrecognized magic bytes {data[:16].hex(' ')} ({len(data)} bytes); "
                     "expected jpeg, png, gif, bmp, webp or tiff")


def read_header(data: bytes) -> ImageHeader:
    """Format and declared width/height, read from the header only (cheap, no pixel decode)."""
    if not data:
        raise EmptyFile("file has zero bytes")
    fmt, reader = _sniff(data)
    try:
        width, height, channels, bytes_per_sample = reader(data)
    except struct.error:
        raise CorruptImage(f"{fmt} header truncated: file has only {len(data)} bytes") from None
    if width <= 0 or height <= 0:
        raise CorruptImage(f"{fmt} header declares an empty size {width}x{height}")
    buffer_bytes = (_tiff_tile_bytes(data) if fmt == "tiff"
                    else _animation_bytes(fmt, data, width, height, bytes_per_sample))
    return ImageHeader(fmt, width, height, channels, bytes_per_sample, buffer_bytes)


def jpeg_exif(data: bytes) -> bytes:
    """The EXIF block of a JPEG's first Exif APP1 segment, after its prefix: the one OpenCV turns
    plain JPEGs by (its metadata API hands over the last one). Empty when there is none."""
    try:
        for marker, payload in _jpeg_markers(data):
            (length,) = struct.unpack_from(">H", data, payload - 2)
            if marker == _JPEG_APP1 and data[payload:payload + len(EXIF_PREFIX)] == EXIF_PREFIX:
                return data[payload + len(EXIF_PREFIX):payload - 2 + length]
    except CorruptImage:
        pass
    return b""


def exif_orientation(exif: bytes) -> int:
    """EXIF orientation (1-8) from a TIFF-structured EXIF blob (no "Exif" prefix), read as OpenCV reads it for the
    JPEGs it turns upright itself: the first two bytes of the entry's value, whatever type the
    entry declares (EXIF says SHORT), so that every format turns alike. 1 (upright) when the tag
    is absent, out of range or the blob is malformed: a bad EXIF block should not cost the image."""
    try:
        order, entries = _ifd0_span(exif, clipped=True)
        orientation = next((struct.unpack_from(order + "H", exif, entry + 8)[0] for entry in entries
                            if struct.unpack_from(order + "H", exif, entry)[0] == _EXIF_ORIENTATION), 1)
    except (CorruptImage, struct.error):
        return 1
    return orientation if 1 <= orientation <= 8 else 1
