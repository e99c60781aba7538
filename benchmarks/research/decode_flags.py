"""OpenCV decode flags and colour order, for imgrec's decode path.

    python -m benchmarks.research.decode_flags [--imagenet benchmarks/corpus/10000 --n 2000]

Part 1 probes behaviour on small synthetic JPEGs: EXIF orientation (6 = rotate 90° CW) under
IMREAD_COLOR, IMREAD_COLOR_RGB, IMREAD_UNCHANGED, IMREAD_REDUCED_COLOR_2 (with and without
IMREAD_COLOR_RGB), imdecodeWithMetadata; grayscale and CMYK JPEGs under the reduced flags.
Part 2 checks on the corpus whether decode-to-RGB equals decode + cvtColor, and whether
resize-then-cvtColor equals cvtColor-then-resize per interpolation, with times per image.
"""
from __future__ import annotations

import argparse
import io
import pathlib
import struct
import time

import cv2
import numpy as np


def exif_app1(orientation: int) -> bytes:
    """An APP1 Exif segment holding only IFD0 Orientation."""
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1)
    tiff += struct.pack("<HHI", 0x0112, 3, 1) + struct.pack("<HH", orientation, 0) + struct.pack("<I", 0)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def with_exif(jpeg: bytes, orientation: int) -> bytes:
    return jpeg[:2] + exif_app1(orientation) + jpeg[2:]


