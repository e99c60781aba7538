"""Turn encoded image bytes into one canonical array: HxWx3 uint8 RGB, upright.

Every later step (resize, normalize, encode) can then ignore formats, bit depths, alpha and
orientation. The image's header was read and checked by the first pass (transforms/images/image_header.py);
the decode takes what it learned there instead of reading it again.
"""
from __future__ import annotations

import functools

import cv2
import numpy as np

from transforms.images import limits
from transforms.images.geometry import upright_size
from transforms.images.image_header import ImageHeader
from transforms.images.jpeg_damage import progression_gap, without_harmless_warnings
from transforms.images.native_stderr import call_capturing_stderr, write_stderr
from transforms.rejections import CorruptImage, ImageTooLarge, UnsupportedImage
from transforms.specs import ImageSpec

# JPEG DCT scaling (where it is used: transforms/specs.py REDUCING_INTERPOLATIONS).
_REDUCED_FLAGS = {1: 0, 2: 16, 4: 32, 8: 64}  # the size bits of cv2.IMREAD_REDUCED_COLOR_2/4/8

# libjpeg's warnings that it made pixels up: data missing from a scan (filled with grey),
# undecodable, or a progressive scan missing from the sequence. Its most common warning,
# extraneous bytes between segments, loses no pixels.
LIBJPEG_LOST_PIXELS = ("premature end of data segment", "Premature end of JPEG file", "bad Huffman code",
                       "bad arithmetic code", "instead of RST", "Inconsistent progression sequence")
# How those messages begin, after whatever OpenCV puts before them (its TIFF reader logs libtiff's
# warnings with a timestamp, which a dead letter must not hold: dead letters are the same bytes
# on every run).
_LIBJPEG_MESSAGE_STARTS = ("Corrupt JPEG data", "Premature end of JPEG file", "Inconsistent progression sequence")
# The checks that refuse damaged images OpenCV would decode, and the limits every decode runs
# under. Part of the input fingerprint, so --skip_unchanged converts again a dataset made without
# them, which may hold such an image.
DAMAGE_CHECKS = f"jpeg, tiff: no libjpeg lost-pixel warning; jpeg: progressive scans complete; {limits.LIMITS}"


def to_uint8(img: np.ndarray) -> np.ndarray:
    """Map any bit depth onto 0-255.

    16-bit is round(x / 257): 0 -> 0, 65535 -> 255 and 257*k -> k, with no ties because 257 is
    odd (convertScaleAbs rounds x * (1/257) to nearest and is exact on all 65,536 values).
    Floats are 0-1 intensities, clipped and rounded.
    """
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return cv2.convertScaleAbs(img, alpha=1 / 257)
    if img.dtype.kind == "f":
        return np.rint(np.clip(np.nan_to_num(img), 0.0, 1.0) * 255.0).astype(np.uint8)
    raise UnsupportedImage(f"unsupported pixel type {img.dtype}")


