"""The limits of a converter process (transforms/images/limits.py), one test per kind of bomb, where they
act: a part converted in a real converter process, the bomb among good images. Each bomb is a
dead letter with the converter's memory and time bounded, and the good images are written."""
from __future__ import annotations

import dataclasses
import pathlib
import time

import cv2
import numpy as np
import pytest

from tests.helpers import tile_bomb, write_photo, zero_png
from transforms.files import content_hash
from transforms.images import limits
from transforms.images.image_header import ImageHeader
from transforms.images.limits import DECODE_HEADROOM, Converter, image_seconds
from transforms.inputs.source import describe_source
from transforms.refs import Candidate, PlannedImage, SourceImage
from transforms.specs import FeatureKeys, ImageSpec, OutputSpec
from transforms.write.parts import PartTask, WriterSettings, convert_part_on, cut_into_parts, record_digest
from transforms.write.process_pool import SubprocessPool

pytestmark = [pytest.mark.converter, pytest.mark.timeout(120)]

MiB = 2**20
SPEC = ImageSpec(height=8, width=8, max_decoded_bytes=32 * MiB)


def settings_for(tmp_path: pathlib.Path, spec: ImageSpec) -> WriterSettings:
    return WriterSettings(image=spec, keys=FeatureKeys(), output=OutputSpec(str(tmp_path / "out")),
                          max_file_bytes=64 * MiB, run_dir=str(tmp_path / "run"), parts_dir=str(tmp_path / "parts"),
                          record_digest=record_digest(spec, FeatureKeys(), {}), part_images=8)


def part_of(tmp_path: pathlib.Path, bomb: bytes, spec: ImageSpec, header: ImageHeader = None) -> PartTask:
    """A part of a good image, the bomb (with the header the first pass read, or `header`: one
    that lies, as a header Pillow reads otherwise than the decoder), and another good image."""
    paths = [tmp_path / "in" / "good_1.jpg", tmp_path / "in" / "bomb", tmp_path / "in" / "good_2.png"]
    write_photo(paths[0], seed=1)
    paths[1].write_bytes(bomb)
    write_photo(paths[2], seed=2)
    sources = [describe_source(Candidate(str(p), "a"), p.read_bytes(), spec) if header is None or p.name != "bomb"
               else SourceImage(str(p), "a", content_hash(bomb), header) for p in paths]
    images = [PlannedImage(source, 0, "train") for source in sources]
    (task,) = cut_into_parts(("train", 0, 1), images, settings_for(tmp_path, spec))
    return task


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM), in bytes."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def set_seconds_floor(seconds: float) -> None:
    """limits' floor of CPU seconds per image, in the process this runs in."""
    limits._SECONDS_FLOOR = seconds


def converted(tmp_path: pathlib.Path, task: PartTask, spec: ImageSpec,
              seconds_floor: float | None = None) -> tuple[list[tuple[str, str, str]], int, float]:
    """The part's dead letters (name, error, message), how much the converter's peak memory grew
    while converting it, and how long it took; with `seconds_floor`, the converter's (and this
    process's, which words the message) floor of CPU seconds per image is that one."""
    converters = SubprocessPool(1, Converter.for_spec(spec))
    try:
        converters.submit(write_photo, tmp_path / "warm.jpg", 3).result()  # imports done: the baseline
        if seconds_floor is not None:
            converters.submit(set_seconds_floor, seconds_floor).result()
        before = converters.submit(peak_rss).result()
        started = time.monotonic()
        outcome = convert_part_on(converters, task, settings_for(tmp_path, spec))
        took = time.monotonic() - started
        grew = converters.submit(peak_rss).result() - before
    finally:
        converters.shutdown(wait=True)
    assert outcome.records == 2, outcome
    return [(pathlib.Path(r.path).name, r.error, r.message) for r in outcome.rejections], grew, took


def test_a_tile_bomb_is_a_dead_letter_within_the_decode_memory_limit(tmp_path):
    """Its header passes every check; the decode's memory limit stops it."""
    task = part_of(tmp_path, tile_bomb(), SPEC)
    assert task.images[1].source.header.width == 16
    (rejection,), grew, _ = converted(tmp_path, task, SPEC)
    assert rejection[:2] == ("bomb", "CorruptImage") and "ran out of memory" in rejection[2], rejection
    assert grew <= SPEC.max_decoded_bytes + DECODE_HEADROOM, grew


def png_bomb(side: int) -> bytes:
    """A real all-black RGB PNG of side x side pixels: 0.4 MB for 12000, 432 MB decoded."""
    return zero_png(side, side)


@pytest.mark.parametrize("limit", ["max_pixels", "max_decoded_bytes"])
def test_an_image_larger_than_its_header_said_is_refused_by_the_decoders_own_limits(tmp_path, limit):
    """A 12000x12000 PNG whose header the first pass read as 10x10: OpenCV's pixel limit, or
    else the decode's memory limit, refuses it before its 432 MB are allocated."""
    spec = dataclasses.replace(SPEC, max_pixels=10**6 if limit == "max_pixels" else 10**9)
    task = part_of(tmp_path, png_bomb(12_000), spec, header=ImageHeader("png", 10, 10))
    (rejection,), grew, _ = converted(tmp_path, task, spec)
    assert rejection[:2] == ("bomb", "ImageTooLarge"), rejection
    assert ("validateInputImageSize" if limit == "max_pixels" else "needs more memory") in rejection[2], rejection
    assert grew <= SPEC.max_decoded_bytes + DECODE_HEADROOM, grew


def scan_bomb() -> bytes:
    """A flat 1000x1000 progressive JPEG whose last scan is repeated 40,000 times (0.6 MB): libjpeg
    decodes each one over the whole image, half a minute in all."""
    ok, buffer = cv2.imencode(".jpg", np.full((1000, 1000, 3), 128, np.uint8), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    data = buffer.tobytes()
    last_scan = data[data.rindex(b"\xff\xda"):-2]
    return data[:-2] + last_scan * 40_000 + data[-2:]


@pytest.mark.slow
def test_a_scan_bomb_is_a_dead_letter_once_it_has_taken_its_cpu_time(tmp_path, monkeypatch):
    """The kernel ends the converter at the limit; the part is converted again without the bomb
    by the process that takes its place. The limit's floor is 1 s here, not 10 (the bomb takes
    half a minute either way): the same timer and message, 9 s of CPU less."""
    task = part_of(tmp_path, scan_bomb(), SPEC)
    monkeypatch.setattr(limits, "_SECONDS_FLOOR", 1.0)
    seconds = image_seconds(1000 * 1000)
    assert seconds < 2
    (rejection,), _, took = converted(tmp_path, task, SPEC, seconds_floor=1.0)
    assert rejection[:2] == ("bomb", "CorruptImage"), rejection
    assert f"took more than {seconds:.0f} s of CPU time" in rejection[2], rejection
    assert took < seconds + 30, took  # the limit (CPU time: longer on a loaded machine), a new process, the part
