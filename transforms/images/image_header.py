"""What an image file says about itself, as Pillow reads it without decoding a pixel.

The first pass reads it once per image (transforms/inputs/source.py), checks it against the spec's
limits, and hands it to the conversion (transforms/images/decode.py) with the image: the format and
size, the channels and bit depth the decoder will produce (the memory a decode needs), and what
OpenCV's decode leaves to imgrec: a PNG's or WebP's EXIF orientation, the grey a grey PNG's tRNS
chunk makes transparent, whether OpenCV hands a TIFF's colours over premultiplied by its alpha.

Nothing here parses image data. Where Pillow reads a header otherwise than the decoder (a TIFF
that lists a size tag twice, a tRNS chunk libpng would discard), the converter process's own
limits (transforms/images/limits.py) still bound what the file can cost.
"""
from __future__ import annotations

import dataclasses
import io
import struct
from typing import Callable, Optional

from PIL import BmpImagePlugin, GifImagePlugin, Image, JpegImagePlugin, PngImagePlugin, TiffImagePlugin, WebPImagePlugin

from transforms.rejections import CorruptImage, EmptyFile, ImageTooLarge, ImageTooSmall, NotAnImage, UnsupportedImage
from transforms.specs import ImageSpec


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """format (jpeg, png, gif, bmp, webp, tiff) and stored size; the channels and bytes per
    sample OpenCV decodes (an upper bound where Pillow cannot tell, e.g. palettes that may gain
    alpha); the EXIF orientation imgrec applies itself (OpenCV turns JPEGs and TIFFs on its
    own); a grey PNG's transparent grey in the decoded sample's scale; whether the decoded
    colours come premultiplied by their alpha; `turned`: the orientation the decoded pixels are
    turned upright by, whoever turns them (OpenCV: a JPEG's EXIF, a TIFF's tag; imgrec: a PNG's
    or WebP's EXIF, `orientation`), which annotations on the stored grid follow
    (transforms/images/geometry.py)."""

    format: str
    width: int
    height: int
    channels: int = 3
    bytes_per_sample: int = 1
    orientation: int = 1
    transparent_grey: Optional[int] = None
    premultiplied: bool = False
    turned: int = 1

    @property
    def decoded_bytes(self) -> int:
        return self.width * self.height * self.channels * self.bytes_per_sample


_PILLOW: dict[str, Callable[[io.BytesIO], Image.Image]] = {
    "jpeg": JpegImagePlugin.jpeg_factory, "png": PngImagePlugin.PngImageFile, "gif": GifImagePlugin.GifImageFile,
    "bmp": BmpImagePlugin.BmpImageFile, "webp": WebPImagePlugin.WebPImageFile, "tiff": TiffImagePlugin.TiffImageFile}
