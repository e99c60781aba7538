"""What one image may cost the converter process that converts it, whatever its header says.

The header's checks (transforms/images/image_header.py) refuse images that declare too many pixels or
bytes. These limits bound the rest: headers that lie, or that Pillow reads otherwise than the
decoder, and costs no header tells (a tiled TIFF's tile, an animation's frames, the scans of a
progressive JPEG):

- pixels: OpenCV refuses an image of more than `max_pixels` before allocating it
  (validateInputImageSize). It reads OPENCV_IO_MAX_IMAGE_PIXELS once, as it loads: `Converter`
  sets it before anything in the process imports OpenCV, and a pool serves only runs of its `Converter`.
- memory: while an image decodes, RLIMIT_DATA allows the process what it holds then, plus
  `max_decoded_bytes`, plus DECODE_HEADROOM. A decoder that needs more fails its allocation:
  OpenCV raises (-4: Insufficient memory), libpng, libtiff and libjpeg give up.
- time: converting one image may take `image_seconds` of CPU time; then the kernel ends the
  process (SIGPROF) and the part is converted again without that image, which becomes a dead
  letter (transforms/write/parts.py). libjpeg decodes every scan of a progressive JPEG over the whole
  image, warning of nothing: 900 repeated scans (0.5 MB) took an 8000x8000 decode 35 s.

Only converter processes (transforms/write/process_pool.py, with `Converter` as their initializer)
have limits: a test or tool that decodes in its own process has none.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import signal
import sys
from typing import Iterator, Optional

from transforms import files
from transforms.specs import ImageSpec
from transforms.write.process_pool import note

# Beyond max_decoded_bytes, what a decode may allocate: the decoders' own tables and row buffers,
# and the allocator's slack (measured: a 16-bit RGBA PNG at its max_decoded_bytes estimate).
DECODE_HEADROOM = 64 * 2**20
_SECONDS_FLOOR, _PIXELS_PER_SECOND = 10.0, 5e6  # a 100-megapixel progressive JPEG decodes in ~2 s
# What every image is converted under, for the input fingerprint (transforms/images/decode.py DAMAGE_CHECKS).
LIMITS = (f"every image: max_pixels in OpenCV, max_decoded_bytes + {DECODE_HEADROOM // 2**20} MiB while it decodes, "
          f"{_SECONDS_FLOOR:g} s + 1 s per {_PIXELS_PER_SECOND / 1e6:g} Mpx of CPU time")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_active: Optional["Converter"] = None  # this process's limits, once it is a converter process
_statm: Optional[int] = None  # /proc/self/statm, where the system has one
_unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)  # RLIMIT_DATA outside a decode
_PAGE = os.sysconf("SC_PAGE_SIZE")


def image_seconds(pixels: int) -> float:
    """CPU seconds one image of this many pixels may take to convert, ten times what the
    largest decode measured needs."""
    return _SECONDS_FLOOR + pixels / _PIXELS_PER_SECOND


@dataclasses.dataclass(frozen=True)
class Converter:
    """A converter process's setup: runs once in it, before it imports OpenCV. Equal for equal
    limits, so the steps of one run share one pool of processes."""

    max_pixels: int
    max_decoded_bytes: int
    filesystems: files.FilesystemOptions = files.FilesystemOptions()  # the run's, for remote paths

    @classmethod
    def for_spec(cls, spec: ImageSpec, filesystems: Optional[files.FilesystemOptions] = None) -> "Converter":
        return cls(spec.max_pixels, spec.max_decoded_bytes, filesystems or files.FilesystemOptions())

    def __call__(self) -> None:
        """Parts are converted in parallel already, so OpenCV's own threads would only
        oversubscribe the cores (about 10% more CPU per image for the same pixels). And glibc
        hands every decode buffer larger than 32 MiB (a 12-megapixel photo) back to the kernel
        when it is freed, which then faults the next one in page by page, about a third of such
        a photo's CPU time: keeping freed buffers up to 256 MiB for reuse costs a few of them
        in memory per process."""
        global _active, _statm, _unlimited
        if "cv2" in sys.modules:
            raise RuntimeError("OpenCV was loaded before its pixel limit was set")
        os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"] = str(self.max_pixels)
        import cv2

        cv2.setNumThreads(1)
        _unlimited = resource.getrlimit(resource.RLIMIT_DATA)
        if os.path.exists("/proc/self/statm"):
            _statm = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None)
            if hasattr(libc, "mallopt"):
                libc.mallopt(_M_MMAP_THRESHOLD, 256 * 2**20)
                libc.mallopt(_M_TRIM_THRESHOLD, 512 * 2**20)
        self.filesystems.use()
        _active = self


@contextlib.contextmanager
def image_time(position: int, pixels: int) -> Iterator[None]:
    """Converting the image at `position` of its part may take `image_seconds(pixels)` of CPU
    time before the kernel ends this process; the position is noted for the parent to find."""
    if _active is None:
        yield
        return
    note(position)
    signal.setitimer(signal.ITIMER_PROF, image_seconds(pixels))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


@contextlib.contextmanager
def decode_memory() -> Iterator[None]:
    """While the block runs, allocations beyond what this process holds now plus
    `max_decoded_bytes` plus DECODE_HEADROOM fail."""
    if _active is None or _statm is None:
        yield
        return
    held = int(os.pread(_statm, 256, 0).split()[5]) * _PAGE  # the data field: what RLIMIT_DATA counts
    soft, hard = _unlimited
    limit = held + _active.max_decoded_bytes + DECODE_HEADROOM
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