def composite(rgb: np.ndarray, alpha: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """Blend uint8 RGB over a solid background: round((c * a + bg * (255 - a)) / 255).

    In uint16, which the largest sum (255 * 255 + 127) fits, so the working copies stay small.
    """
    a = alpha.astype(np.uint16)[..., None]
    out = rgb.astype(np.uint16)
    out *= a
    out += np.asarray(background, np.uint16) * (255 - a)
    out += 127
    out //= 255
    return out.astype(np.uint8)


def composite_premultiplied(rgb: np.ndarray, alpha: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """Blend uint8 RGB already multiplied by its alpha over a solid background:
    c + round(bg * (255 - a) / 255), capped at 255 (a colour above its alpha is malformed)."""
    out = np.asarray(background, np.uint16) * (255 - alpha.astype(np.uint16)[..., None])
    out += 127
    out //= 255
    out += rgb
    return np.minimum(out, 255).astype(np.uint8)


def unpremultiply(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Straight colour from premultiplied uint8 RGB: round(c * 255 / a), 0 where a is 0."""
    a = alpha.astype(np.uint16)[..., None]
    out = rgb.astype(np.uint16) * 255
    out += a // 2
    out //= np.maximum(a, 1)
    return np.minimum(out, 255).astype(np.uint8)


def to_rgb(img: np.ndarray, spec: ImageSpec, premultiplied: bool = False) -> np.ndarray:
    """OpenCV's gray, BGR or BGRA uint8 layout to RGB, resolving alpha as the spec says;
    `premultiplied`: the colours of a BGRA image are already multiplied by its alpha."""
    channels = 1 if img.ndim == 2 else img.shape[2]
    if channels == 1:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    if channels == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if channels == 4:
        rgb, alpha = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB), img[..., 3]
        if spec.alpha == "drop":
            return unpremultiply(rgb, alpha) if premultiplied else rgb
        return (composite_premultiplied if premultiplied else composite)(rgb, alpha, spec.background)
    raise CorruptImage(f"unsupported channel count {channels}")


# cv2.flip's codes for EXIF orientations 2-4: mirrored, turned a half, upside down.
_FLIP_CODES = {2: 1, 3: -1, 4: 0}


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Make an image stored with EXIF orientation 1-8 upright; anything else is left as is.

    5-8 are 1-4 transposed: the transposed copy is flipped in place, as cv2.rotate turns by a
    quarter, so no third copy is made."""
    if orientation in (5, 6, 7, 8):
        transposed = cv2.transpose(img)
        code = _FLIP_CODES.get(orientation - 4)
        return transposed if code is None else cv2.flip(transposed, code, dst=transposed)
    code = _FLIP_CODES.get(orientation)
    return img if code is None else cv2.flip(img, code)


def jpeg_scale(header: ImageHeader, spec: ImageSpec) -> int:
    """The largest of 8, 4, 2 that keeps the decoded short side at least twice the output's long
    side (so every resize mode and EXIF orientation still downscales by 2 or more), else 1."""
    if not spec.reduces_jpegs:
        return 1
    needed = 2 * max(spec.height, spec.width)
    short = min(header.width, header.height)
    return next((scale for scale in (8, 4, 2) if -(-short // scale) >= needed), 1)


def decoded_size(header: ImageHeader, spec: ImageSpec) -> tuple[int, int]:
    """(width, height) of what `decode_image` gives, from the header alone: upright (turned as
    `header.turned` says), and reduced by `jpeg_scale` where libjpeg decodes (not `imread`),
    which rounds sizes up. Where annotations go when a previous record's pixels are reused."""
    width, height = upright_size(header.width, header.height, header.turned)
    scale = jpeg_scale(header, spec) if header.format == "jpeg" and spec.decoder != "imread" else 1
    return -(-width // scale), -(-height // scale)


def refuse_made_up_pixels(header: ImageHeader, printed: str, source: str) -> None:
    """libjpeg's only report that it filled in missing or undecodable data is a warning on stderr
    (OpenCV returns the image as decoded), also for the JPEG data inside a TIFF: such a warning
    in what a decode printed makes the image corrupt. Anything else goes on to stderr, naming
    the image."""
    lines = printed.splitlines()
    lost = next((line for line in lines if any(warning in line for warning in LIBJPEG_LOST_PIXELS)), None)
    if lost:
        begins = min((lost.find(start) for start in _LIBJPEG_MESSAGE_STARTS if start in lost), default=0)
        raise CorruptImage(f"{header.format} data is damaged: libjpeg reports \"{lost[begins:].strip()}\" and "
                           "would fill in the missing pixels")
    write_stderr(naming_the_image(lines, source))


def naming_the_image(lines: list[str], source: str) -> str:
    """A decoder's lines for stderr, each naming the image it was decoding."""
    return "".join(f"imgrec: while decoding {source or 'an image'}: {line}\n" for line in lines if line.strip())


def _imdecode(data: bytes, flags: int, header: ImageHeader) -> np.ndarray:
    """OpenCV's decode; a size beyond its pixel limit (transforms/images/limits.py) is ImageTooLarge,
    a decode that runs out of memory is left to `decode_image`."""
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:
        reason = str(exc).strip()
        if "validateInputImageSize" in reason:
            raise ImageTooLarge(f"OpenCV refuses the size the {header.format} data declares to its decoder (more "
                                f"than max_pixels): {reason}") from None
        if exc.code == cv2.Error.StsNoMem:
            raise
        raise CorruptImage(f"OpenCV failed to decode the {header.format} data: {reason}") from None
    if img is None or img.size == 0:
        raise CorruptImage(f"OpenCV could not decode the {header.format} data (corrupt or truncated, or its decoder "
                           "ran out of memory)")
    return img


def decode_jpeg(data: bytes, header: ImageHeader, spec: ImageSpec) -> np.ndarray:
    """libjpeg decodes straight to RGB (grey and CMYK too), at a reduced size when that is
    invisible, and OpenCV turns it by its EXIF orientation."""
    return _imdecode(data, cv2.IMREAD_COLOR_RGB | _REDUCED_FLAGS[jpeg_scale(header, spec)], header)


def decode_like_imread(data: bytes, header: ImageHeader, spec: ImageSpec) -> np.ndarray:
    """`cv2.imread(path)`'s pixels (imread is imdecode of the file's bytes), in RGB order."""
    return cv2.cvtColor(_imdecode(data, cv2.IMREAD_COLOR, header), cv2.COLOR_BGR2RGB)


def with_grey_key_transparent(grey: np.ndarray, key: int) -> np.ndarray:
    """A grey PNG's tRNS made an alpha channel: grey → BGRA, transparent where the grey is `key`."""
    alpha = np.where(grey == key, 0, np.iinfo(grey.dtype).max).astype(grey.dtype)
    return cv2.merge([grey, grey, grey, alpha])


def decode_any(data: bytes, header: ImageHeader, spec: ImageSpec) -> np.ndarray:
    """IMREAD_UNCHANGED keeps alpha and 16-bit depth (so both are converted deliberately here)
    but skips EXIF orientation, which is applied as the header gave it. OpenCV's TIFF reader
    applies the TIFF orientation tag itself, so TIFFs are not turned twice (the header gives
    them none)."""
    img = _imdecode(data, cv2.IMREAD_UNCHANGED, header)
    if header.transparent_grey is not None and img.ndim == 2:
        img = with_grey_key_transparent(img, header.transparent_grey)
    rgb = to_rgb(to_uint8(img), spec, header.premultiplied and img.ndim == 3 and img.shape[2] == 4)
    del img
    return apply_orientation(rgb, header.orientation)


def decode_image(data: bytes, header: ImageHeader, spec: ImageSpec, source: str = "") -> np.ndarray:
    """Decode to HxWx3 uint8 RGB, upright; GIFs give their first frame; large JPEGs may come out
    at 1/2, 1/4 or 1/8 size (see `jpeg_scale`), which the resize that follows absorbs. `header`
    is what the first pass read of these bytes; `source` names the image in what the decoder
    prints.

    The decode runs with stderr captured, and what libjpeg printed is checked
    (`refuse_made_up_pixels`); what a decode that failed printed goes on naming the image.
    Every decode of a process is captured, one at a time, so no other decode's output can land
    in a capture. In a converter process it runs under the decode's memory limit
    (transforms/images/limits.py): a decode that needs more is ImageTooLarge.
    """
    if header.format == "jpeg":
        problem = progression_gap(data)
        if problem:
            raise CorruptImage(problem)
        data = without_harmless_warnings(data)
    decode = decode_like_imread if spec.decoder == "imread" else decode_jpeg if header.format == "jpeg" else decode_any
    try:
        with limits.decode_memory():
            decoded, printed = call_capturing_stderr(
                functools.partial(decode, data, header, spec),
                on_raise=lambda printed: write_stderr(naming_the_image(printed.splitlines(), source)))
    except (cv2.error, MemoryError) as exc:
        if isinstance(exc, cv2.error) and exc.code != cv2.Error.StsNoMem:
            raise
        raise ImageTooLarge(f"decoding the {header.format} data needs more memory than "
                            f"max_decoded_bytes={spec.max_decoded_bytes} allows (its header declares "
                            f"{header.width}x{header.height})") from None
    refuse_made_up_pixels(header, printed, source)
    return decoded
