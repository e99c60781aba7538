"""Why an input did not become a record: exceptions raised by the pure steps, and the
dead-letter row written for each.

Every rejection names the stage and the reason, so a user can find the file and fix it; the
exception's class name is the error class counted in metrics and metadata.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Optional


class InputRejected(ValueError):
    """An input that cannot become a record; `stage` says which step refused it."""

    stage = "process"


class UnreadableFile(InputRejected):
    stage = "read"


class EmptyFile(InputRejected):
    stage = "read"


class FileTooLarge(InputRejected):
    """Larger than max_file_bytes: refused from its size, before its bytes are read."""

    stage = "read"


class NotAnImage(InputRejected):
    stage = "header"


class ImageTooLarge(InputRejected):
    stage = "header"


class ImageTooSmall(InputRejected):
    stage = "header"


class CorruptImage(InputRejected):
    stage = "decode"


class UnsupportedImage(InputRejected):
    """An image imgrec cannot convert faithfully: a grey TIFF with alpha (OpenCV drops it), a
    layout Pillow cannot describe (some TIFF sample layouts, 12-bit JPEG), 32-bit integer samples."""

    stage = "decode"


class BadManifestLine(InputRejected):
    stage = "discover"


class SkippedFile(InputRejected):
    """Not an input by design: no image extension (a README), hidden or macOS `._` files, files
    outside any class folder."""

    stage = "discover"


class ConflictingLabels(InputRejected):
    """A manifest lists the same path with different labels: which one is right is unknowable."""

    stage = "discover"


class AmbiguousLabel(InputRejected):
    """A class folder whose name is not UTF-8 reads as the same label as another folder's."""

    stage = "discover"


class DuplicateListing(InputRejected):
    """A manifest lists the same path with the same label again; the image is written once."""

    stage = "discover"


class FileChanged(InputRejected):
    """The file's bytes changed between hashing and processing (data still arriving)."""

    stage = "read"


class UnknownLabel(InputRejected):
    stage = "label"


class DuplicateImage(InputRejected):
    """Not an error in the data: a copy dropped on request (`drop_duplicates`)."""

    stage = "dedup"


@dataclasses.dataclass(frozen=True)
class Rejection:
    """One dead-letter row: which input, at which stage, and why."""

    path: str
    stage: str
    error: str
    message: str
    split: Optional[str] = None  # the split it was planned for: set when rejected while converting

    @classmethod
    def from_exception(cls, path: str, exc: Exception, split: Optional[str] = None) -> "Rejection":
        stage = exc.stage if isinstance(exc, InputRejected) else "process"
        return cls(path=path, stage=stage, error=type(exc).__name__, message=str(exc), split=split)

    @property
    def about_the_file_then(self) -> bool:
        """Read-stage rejections (unreadable, changed, grown) describe the file when it was read,
        not the bytes planned, so a later attempt may succeed; the others follow from the bytes."""
        return self.stage == "read"

    @property
    def counts_as_error(self) -> bool:
        return is_error_class(self.error)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# By name: NoAnnotations (an image without objects skipped on request) and BoxCroppedAway (an
# object a center crop cut off) are transforms/inputs/annotations.py's, which imports this module.
_NOT_ERRORS = frozenset({SkippedFile.__name__, DuplicateImage.__name__, DuplicateListing.__name__,
                         "NoAnnotations", "BoxCroppedAway"})


def is_error_class(error: str) -> bool:
    """Skipped non-images and dropped duplicates are intended, so they do not count against
    max_error_fraction."""
    return error not in _NOT_ERRORS
