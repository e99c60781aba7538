"""Header facts (Pillow) and decoding (OpenCV) on real files written by OpenCV and Pillow, checking
the exact pixels the pipeline will store. The limits of a converter process are tested in
test_limits.py."""
from __future__ import annotations

import concurrent.futures
import functools
import io
import re
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from tests.helpers import png_declaring
from transforms.images.decode import apply_orientation, decode_image, jpeg_scale, refuse_made_up_pixels
from transforms.images.image_header import ImageHeader, check_header, decode_working_bytes, read_header
from transforms.rejections import CorruptImage, EmptyFile, ImageTooLarge, ImageTooSmall, NotAnImage, UnsupportedImage
from transforms.specs import ImageSpec

pytestmark = pytest.mark.unit

W, H = 37, 23  # odd and non-square, so swapped or rounded dimensions show up
RED = (255, 0, 0)
SPEC = ImageSpec()


def decode(data: bytes, spec: ImageSpec = SPEC, source: str = "") -> np.ndarray:
    """What the pipeline does with one file's bytes: the first pass checks the header, the
    conversion decodes with it."""
    return decode_image(data, check_header(data, spec), spec, source)


def pillow_file(tmp_path: Path, im: Image.Image, fmt: str, **kwargs) -> bytes:
    path = tmp_path / f"image.{fmt.lower()}"
    im.save(path, fmt, **kwargs)
    return path.read_bytes()


def opencv_file(tmp_path: Path, bgr: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, bgr)
    assert ok
    path = tmp_path / f"image{ext}"
    path.write_bytes(buf.tobytes())
    return path.read_bytes()


def gradient(width: int = W, height: int = H) -> np.ndarray:
    """RGB test pattern in which every pixel differs from its rotations and mirrors."""
    y, x = np.mgrid[0:height, 0:width]
    return np.dstack([x * 6 % 256, y * 10 % 256, (x * 3 + y * 7) % 256]).astype(np.uint8)


def raw_rgb(data: bytes) -> np.ndarray:
    """What OpenCV decodes, unrotated, as RGB: the reference for orientation tests."""
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)[..., ::-1]


PILLOW_FORMATS = [
    ("JPEG", {}),
    ("JPEG", {"progressive": True}),
    ("PNG", {}),
    ("BMP", {}),
    ("WEBP", {"quality": 95}),
    ("WEBP", {"lossless": True}),
    ("TIFF", {}),
    ("GIF", {}),
]