_MAGIC = ((b"\xff\xd8\xff", "jpeg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"), (b"GIF89a", "gif"),
          (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"), (b"II+\x00", "tiff"), (b"MM\x00+", "tiff"))
# What Pillow says of a file it reads but cannot describe (a TIFF's sample layout, 12-bit JPEG).
_UNSUPPORTED = ("unknown pixel mode", "cannot handle", "not supported")
_EXIF_ORIENTATION = 0x0112
_TIFF_BITS_PER_SAMPLE, _TIFF_EXTRA_SAMPLES, _ASSOCIATED_ALPHA = 258, 338, 1
_GREY_MODES = ("1", "L", "I;16", "I;16B", "I;16L", "I", "F")


def _format(data: bytes) -> str:
    """The format by its magic bytes: only these six are opened, by their own Pillow plugin."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, fmt in _MAGIC:
        if data.startswith(magic):
            return fmt
    raise NotAnImage(f"unrecognized magic bytes {data[:16].hex(' ')} ({len(data)} bytes); "
                     "expected jpeg, png, gif, bmp, webp or tiff")


def _open(fmt: str, data: bytes) -> Image.Image:
    try:
        return _PILLOW[fmt](io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # WebP: Pillow's decoder takes the canvas as it opens
        raise ImageTooLarge(f"{fmt} header declares more pixels than Pillow opens: {exc}") from None
    except (SyntaxError, OSError, ValueError, TypeError, KeyError, IndexError, EOFError, struct.error) as exc:
        reason = str(exc) or type(exc).__name__
        kind = UnsupportedImage if any(words in reason for words in _UNSUPPORTED) else CorruptImage
        raise kind(f"{fmt} header cannot be read (Pillow: {reason})") from None


def _first(value: object, default: int) -> int:
    """A TIFF tag's first value (Pillow gives one value as an int, several as a tuple)."""
    if isinstance(value, tuple):
        return value[0] if value else default
    return value if isinstance(value, int) else default


def _raw_mode(image: Image.Image) -> str:
    """How the pixel data is stored, where Pillow's mode does not say (16-bit colour PNGs open
    as 8-bit modes, 2 and 4-bit grey as L)."""
    return str(image.tile[0][3]) if image.tile else ""


def _bits(image: Image.Image) -> int:
    """Bits per sample as OpenCV decodes them: 1, 2 and 4-bit samples come as 8."""
    if image.mode in ("I", "F"):
        return 32
    if image.mode.startswith("I;16") or (image.format == "PNG" and ";16" in _raw_mode(image)):
        return 16
    if image.format == "TIFF":
        bits = image.tag_v2.get(_TIFF_BITS_PER_SAMPLE, 8)
        return max(bits) if isinstance(bits, tuple) and bits else _first(bits, 8)
    return 8


def _turned(image: Image.Image) -> int:
    """The orientation the decoded pixels are turned upright by: OpenCV turns a JPEG by its EXIF
    orientation and a TIFF by its Orientation tag, imgrec a PNG or WebP by the EXIF block Pillow
    found before the pixel data. 1 for a missing or malformed value, which neither applies (a bad
    EXIF block should not cost the image)."""
    try:
        if image.format in ("JPEG", "MPO"):
            value = image.getexif().get(_EXIF_ORIENTATION, 1)
        elif image.format == "TIFF":
            value = _first(image.tag_v2.get(_EXIF_ORIENTATION), 1)
        elif image.format in ("PNG", "WEBP") and image.info.get("exif"):
            parsed = Image.Exif()
            parsed.load(image.info["exif"])
            value = parsed.get(_EXIF_ORIENTATION, 1)
            if isinstance(value, bytes):  # an entry typed BYTE
                value = value[0] if value else 1
        else:
            return 1
    except Exception:  # Pillow raises whatever its parsing of a malformed block runs into
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _transparent_grey(image: Image.Image) -> Optional[int]:
    """A grey PNG's tRNS grey, scaled as OpenCV widens 1, 2 and 4-bit grey to 8 bits (Pillow
    gives mode 1's widened already, 2 and 4-bit grey's as stored)."""
    key = image.info.get("transparency")
    if image.format != "PNG" or image.mode not in _GREY_MODES or not isinstance(key, int):
        return None
    stored = {"L;2": 2, "L;4": 4}.get(_raw_mode(image))
    return key * 255 // ((1 << stored) - 1) if stored else key


def _channels(image: Image.Image, transparent_grey: Optional[int]) -> int:
    """The channels OpenCV decodes: grey PNGs and TIFFs as one (four once imgrec adds the tRNS
    alpha), GIFs, palettes and anything with alpha as four, the rest as three, or as their bands
    where more (a CMYK JPEG's four: JPEGs, grey ones too, decode through RGB)."""
    if image.format == "GIF" or image.mode == "P" or "A" in image.mode or "a" in image.mode:
        return 4
    if image.mode in _GREY_MODES and image.format in ("PNG", "TIFF"):
        return 1 if transparent_grey is None else 4
    return max(3, len(image.getbands()))


def read_header(data: bytes) -> ImageHeader:
    """The header's facts, from the file's first bytes through Pillow (no pixel decoded)."""
    if not data:
        raise EmptyFile("file has zero bytes")
    fmt = _format(data)
    image = _open(fmt, data)
    width, height = image.size
    if width <= 0 or height <= 0:
        raise CorruptImage(f"{fmt} header declares an empty size {width}x{height}")
    if fmt == "tiff" and image.mode in ("LA", "La"):
        raise UnsupportedImage("tiff is grey with an alpha sample, which OpenCV drops (or multiplies into the grey) "
                               "when it decodes; convert the image to RGBA, or to grey without alpha")
    bits = _bits(image)
    grey = _transparent_grey(image)
    channels = _channels(image, grey)
    associated = fmt == "tiff" and _first(image.tag_v2.get(_TIFF_EXTRA_SAMPLES), 0) == _ASSOCIATED_ALPHA
    # libtiff's RGBA interface, which OpenCV decodes 8-bit TIFFs through, premultiplies; deeper
    # TIFFs come as stored, premultiplied when their ExtraSamples say associated alpha.
    premultiplied = fmt == "tiff" and channels == 4 and (bits == 8 or associated)
    turned = _turned(image)  # OpenCV turns JPEGs and TIFFs itself, imgrec PNGs and WebPs
    return ImageHeader(fmt, width, height, channels, max(1, -(-bits // 8)), turned if fmt in ("png", "webp") else 1,
                       grey, premultiplied, turned)


# Bytes per pixel that decoding needs beyond the decoded array: the 8-bit RGB copy and the
# upright copy; compositing alpha works on three uint16 planes and an alpha plane.
_RGB_AND_UPRIGHT_BYTES = 3 + 3
_COMPOSITE_BYTES = 2 * 3 * 2 + 2


def decode_working_bytes(header: ImageHeader, spec: ImageSpec) -> int:
    """Peak memory one decode takes: the decoded array, its 8-bit copy, RGB and compositing
    (or unpremultiplying)."""
    per_pixel = header.channels * header.bytes_per_sample + _RGB_AND_UPRIGHT_BYTES
    if header.bytes_per_sample > 1:
        per_pixel += header.channels
    if header.channels == 4 and (spec.alpha == "composite" or header.premultiplied):
        per_pixel += _COMPOSITE_BYTES
    return header.width * header.height * per_pixel


def check_header(data: bytes, spec: ImageSpec) -> ImageHeader:
    """Read the declared size and refuse images outside the spec's limits before any decode, so a
    decompression bomb costs a few header bytes instead of gigabytes of pixels."""
    header = read_header(data)
    pixels = header.width * header.height
    size = f"{header.width}x{header.height}"
    if pixels > spec.max_pixels:
        raise ImageTooLarge(f"declared size {size} = {pixels:.1e} pixels exceeds max_pixels={spec.max_pixels}")
    working = decode_working_bytes(header, spec)
    if working > spec.max_decoded_bytes:
        raise ImageTooLarge(
            f"declared size {size} with {header.channels} channels of {8 * header.bytes_per_sample} bits "
            f"decodes to {header.decoded_bytes} bytes and needs about {working} bytes to convert, more than "
            f"max_decoded_bytes={spec.max_decoded_bytes}")
    if min(header.width, header.height) < spec.min_side:
        raise ImageTooSmall(f"declared size {size} has a side shorter than min_side={spec.min_side}")
    return header
