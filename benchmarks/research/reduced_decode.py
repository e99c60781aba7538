"""Reduced-size JPEG decoding (OpenCV IMREAD_REDUCED_COLOR_2/4/8) vs full decode, then the same
resize to 224x224: fidelity (PSNR, max abs diff) and time per image, per interpolation and
resize mode. One OpenCV thread (imgrec converts on its own threads).

    python -m benchmarks.research.reduced_decode [--photos benchmarks/corpus/photos-300 --n_photos 40]
                                                 [--imagenet benchmarks/corpus/10000 --n_imagenet 300]

PSNR is over all pixels of all sampled images together (10*log10(255^2 / MSE)); "min" is the
worst single image. The rule column picks, per image, the largest reduction whose decoded short
side is still >= 2x the target (224); 1 means full decode.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import cv2
import numpy as np

from transforms.images.resize import resize_image
from transforms.specs import ImageSpec

FLAGS = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
         8: cv2.IMREAD_REDUCED_COLOR_8}
INTERPOLATIONS = ("area", "linear", "cubic")
MODES = ("stretch", "center_crop")
TARGET = 224


def rule_scale(width: int, height: int, target: int = TARGET) -> int:
    """Largest of 8, 4, 2 keeping the decoded short side >= 2 * target; else 1."""
    for scale in (8, 4, 2):
        if math.ceil(min(width, height) / scale) >= 2 * target:
            return scale
    return 1


def sample(folder: pathlib.Path, n: int) -> list[bytes]:
    paths = sorted(folder.glob("*/*.jpg"))
    step = max(1, len(paths) // n)
    return [p.read_bytes() for p in paths[::step][:n]]


def timed(fn, repeat: int = 1):
    best = math.inf
    for _ in range(repeat):
        start = time.thread_time()  # CPU time of this thread: robust to other load on the machine
        out = fn()
        best = min(best, time.thread_time() - start)
    return out, best


def study(name: str, files: list[bytes], repeat: int) -> dict:
    specs = {(i, m): ImageSpec(interpolation=i, resize_mode=m, normalize="none") for i in INTERPOLATIONS for m in MODES}
    decode_ms = {s: [] for s in FLAGS}
    resize_ms = {(i, m, s): [] for (i, m) in specs for s in FLAGS}
    sq_err = {(i, m, s): [] for (i, m) in specs for s in FLAGS if s > 1}
    max_diff = {k: 0 for k in sq_err}
    rule = {(i, m): [] for (i, m) in specs}
    rule_scales = []
    for data in files:
        buf = np.frombuffer(data, np.uint8)
        decoded = {}
        for scale, flag in FLAGS.items():
            decoded[scale], seconds = timed(lambda buf=buf, flag=flag: cv2.imdecode(buf, flag), repeat)
            decode_ms[scale].append(1e3 * seconds)
        h, w = decoded[1].shape[:2]
        chosen = rule_scale(w, h)
        rule_scales.append(chosen)
        for (interp, mode), spec in specs.items():
            outs = {}
            for scale in FLAGS:
                outs[scale], seconds = timed(lambda image=decoded[scale], spec=spec: resize_image(image, spec), repeat)
                resize_ms[(interp, mode, scale)].append(1e3 * seconds)
            ref = outs[1].astype(np.int16)
            for scale in (2, 4, 8):
                diff = outs[scale].astype(np.int16) - ref
                sq_err[(interp, mode, scale)].append(float(np.mean(diff.astype(np.float64) ** 2)))
                max_diff[(interp, mode, scale)] = max(max_diff[(interp, mode, scale)], int(np.abs(diff).max()))
            rule[(interp, mode)].append(sq_err.get((interp, mode, chosen), [0.0])[-1] if chosen > 1 else 0.0)

    def psnr(mse: float) -> float:
        return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)

    rows = []
    for (interp, mode, scale), errors in sq_err.items():
        rows.append({"interpolation": interp, "mode": mode, "scale": scale,
                     "psnr_db": round(psnr(np.mean(errors)), 1), "psnr_min_db": round(min(psnr(e) for e in errors), 1),
                     "max_abs_diff": max_diff[(interp, mode, scale)],
                     "decode_ms": round(float(np.mean(decode_ms[scale])), 2),
                     "resize_ms": round(float(np.mean(resize_ms[(interp, mode, scale)])), 2),
                     "full_decode_ms": round(float(np.mean(decode_ms[1])), 2),
                     "full_resize_ms": round(float(np.mean(resize_ms[(interp, mode, 1)])), 2)})
    rule_rows = {f"{i}/{m}": round(psnr(np.mean(v)), 1) for (i, m), v in rule.items()}
    shape = cv2.imdecode(np.frombuffer(files[0], np.uint8), cv2.IMREAD_COLOR).shape
    return {"corpus": name, "images": len(files), "first_shape": list(shape),
            "rule_scales": {str(s): rule_scales.count(s) for s in sorted(set(rule_scales))},
            "rows": rows, "rule_psnr_db": rule_rows}


def print_study(result: dict) -> None:
    print(f"\n## {result['corpus']}: {result['images']} images (first {result['first_shape']}), "
          f"rule picks scale {result['rule_scales']}")
    print(f"{'interp':7s} {'mode':12s} {'scale':>5s} {'PSNR dB':>8s} {'min dB':>7s} {'maxdiff':>7s} "
          f"{'dec ms':>7s} {'rsz ms':>7s} {'total':>7s} | {'full dec':>8s} {'full rsz':>8s} {'total':>7s} "
          f"{'speedup':>7s}")
    for r in result["rows"]:
        total, full = r["decode_ms"] + r["resize_ms"], r["full_decode_ms"] + r["full_resize_ms"]
        print(f"{r['interpolation']:7s} {r['mode']:12s} {r['scale']:5d} {r['psnr_db']:8.1f} {r['psnr_min_db']:7.1f} "
              f"{r['max_abs_diff']:7d} {r['decode_ms']:7.2f} {r['resize_ms']:7.2f} {total:7.2f} | "
              f"{r['full_decode_ms']:8.2f} {r['full_resize_ms']:8.2f} {full:7.2f} {full / total:7.2f}")
    print("PSNR with the rule's scale per image (inf = rule never reduces):", result["rule_psnr_db"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", default="benchmarks/corpus/photos-300")
    parser.add_argument("--n_photos", type=int, default=40)
    parser.add_argument("--grain_photos", default="benchmarks/corpus/photos-48-grain3")
    parser.add_argument("--imagenet", default="benchmarks/corpus/10000")
    parser.add_argument("--n_imagenet", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2, help="timings: best of N per image")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cv2.setNumThreads(1)
    results = []
    for name, folder, n in (("photos 4000x3000", args.photos, args.n_photos),
                            ("photos 4000x3000 + grain 3", args.grain_photos, args.n_photos),
                            ("ImageNet-like", args.imagenet, args.n_imagenet)):
        if folder and pathlib.Path(folder).exists():
            result = study(name, sample(pathlib.Path(folder), n), args.repeat)
            print_study(result)
            results.append(result)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