@pytest.mark.parametrize("fmt,kwargs", PILLOW_FORMATS, ids=lambda v: str(v))
def test_pillow_files_header_size_and_rgb_order(tmp_path, fmt, kwargs):
    data = pillow_file(tmp_path, Image.new("RGB", (W, H), RED), fmt, **kwargs)
    header = read_header(data)
    assert (header.format, header.width, header.height, header.bytes_per_sample) == (fmt.lower(), W, H, 1)
    assert header.channels in (3, 4)  # an upper bound where the header cannot tell (palettes, VP8L)
    img = decode(data, SPEC)
    assert img.shape == (H, W, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
    np.testing.assert_allclose(img.reshape(-1, 3).mean(axis=0), RED, atol=3)


@pytest.mark.parametrize("ext,fmt", [(".jpg", "jpeg"), (".png", "png"), (".bmp", "bmp"),
                                     (".webp", "webp"), (".tiff", "tiff")])
def test_opencv_files_header_size_and_rgb_order(tmp_path, ext, fmt):
    bgr = np.zeros((H, W, 3), np.uint8)
    bgr[..., 2] = 255  # red in OpenCV's BGR order
    data = opencv_file(tmp_path, bgr, ext)
    header = read_header(data)
    assert (header.format, header.width, header.height) == (fmt, W, H)
    img = decode(data, SPEC)
    assert img.shape == (H, W, 3)
    np.testing.assert_allclose(img.reshape(-1, 3).mean(axis=0), RED, atol=3)


def test_lossless_formats_decode_exactly(tmp_path):
    rgb = gradient()
    for fmt in ("PNG", "BMP", "TIFF"):
        np.testing.assert_array_equal(decode(pillow_file(tmp_path, Image.fromarray(rgb), fmt), SPEC), rgb)


def test_gif_first_frame(tmp_path):
    frames = [Image.new("RGB", (W, H), RED), Image.new("RGB", (W, H), (0, 0, 255))]
    data = pillow_file(tmp_path, frames[0], "GIF", save_all=True, append_images=frames[1:],
                       duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    img = decode(data, SPEC)
    assert img.shape == (H, W, 3)
    assert (img == RED).all()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_grayscale_becomes_three_equal_channels(tmp_path, fmt):
    gray = gradient()[..., 0]
    img = decode(pillow_file(tmp_path, Image.fromarray(gray, "L"), fmt), SPEC)
    assert img.shape == (H, W, 3)
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
    if fmt == "PNG":
        np.testing.assert_array_equal(img[..., 0], gray)


def test_rgba_png_composite_and_drop(tmp_path):
    rgba = np.array([[[200, 100, 50, 128], [10, 20, 30, 0], [40, 50, 60, 255]]], np.uint8)
    data = pillow_file(tmp_path, Image.fromarray(rgba, "RGBA"), "PNG")
    composite = decode(data, ImageSpec(alpha="composite", background=(0, 0, 255)))
    # round((c * a + bg * (255 - a)) / 255) per channel
    np.testing.assert_array_equal(composite[0], [[100, 50, 152], [0, 0, 255], [40, 50, 60]])
    dropped = decode(data, ImageSpec(alpha="drop"))
    np.testing.assert_array_equal(dropped[0], rgba[0, :, :3])


STRAIGHT_RGBA = np.array([[[200, 100, 50, 255], [95, 130, 194, 95], [10, 240, 70, 200], [250, 5, 128, 128],
                           [30, 60, 90, 1], [10, 20, 30, 0]]], np.uint8)


def tiff_with_alpha(path: Path, rgba: np.ndarray, bits: int, associated: bool) -> bytes:
    """A TIFF of straight RGBA pixels, stored with unassociated alpha or (premultiplied) associated."""
    import tifffile

    maximum = 2**bits - 1
    values = rgba.astype(np.float64) * maximum / 255
    if associated:
        values[..., :3] *= values[..., 3:] / maximum
    tifffile.imwrite(path, np.rint(values).astype(np.uint8 if bits == 8 else np.uint16), photometric="rgb",
                     extrasamples=[1 if associated else 2])
    return path.read_bytes()


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("associated", [False, True], ids=["unassociated", "associated"])
def test_tiff_alpha_blends_as_png_alpha_does(tmp_path, bits, associated):
    """OpenCV returns an 8-bit TIFF's colours premultiplied (libtiff's RGBA interface), a 16-bit
    one's as stored. Either way imgrec must give what the same straight pixels give as a PNG:
    blended once over the background, or, with alpha dropped, the straight colour."""
    data = tiff_with_alpha(tmp_path / "a.tif", STRAIGHT_RGBA, bits, associated)
    png = pillow_file(tmp_path, Image.fromarray(STRAIGHT_RGBA, "RGBA"), "PNG")
    for spec in (ImageSpec(alpha="composite"), ImageSpec(alpha="composite", background=(0, 0, 255))):
        expected = decode(png, spec).astype(int)
        assert np.abs(decode(data, spec).astype(int) - expected).max() <= 1, spec
    dropped = decode(data, ImageSpec(alpha="drop")).astype(int)[0, :-1]  # alpha 0: no colour to recover
    alpha = STRAIGHT_RGBA[0, :-1, 3:].astype(int)
    assert (np.abs(dropped - STRAIGHT_RGBA[0, :-1, :3]) <= np.ceil(255 / alpha)).all(), dropped


def grey_png(values: np.ndarray, depth: int, key: int) -> bytes:
    """A grey PNG (colour type 0) at `depth` bits whose tRNS chunk makes grey `key` transparent."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    height, width = values.shape
    if depth == 16:
        rows = [b"\x00" + row.astype(">u2").tobytes() for row in values]
    else:  # 1, 2, 4 or 8 bits: samples packed from the high bits of each byte
        bits = np.unpackbits(values.astype(np.uint8)[..., None], axis=-1)[..., 8 - depth:].reshape(height, -1)
        rows = [b"\x00" + np.packbits(row).tobytes() for row in bits]
    ihdr = struct.pack(">IIBBBBB", width, height, depth, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"tRNS", struct.pack(">H", key))
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("depth", [1, 2, 4, 8, 16])
def test_grey_png_transparency_composites_over_the_background(depth):
    """OpenCV decodes a grey PNG with a tRNS chunk as opaque grey; the key grey is transparent."""
    top = 2**depth - 1
    key = max(1, top // 3)
    values = np.array([[0, top, key, 0, top]], np.uint16)
    data = grey_png(values, depth, key)
    assert read_header(data).channels == 4  # decoded with an alpha channel: counted in its working memory
    grey = np.rint(values[0].astype(np.float64) * 255 / top).astype(np.uint8)  # OpenCV widens to 8 bits
    opaque = np.repeat(grey[:, None], 3, axis=1)
    composite = decode(data, ImageSpec(alpha="composite", background=(0, 0, 255)))
    np.testing.assert_array_equal(composite[0], np.where((values[0] == key)[:, None], [0, 0, 255], opaque))
    np.testing.assert_array_equal(decode(data, ImageSpec(alpha="drop"))[0], opaque)


@pytest.mark.parametrize("extra_samples", [[1], [2], [0, 2], [2, 0]])
@pytest.mark.parametrize("planar", ["contig", "separate"])
@pytest.mark.parametrize("bits", [8, 16])
def test_grey_tiff_with_alpha_is_unsupported(tmp_path, bits, planar, extra_samples):
    """OpenCV decodes a grey TIFF with an alpha sample as grey, multiplied by the alpha when the
    samples are stored in planes: neither compositing nor dropping the alpha can be done."""
    import tifffile

    grey = gradient()[..., 0]
    samples = np.dstack([grey] + [np.full((H, W), 128, np.uint8)] * len(extra_samples))
    values = samples if bits == 8 else samples.astype(np.uint16) * 257
    if planar == "separate":
        values = np.moveaxis(values, -1, 0)
    path = tmp_path / "ga.tif"
    tifffile.imwrite(path, values, photometric="minisblack", planarconfig=planar, extrasamples=extra_samples)
    for spec in (ImageSpec(alpha="composite"), ImageSpec(alpha="drop")):  # Pillow knows some layouts by name
        with pytest.raises(UnsupportedImage, match="tiff is grey with an alpha sample|unknown pixel mode"):
            check_header(path.read_bytes(), spec)


def test_grey_tiff_with_an_extra_sample_that_is_not_alpha_is_grey(tmp_path):
    import tifffile

    grey = gradient()[..., 0]
    tifffile.imwrite(tmp_path / "g.tif", np.dstack([grey, grey // 2]), photometric="minisblack", extrasamples=[0])
    np.testing.assert_array_equal(decode((tmp_path / "g.tif").read_bytes(), SPEC),
                                  np.repeat(grey[..., None], 3, axis=2))


def test_16bit_png_rounds_to_nearest(tmp_path):
    values = np.array([[0, 128, 129, 257, 385, 386, 32896, 65535]], np.uint16)
    expected = [0, 0, 1, 1, 1, 2, 128, 255]  # round(x / 257)
    gray = decode(opencv_file(tmp_path, values, ".png"), SPEC)
    np.testing.assert_array_equal(gray[0, :, 0], expected)
    bgr = np.dstack([values, np.zeros_like(values), np.full_like(values, 65535)])
    color = decode(opencv_file(tmp_path, bgr, ".png"), SPEC)
    np.testing.assert_array_equal(color[0, :, 0], np.full(8, 255))
    np.testing.assert_array_equal(color[0, :, 2], expected)


def test_float_tiff_clips_to_unit_range(tmp_path):
    values = np.array([[0.0, 0.25, 0.5, 1.0, 2.0, -1.0]], np.float32)
    img = decode(opencv_file(tmp_path, values, ".tiff"), SPEC)
    np.testing.assert_array_equal(img[0, :, 0], [0, 64, 128, 255, 255, 0])


@pytest.mark.parametrize("orientation,quarter_turns", [(3, 2), (6, -1), (8, 1)])
def test_exif_orientation_jpeg(tmp_path, orientation, quarter_turns):
    im = Image.fromarray(gradient())
    exif = im.getexif()
    exif[0x0112] = orientation
    data = pillow_file(tmp_path, im, "JPEG", quality=95, exif=exif.tobytes())
    img = decode(data, SPEC)
    np.testing.assert_array_equal(img, np.rot90(raw_rgb(data), quarter_turns))
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
    assert img.shape == upright.shape
    assert np.abs(img.astype(int) - upright).mean() < 2


def test_tiff_orientation_is_applied_once(tmp_path):
    """OpenCV's TIFF reader applies the orientation tag itself and returns no EXIF block."""
    im = Image.fromarray(gradient())
    exif = im.getexif()
    exif[0x0112] = 6
    data = pillow_file(tmp_path, im, "TIFF", exif=exif.tobytes())
    np.testing.assert_array_equal(decode(data, SPEC), np.rot90(gradient(), -1))


PILLOW_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
                    4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
                    6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                    8: Image.Transpose.ROTATE_90}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_apply_orientation_matches_pillow(orientation):
    rgb = gradient()
    im = Image.fromarray(rgb)
    expected = im.transpose(PILLOW_TRANSPOSE[orientation]) if orientation in PILLOW_TRANSPOSE else im
    np.testing.assert_array_equal(apply_orientation(rgb, orientation), np.asarray(expected))


def exif_block(order: str, kind: int, orientation: int = 6) -> bytes:
    """An EXIF block whose only entry is Orientation, stored with integer type `kind`."""
    code = {1: "B", 3: "H", 4: "I", 8: "h", 9: "i", 16: "Q"}[kind]
    value = struct.pack(order + code, orientation)
    inline, after = (value.ljust(4, b"\x00"), b"") if len(value) <= 4 else (struct.pack(order + "I", 26), value)
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "IH", 8, 1)
    return b"Exif\x00\x00" + head + struct.pack(order + "HHI", 0x0112, kind, 1) + inline + b"\x00" * 4 + after