def test_image(h: int = 480, w: int = 640) -> np.ndarray:
    """BGR, non-square, a red block top-left so rotations and channel order are visible."""
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 1] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    img[: h // 4, : w // 4] = (0, 0, 255)
    return img


def describe(img) -> str:
    if img is None:
        return "None"
    ch = 1 if img.ndim == 2 else img.shape[2]
    corner = [int(v) for v in np.atleast_1d(img[5, 5])]
    return f"{img.shape[1]}x{img.shape[0]}x{ch} corner={corner}"


def probe() -> None:
    print("# Part 1: behaviour on synthetic JPEGs (stored 640x480, red block top-left, BGR (0,0,255))")
    ok, enc = cv2.imencode(".jpg", test_image(), [cv2.IMWRITE_JPEG_QUALITY, 95])
    plain = enc.tobytes()
    rotated = with_exif(plain, 6)
    flags = {"IMREAD_COLOR": cv2.IMREAD_COLOR, "IMREAD_COLOR_RGB": cv2.IMREAD_COLOR_RGB,
             "IMREAD_UNCHANGED": cv2.IMREAD_UNCHANGED,
             "IMREAD_REDUCED_COLOR_2": cv2.IMREAD_REDUCED_COLOR_2,
             "IMREAD_REDUCED_COLOR_2|IMREAD_COLOR_RGB": cv2.IMREAD_REDUCED_COLOR_2 | cv2.IMREAD_COLOR_RGB,
             "IMREAD_REDUCED_GRAYSCALE_2|IMREAD_COLOR_RGB": cv2.IMREAD_REDUCED_GRAYSCALE_2 | cv2.IMREAD_COLOR_RGB,
             "IMREAD_REDUCED_GRAYSCALE_4|IMREAD_COLOR_RGB": cv2.IMREAD_REDUCED_GRAYSCALE_4 | cv2.IMREAD_COLOR_RGB,
             "IMREAD_REDUCED_COLOR_2|IMREAD_IGNORE_ORIENTATION": cv2.IMREAD_REDUCED_COLOR_2 | cv2.IMREAD_IGNORE_ORIENTATION,
             "IMREAD_REDUCED_GRAYSCALE_2": cv2.IMREAD_REDUCED_GRAYSCALE_2}
    print(f"flag values: COLOR={cv2.IMREAD_COLOR} COLOR_RGB={cv2.IMREAD_COLOR_RGB} "
          f"REDUCED_COLOR_2={cv2.IMREAD_REDUCED_COLOR_2} REDUCED_COLOR_4={cv2.IMREAD_REDUCED_COLOR_4} "
          f"REDUCED_COLOR_8={cv2.IMREAD_REDUCED_COLOR_8} IGNORE_ORIENTATION={cv2.IMREAD_IGNORE_ORIENTATION}")
    for name, flag in flags.items():
        try:
            a = cv2.imdecode(np.frombuffer(plain, np.uint8), flag)
            b = cv2.imdecode(np.frombuffer(rotated, np.uint8), flag)
        except cv2.error as exc:
            print(f"  imdecode {name:50s} error: {str(exc).strip().splitlines()[-1][:100]}")
            continue
        print(f"  imdecode {name:50s} no EXIF: {describe(a):40s} EXIF 6: {describe(b)}")
    for name, flag in flags.items():
        try:
            img, types, meta = cv2.imdecodeWithMetadata(np.frombuffer(rotated, np.uint8), flag)
            has_exif = cv2.IMAGE_METADATA_EXIF in list(types)
            print(f"  imdecodeWithMetadata {name:38s} EXIF 6: {describe(img):40s} exif returned: {has_exif}")
        except cv2.error as exc:
            print(f"  imdecodeWithMetadata {name:38s} error: {str(exc).strip().splitlines()[-1][:100]}")

    gray = cv2.cvtColor(test_image(), cv2.COLOR_BGR2GRAY)
    ok, genc = cv2.imencode(".jpg", gray, [cv2.IMWRITE_JPEG_QUALITY, 95])
    gbuf = np.frombuffer(genc.tobytes(), np.uint8)
    print("\n  grayscale JPEG:")
    for name in ("IMREAD_UNCHANGED", "IMREAD_COLOR", "IMREAD_REDUCED_COLOR_2", "IMREAD_REDUCED_GRAYSCALE_2|IMREAD_COLOR_RGB",
                 "IMREAD_REDUCED_GRAYSCALE_2"):
        img = cv2.imdecode(gbuf, flags[name])
        same = img.ndim == 3 and np.array_equal(img[..., 0], img[..., 2])
        print(f"    {name:45s} {describe(img):40s} channels equal: {same}")
    full = cv2.imdecode(gbuf, cv2.IMREAD_UNCHANGED)
    red = cv2.imdecode(gbuf, cv2.IMREAD_REDUCED_GRAYSCALE_2)
    area = cv2.resize(full, (red.shape[1], red.shape[0]), interpolation=cv2.INTER_AREA)
    print(f"    reduced gray vs area-resized full gray: max diff {int(np.abs(red.astype(int) - area).max())}")

    from PIL import Image

    rgb = cv2.cvtColor(test_image(), cv2.COLOR_BGR2RGB)
    cmyk_buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(cmyk_buf, "JPEG", quality=95)
    cbuf = np.frombuffer(cmyk_buf.getvalue(), np.uint8)
    pil_rgb = np.asarray(Image.open(io.BytesIO(cmyk_buf.getvalue())).convert("RGB"))
    print("\n  CMYK JPEG (Pillow, Adobe inverted), expected RGB corner", list(pil_rgb[5, 5]))
    ref = cv2.imdecode(cbuf, cv2.IMREAD_COLOR)
    for name in ("IMREAD_UNCHANGED", "IMREAD_COLOR", "IMREAD_COLOR_RGB", "IMREAD_REDUCED_COLOR_2",
                 "IMREAD_REDUCED_GRAYSCALE_2|IMREAD_COLOR_RGB"):
        img = cv2.imdecode(cbuf, flags[name])
        extra = ""
        if img is not None and img.ndim == 3 and img.shape[2] == 3 and name.startswith("IMREAD_REDUCED"):
            small = cv2.resize(ref, (img.shape[1], img.shape[0]), interpolation=cv2.INTER_AREA)
            if "RGB" in name:
                small = small[..., ::-1]
            extra = f" vs area(full IMREAD_COLOR): max diff {int(np.abs(img.astype(int) - small).max())}"
        print(f"    {name:45s} {describe(img)}{extra}")


INTERP = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
          "cubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4}


def _best(fn, repeat: int = 3):
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()  # CPU time of this thread: robust to other load on the machine
        out = fn()
        best = min(best, time.thread_time() - start)
    return out, best


def colour_order(folder: pathlib.Path, n: int) -> None:
    """Timings are best of 3 per image, with the variants' order rotating from image to image."""
    paths = sorted(folder.glob("*/*.jpg"))
    paths = paths[:: max(1, len(paths) // n)][:n]
    datas = [np.frombuffer(p.read_bytes(), np.uint8) for p in paths]
    print(f"\n# Part 2: {len(datas)} images of {folder}, one OpenCV thread, ms per image (mean of best-of-3)")
    decoders = {
        "imdecode(IMREAD_COLOR)": lambda b: cv2.imdecode(b, cv2.IMREAD_COLOR),
        "imdecode(IMREAD_COLOR) + cvtColor": lambda b: cv2.cvtColor(cv2.imdecode(b, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB),
        "imdecode(IMREAD_COLOR_RGB)": lambda b: cv2.imdecode(b, cv2.IMREAD_COLOR_RGB),
        "imdecode(IMREAD_UNCHANGED) + cvtColor": lambda b: cv2.cvtColor(cv2.imdecode(b, cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB),
        "imdecodeWithMetadata(UNCHANGED) + cvtColor (imgrec)":
            lambda b: cv2.cvtColor(cv2.imdecodeWithMetadata(b, cv2.IMREAD_UNCHANGED)[0], cv2.COLOR_BGR2RGB),
        "imdecodeWithMetadata(IMREAD_COLOR_RGB)": lambda b: cv2.imdecodeWithMetadata(b, cv2.IMREAD_COLOR_RGB)[0],
    }
    t = {k: 0.0 for k in decoders}
    same = 0
    bgrs = []
    names = list(decoders)
    for i, buf in enumerate(datas):
        outs = {}
        for name in names[i % len(names):] + names[:i % len(names)]:
            outs[name], seconds = _best(lambda: decoders[name](buf))
            t[name] += seconds
        same += int(np.array_equal(outs["imdecode(IMREAD_COLOR) + cvtColor"], outs["imdecode(IMREAD_COLOR_RGB)"]))
        bgrs.append(outs["imdecode(IMREAD_COLOR)"])
    print(f"  imdecode(IMREAD_COLOR_RGB) == cvtColor(imdecode(IMREAD_COLOR), BGR2RGB): {same}/{len(datas)} bit-identical")
    for name, seconds in t.items():
        print(f"  {1e3 * seconds / len(datas):8.3f} ms  {name}")
    for name, flag in INTERP.items():
        equal = 0
        times = [0.0, 0.0]
        for i, bgr in enumerate(bgrs):
            variants = [lambda: cv2.cvtColor(cv2.resize(bgr, (224, 224), interpolation=flag), cv2.COLOR_BGR2RGB),
                        lambda: cv2.resize(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), (224, 224), interpolation=flag)]
            outs = [None, None]
            for j in ((0, 1) if i % 2 else (1, 0)):
                outs[j], seconds = _best(variants[j])
                times[j] += seconds
            equal += int(np.array_equal(outs[0], outs[1]))
        print(f"  {name:8s} cvtColor(resize(bgr)) == resize(cvtColor(bgr)): {equal}/{len(bgrs)};"
              f" ms/image resize→cvt {1e3 * times[0] / len(bgrs):.3f}, cvt→resize {1e3 * times[1] / len(bgrs):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imagenet", default="benchmarks/corpus/10000")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--photos", default="benchmarks/corpus/photos-300")
    parser.add_argument("--n_photos", type=int, default=30)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    probe()
    colour_order(pathlib.Path(args.imagenet), args.n)
    if pathlib.Path(args.photos).exists():
        colour_order(pathlib.Path(args.photos), args.n_photos)


if __name__ == "__main__":
    main()