@pytest.mark.parametrize("kind", [1, 3, 4, 8, 9, 16], ids=["BYTE", "SHORT", "LONG", "SSHORT", "SLONG", "LONG8"])
@pytest.mark.parametrize("order", ["<", ">"], ids=["II", "MM"])
def test_cmyk_jpegs_turn_upright_as_plain_ones_whatever_the_orientations_type(tmp_path, order, kind):
    """OpenCV turns every JPEG itself, by its own reading of the orientation."""
    wide = np.zeros((8, 16, 3), np.uint8)
    wide[:, :8] = 200
    exif = exif_block(order, kind)
    plain = decode(pillow_file(tmp_path, Image.fromarray(wide), "JPEG", exif=exif, quality=95), SPEC)
    cmyk = decode(pillow_file(tmp_path, Image.fromarray(wide).convert("CMYK"), "JPEG", exif=exif), SPEC)
    assert plain.shape == cmyk.shape
    assert (plain.shape[0] > plain.shape[1]) == (kind in (3, 8) or (order == "<" and kind != 16))


@pytest.mark.parametrize("fmt,kwargs", [("PNG", {}), ("WEBP", {"lossless": True})])
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_png_and_webp_turn_upright_by_their_exif(tmp_path, fmt, kwargs, orientation):
    """OpenCV's decode with alpha turns nothing: the orientation the header read is applied."""
    im = Image.fromarray(gradient())
    exif = im.getexif()
    exif[0x0112] = orientation
    data = pillow_file(tmp_path, im, fmt, exif=exif.tobytes(), **kwargs)
    assert read_header(data).orientation == orientation
    np.testing.assert_array_equal(decode(data), np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data)))))


def test_what_a_failed_decode_printed_names_the_image(tmp_path, capfd):
    """libtiff and OpenCV print their reasons for a truncated TIFF; each line names the file."""
    import tifffile

    tifffile.imwrite(tmp_path / "whole.tif", np.full((40, 50, 3), 7, np.uint8), photometric="rgb")
    whole = (tmp_path / "whole.tif").read_bytes()
    with pytest.raises(CorruptImage):
        decode(whole[:len(whole) // 2], SPEC, "cut.tif")
    lines = capfd.readouterr().err.splitlines()
    assert lines and all(line.startswith("imgrec: while decoding cut.tif: ") and line[32:].strip() for line in lines)


def test_bigtiff_decodes(tmp_path):
    import tifffile

    tifffile.imwrite(tmp_path / "big.tif", gradient(), bigtiff=True, photometric="rgb")
    assert (tmp_path / "big.tif").read_bytes()[:4] == b"II+\x00"
    np.testing.assert_array_equal(decode((tmp_path / "big.tif").read_bytes()), gradient())


def test_bmp_top_down(tmp_path):
    rgb = gradient(3, 2)
    def row(r: int) -> bytes:
        return rgb[r, :, ::-1].tobytes() + b"\x00" * 3  # BGR, padded to 4 bytes

    bottom_up = pillow_file(tmp_path, Image.fromarray(rgb), "BMP")
    offset = struct.unpack_from("<I", bottom_up, 10)[0]
    top_down = bytearray(bottom_up[:offset] + row(0) + row(1))
    struct.pack_into("<i", top_down, 22, -2)
    assert (read_header(bytes(top_down)).width, read_header(bytes(top_down)).height) == (3, 2)
    np.testing.assert_array_equal(decode(bytes(top_down), SPEC), rgb)


def test_cmyk_jpeg_becomes_rgb(tmp_path):
    data = pillow_file(tmp_path, Image.new("RGB", (W, H), RED).convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    img = decode(data, SPEC)
    assert img.shape == (H, W, 3)
    np.testing.assert_allclose(img.reshape(-1, 3).mean(axis=0), RED, atol=3)


def test_truncated_jpeg_is_corrupt(tmp_path):
    data = pillow_file(tmp_path, Image.fromarray(gradient(256, 256)), "JPEG")
    for cut in (len(data) // 2, len(data) - 2):
        with pytest.raises(CorruptImage, match="jpeg"):
            decode(data[:cut], SPEC)


def test_jpeg_padding_and_appended_data_still_decode(tmp_path):
    data = pillow_file(tmp_path, Image.fromarray(gradient()), "JPEG")
    expected = decode(data, SPEC)
    for suffix in (b"\x00" * 64, b"\n", b"ftypmp42 appended video of a motion photo"):
        np.testing.assert_array_equal(decode(data + suffix, SPEC), expected)


def noisy_photo(size: int = 128) -> np.ndarray:
    """BGR gradient with noise: enough entropy-coded data to cut in the middle of a scan."""
    noise = np.random.default_rng(3).integers(0, 64, (size, size, 3))
    return ((gradient(size, size) // 2 + noise) % 256).astype(np.uint8)


def encoded(bgr: np.ndarray, *params: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", bgr, list(params))
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("params", [(), (cv2.IMWRITE_JPEG_RST_INTERVAL, 4), (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)],
                         ids=["baseline", "restart_markers", "progressive"])
@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.9])
def test_jpeg_cut_inside_a_scan_with_an_end_marker_appended_is_corrupt(params, fraction, capfd):
    """libjpeg fills the rest with grey and only warns; OpenCV returns the image as decoded."""
    data = encoded(noisy_photo(), *params)
    cut = data[:int(len(data) * fraction)] + b"\xff\xd9"
    with pytest.raises(CorruptImage, match="jpeg data is damaged|progressive jpeg ends before its last scans"):
        decode(cut, SPEC)
    assert "Corrupt JPEG data" not in capfd.readouterr().err  # the warning became the reason


def test_progressive_jpeg_cut_between_scans_is_corrupt():
    """Cut exactly before its last scan, libjpeg decodes the scans that are there without a word."""
    data = encoded(noisy_photo(), cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    last_scan = data.rfind(b"\xff\xda")
    cut = data[:last_scan] + b"\xff\xd9"
    assert cv2.imdecode(np.frombuffer(cut, np.uint8), cv2.IMREAD_COLOR) is not None
    with pytest.raises(CorruptImage, match="progressive jpeg ends before its last scans: 1 of 3 components"):
        decode(cut, SPEC)


@pytest.mark.parametrize("params", [(), (cv2.IMWRITE_JPEG_RST_INTERVAL, 1), (cv2.IMWRITE_JPEG_PROGRESSIVE, 1),
                                    (cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444)],
                         ids=["baseline", "restart_markers", "progressive", "444"])
@pytest.mark.parametrize("grey", [False, True])
def test_complete_jpegs_of_every_kind_decode_silently(params, grey, capfd):
    image = noisy_photo()
    data = encoded(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if grey else image, *params)
    expected = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(decode(data + b"appended after the end marker", SPEC), expected)
    assert capfd.readouterr().err == ""


def test_other_libjpeg_warnings_pass_through_to_stderr_naming_the_image(capfd):
    """Bytes between the scan and the end marker lose no pixels: the image is kept, the warning shown."""
    data = encoded(noisy_photo())
    padded = data[:-2] + b"\x00\x00" + data[-2:]
    np.testing.assert_array_equal(decode(padded, SPEC, "in/a/padded.jpg"), decode(data, SPEC))
    assert re.fullmatch(r"imgrec: while decoding in/a/padded\.jpg: Corrupt JPEG data: \d extraneous bytes before "
                        r"marker 0xd9\n", capfd.readouterr().err)


def with_stray_bytes(data: bytes, stray: bytes = b"\x00\x00") -> bytes:
    quantization = data.find(b"\xff\xdb")
    return data[:quantization] + stray + data[quantization:]


def with_jfif_version(data: bytes, major: int) -> bytes:
    version = data.find(b"JFIF\x00") + 5
    return data[:version] + bytes([major]) + data[version + 1:]


@pytest.mark.parametrize("oddity", [with_stray_bytes, functools.partial(with_stray_bytes, stray=b"\xff\x00\x00\x04ab"),
                                    functools.partial(with_jfif_version, major=2)],
                         ids=["stray_bytes", "stuffed_zero_and_bytes", "jfif_2"])
def test_harmless_header_oddities_neither_change_pixels_nor_hide_a_cut_scan(oddity, capfd):
    """libjpeg prints only its first warning; a harmless one in the header would take it."""
    data = encoded(noisy_photo())
    np.testing.assert_array_equal(decode(oddity(data), SPEC), decode(data, SPEC))
    assert capfd.readouterr().err == ""
    cut = oddity(data[:len(data) // 2] + b"\xff\xd9")
    with pytest.raises(CorruptImage, match="premature end of data segment"):
        decode(cut, SPEC)


@pytest.mark.parametrize("stray", [b"\x00\x00", b"\xff\x00\x10\x00"], ids=["bytes", "stuffed_zero"])
def test_stray_bytes_between_progressive_scans_are_skipped_as_libjpeg_skips_them(stray, capfd):
    """libjpeg warns and decodes every scan; the scan-coverage check must find them all too."""
    data = encoded(noisy_photo(), cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    second_scan = data.find(b"\xff\xda", data.find(b"\xff\xda") + 2)
    odd = data[:second_scan] + stray + data[second_scan:]
    expected = cv2.cvtColor(cv2.imdecode(np.frombuffer(odd, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    np.testing.assert_array_equal(decode(odd, SPEC), expected)
    assert "extraneous bytes" in capfd.readouterr().err


def test_progressive_jpeg_missing_a_scan_in_the_middle_is_corrupt():
    data = encoded(noisy_photo(), cv2.IMWRITE_JPEG_PROGRESSIVE, 1)
    scans = [i for i in range(len(data) - 1) if data[i:i + 2] == b"\xff\xda"]
    refused = 0
    for dropped in range(1, len(scans) - 1):
        try:
            decode(data[:scans[dropped]] + data[scans[dropped + 1]:], SPEC)
        except CorruptImage:
            refused += 1
    assert refused >= len(scans) - 3  # a scan whose loss leaves only stray bytes may pass (README)


def jpeg_tiff(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "TIFF", compression="jpeg", quality=90)
    return buffer.getvalue()


def damaged_jpeg_tiff() -> bytes:
    """A JPEG-compressed TIFF whose JPEG data hits an end marker halfway."""
    data = bytearray(jpeg_tiff(noisy_photo()))
    data[len(data) // 2:len(data) // 2 + 2] = b"\xff\xd9"
    return bytes(data)


def test_a_lost_pixels_warning_worded_otherwise_is_still_a_reason():
    """Another libjpeg build could word the start of its message differently: the whole line then."""
    header = ImageHeader("jpeg", 8, 8)
    with pytest.raises(CorruptImage, match='reports "JPEG: premature end of data segment"'):
        refuse_made_up_pixels(header, "JPEG: premature end of data segment\n", "a.jpg")


def test_damaged_jpeg_data_inside_a_tiff_is_corrupt():
    """OpenCV logs libtiff's warnings with a timestamp; the reason must not hold it."""
    with pytest.raises(CorruptImage) as refused:
        decode(damaged_jpeg_tiff(), SPEC)
    assert str(refused.value) == ('tiff data is damaged: libjpeg reports "Corrupt JPEG data: premature end of data '
                                  'segment" and would fill in the missing pixels')


def test_decodes_on_other_threads_never_put_their_warnings_into_a_capture():
    damaged, valid = damaged_jpeg_tiff(), encoded(noisy_photo())

    def outcome(index: int) -> str:
        try:
            decode(damaged if index % 2 else valid, SPEC)
            return "written"
        except CorruptImage:
            return "refused"

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(outcome, range(200)))
    assert outcomes == ["written", "refused"] * 100


def test_truncated_png_is_corrupt(tmp_path):
    data = pillow_file(tmp_path, Image.fromarray(gradient(256, 256)), "PNG")
    for cut in (len(data) // 2, len(data) - 12):
        with pytest.raises(CorruptImage, match="png"):
            decode(data[:cut], SPEC)


@pytest.mark.parametrize("fmt,keep", [("JPEG", 12), ("PNG", 20), ("GIF", 9), ("BMP", 20),
                                      ("WEBP", 16), ("TIFF", 12)])
def test_truncated_headers_are_corrupt(tmp_path, fmt, keep):
    data = pillow_file(tmp_path, Image.fromarray(gradient()), fmt)
    with pytest.raises(CorruptImage, match=fmt.lower()):
        read_header(data[:keep])


def test_png_ihdr_crc_mismatch_is_corrupt(tmp_path):
    data = bytearray(pillow_file(tmp_path, Image.fromarray(gradient()), "PNG"))
    data[19] ^= 1  # a bit of the declared width
    with pytest.raises(CorruptImage, match="png header cannot be read .*checksum"):
        read_header(bytes(data))


def test_random_bytes_are_not_an_image(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(b"\x13\x37" + np.random.default_rng(0).bytes(998))
    with pytest.raises(NotAnImage, match="13 37"):
        decode(path.read_bytes(), SPEC)


def test_zero_bytes_is_empty_file(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    with pytest.raises(EmptyFile):
        decode(path.read_bytes(), SPEC)


def test_png_decompression_bomb_rejected_from_header():
    with pytest.raises(ImageTooLarge, match=r"100000x100000 = 1\.0e\+10 pixels exceeds max_pixels=178956970"):
        check_header(png_declaring(100_000, 100_000), SPEC)


def test_webp_decompression_bomb_rejected_from_header():
    """Pillow's WebP reader takes its canvas as it opens, so Pillow itself refuses first."""
    chunk = b"VP8X" + struct.pack("<I", 10) + bytes(4) + (16382).to_bytes(3, "little") * 2
    with pytest.raises(ImageTooLarge, match="webp header declares more pixels than Pillow opens"):
        check_header(b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk, SPEC)


def test_jpeg_decompression_bomb_rejected_from_header(tmp_path):
    data = bytearray(pillow_file(tmp_path, Image.fromarray(gradient()), "JPEG"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, 60_000, 60_000)  # height, width after length + precision
    assert read_header(bytes(data)).width == 60_000
    with pytest.raises(ImageTooLarge, match="60000x60000"):
        check_header(bytes(data), SPEC)


def test_min_side_rejected(tmp_path):
    data = pillow_file(tmp_path, Image.new("RGB", (40, 7), RED), "PNG")
    with pytest.raises(ImageTooSmall, match="40x7.*min_side=8"):
        check_header(data, ImageSpec(min_side=8))
    assert check_header(data, ImageSpec(min_side=7)).height == 7


# --- decoded size in bytes, not only pixels ---------------------------------------------------

@pytest.mark.parametrize("bit_depth,color_type,channels,bytes_per_sample", [
    (8, 0, 1, 1), (8, 2, 3, 1), (8, 6, 4, 1), (16, 2, 3, 2), (16, 6, 4, 2), (16, 4, 4, 2), (8, 3, 4, 1),
], ids=["gray", "rgb", "rgba", "rgb16", "rgba16", "gray-alpha16", "palette"])
def test_png_header_declares_channels_and_bit_depth(bit_depth, color_type, channels, bytes_per_sample):
    header = read_header(png_declaring(300, 200, bit_depth, color_type))
    assert (header.channels, header.bytes_per_sample) == (channels, bytes_per_sample)
    assert header.decoded_bytes == 300 * 200 * channels * bytes_per_sample


def test_a_16_bit_rgba_png_within_max_pixels_is_refused_by_its_decoded_bytes():
    """13000x13000 is below max_pixels, but decoding it 16-bit RGBA needs about 8 GB."""
    data = png_declaring(13_000, 13_000, bit_depth=16, color_type=6)
    assert 13_000 * 13_000 <= SPEC.max_pixels
    header = read_header(data)
    assert decode_working_bytes(header, SPEC) >= header.decoded_bytes == 13_000 * 13_000 * 8
    with pytest.raises(ImageTooLarge, match=r"4 channels of 16 bits .* max_decoded_bytes=1073741824"):
        check_header(data, SPEC)
    # 10000x10000 8-bit gray needs far less and passes; 16-bit RGBA of that size does not.
    assert check_header(png_declaring(10_000, 10_000, 8, 0), SPEC).channels == 1
    with pytest.raises(ImageTooLarge):
        check_header(png_declaring(10_000, 10_000, 16, 6), SPEC)


def test_decode_working_bytes_grow_with_what_decoding_creates():
    rgb = read_header(png_declaring(100, 100, 8, 2))
    rgba = read_header(png_declaring(100, 100, 8, 6))
    rgba16 = read_header(png_declaring(100, 100, 16, 6))
    composite, drop = ImageSpec(alpha="composite"), ImageSpec(alpha="drop")
    assert decode_working_bytes(rgb, composite) < decode_working_bytes(rgba, drop)
    assert decode_working_bytes(rgba, drop) < decode_working_bytes(rgba, composite)
    assert decode_working_bytes(rgba, composite) < decode_working_bytes(rgba16, composite)
    assert decode_working_bytes(rgb, composite) >= rgb.decoded_bytes


# --- decoder: imread (cv2.imread's pixels, for reproducing scripts built on it) ----------------

IMREAD = ImageSpec(decoder="imread")


def imread_rgb(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


def test_imread_decoder_equals_cv2_imread_where_imgrec_differs(tmp_path):
    rgba = np.dstack([gradient(), np.linspace(0, 255, W * H).reshape(H, W).astype(np.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    values = (gradient().astype(np.uint16) * 257 + 128)[..., ::-1]  # 16-bit BGR, low bytes set
    cv2.imwrite(str(tmp_path / "deep.png"), values)
    im = Image.fromarray(gradient())
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(tmp_path / "rotated.jpg", quality=95, exif=exif.tobytes())
    for name in ("rgba.png", "deep.png", "rotated.jpg"):
        path = tmp_path / name
        ours = decode(path.read_bytes(), IMREAD)
        np.testing.assert_array_equal(ours, imread_rgb(path), err_msg=name)
    # imgrec's own decoder composites alpha and rounds 16 bits: different pixels, by design.
    for name in ("rgba.png", "deep.png"):
        path = tmp_path / name
        assert not np.array_equal(decode(path.read_bytes(), SPEC), imread_rgb(path)), name


def test_imread_decoder_keeps_the_header_checks(tmp_path):
    with pytest.raises(ImageTooLarge):
        decode(png_declaring(100_000, 100_000), IMREAD)
    data = pillow_file(tmp_path, Image.fromarray(gradient(256, 256)), "JPEG")
    with pytest.raises(CorruptImage, match="truncated"):
        decode(data[: len(data) // 2], IMREAD)


# --- reduced JPEG decode (DCT scaling) --------------------------------------------------------

def large_photo_jpeg(width: int = 1600, height: int = 1200) -> bytes:
    rng = np.random.default_rng(0)
    base = cv2.resize(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), (width, height), interpolation=cv2.INTER_CUBIC)
    noisy = np.clip(base.astype(int) + rng.integers(-10, 11, base.shape), 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", noisy, [cv2.IMWRITE_JPEG_QUALITY, 92])
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("width,height,size,interpolation,reduced,scale", [
    (1600, 1200, 224, "area", "auto", 2),  # short side 1200 / 2 = 600 >= 2 * 224
    (1600, 1200, 150, "area", "auto", 4),
    (1600, 1200, 64, "area", "auto", 8),
    (1600, 1200, 301, "area", "auto", 1),  # 1200 / 2 = 600 < 602
    (1200, 1600, 64, "area", "auto", 8),  # portrait: the short side decides
    (1600, 1200, 64, "cubic", "auto", 1),  # interpolations that do not average never reduce
    (1600, 1200, 64, "linear", "auto", 1),
    (1600, 1200, 64, "area", "off", 1),
])
def test_jpeg_scale(width, height, size, interpolation, reduced, scale):
    spec = ImageSpec(height=size, width=size, interpolation=interpolation, reduced_decode=reduced)
    assert jpeg_scale(ImageHeader("jpeg", width, height), spec) == scale


@pytest.mark.parametrize("size", [224, 150, 64])
def test_reduced_decode_is_invisible_after_an_area_resize(size):
    from transforms.images.resize import resize_image

    data = large_photo_jpeg()
    auto = ImageSpec(height=size, width=size, interpolation="area", normalize="none")
    off = ImageSpec(height=size, width=size, interpolation="area", normalize="none", reduced_decode="off")
    reduced, full = decode(data, auto), decode(data, off)
    assert reduced.shape[0] < full.shape[0] and full.shape == (1200, 1600, 3)  # it did decode smaller
    a, b = resize_image(reduced, auto).astype(float), resize_image(full, off).astype(float)
    psnr = 10 * np.log10(255**2 / ((a - b) ** 2).mean())
    assert psnr >= 50, psnr


def test_without_area_interpolation_the_decode_is_exact():
    data = large_photo_jpeg()
    cubic = ImageSpec(height=64, width=64, interpolation="cubic")
    np.testing.assert_array_equal(decode(data, cubic),
                                  cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR),
                                               cv2.COLOR_BGR2RGB))
