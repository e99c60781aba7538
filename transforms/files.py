"""File access for the per-image work: plain OS calls for local paths, Beam's FileSystems for URLs.

Worker processes that convert images import this module, not Beam: importing Beam costs a
process about 1.3 s, so a local pool of converters starts in a fraction of that. Paths with a
scheme (gs://, s3://, ...) load Beam's FileSystems on first use.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import uuid
from typing import BinaryIO, Iterable, Optional

from transforms.rejections import EmptyFile, FileTooLarge, UnreadableFile


def local_path(path: str) -> Optional[str]:
    """The OS path of a local file (plain path or file://), None for other filesystems."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


def beam_path(path: str) -> str:
    """`file:///x` as `/x`: Beam's filesystems take plain local paths but no file:// URL (which
    TensorFlow's gfile takes), so a user's file:// input or output is named the way Beam knows."""
    local = local_path(path)
    return local if local is not None else path


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


_WILDCARDS = re.compile(r"([\[*?])")


def as_pattern(path: str) -> str:
    """A path as a Beam match pattern that matches only itself: Beam reads `[`, `*` and `?` in
    any path it matches or deletes as wildcards, so an output `ds?` would also mean `ds1`."""
    return _WILDCARDS.sub(r"[\1]", path)


def delete(paths: Iterable[str]) -> None:
    """Removes files, and folders with what they hold, each path taken literally (a symlink
    itself, not what it points to)."""
    remote = []
    for path in paths:
        local = local_path(path)
        if local is None:
            remote.append(as_pattern(path))
        elif os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local)
        else:
            os.remove(local)
    if remote:
        _filesystems().delete(remote)


def list_names(folder: str) -> list[str]:
    """Names directly inside `folder` (files and subfolders), on any filesystem."""
    local = local_path(folder)
    if local is not None:
        return sorted(os.listdir(local)) if os.path.isdir(local) else []
    matched = _filesystems().match([f"{as_pattern(folder.rstrip('/'))}/**"])[0].metadata_list
    prefix = folder.rstrip("/") + "/"
    return sorted({m.path[len(prefix):].split("/", 1)[0] for m in matched if m.path.startswith(prefix)})


def open_read(path: str) -> BinaryIO:
    local = local_path(path)
    if local is not None:
        return _open_regular(local)
    return _filesystems().open(path, compression_type="uncompressed")


class NotARegularFile(OSError):
    def __init__(self, path: str, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", path)
        self.kind = kind


def _open_regular(path: str) -> BinaryIO:
    """A local regular file, for reading; anything else is an OSError. Opened without blocking
    and checked on the open descriptor: a FIFO (an input, or in place of an index or a
    metadata.json) would block the open, and the run holding the output's lock, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(path, file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def create(path: str, gzip: bool = False) -> BinaryIO:
    """A new file (parent folders created); gzip-compressed if asked."""
    local = local_path(path)
    if local is not None and not gzip:
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        return open(local, "wb")
    from apache_beam.io.filesystem import CompressionTypes

    compression = CompressionTypes.GZIP if gzip else CompressionTypes.UNCOMPRESSED
    return _filesystems().create(path, compression_type=compression)


def is_folder(path: str) -> bool:
    """A local folder (not a symlink to one); object stores have no folders to be in the way."""
    local = local_path(path)
    return local is not None and os.path.isdir(local) and not os.path.islink(local)


def exists(path: str) -> bool:
    local = local_path(path)
    return os.path.exists(local) if local is not None else _filesystems().exists(path)


def size(path: str) -> int:
    local = local_path(path)
    if local is not None:
        return os.path.getsize(local)
    return _filesystems().match([path])[0].metadata_list[0].size_in_bytes


def rename(source: str, destination: str) -> None:
    local_source, local_destination = local_path(source), local_path(destination)
    if local_source is not None and local_destination is not None:
        os.replace(local_source, local_destination)
    else:
        _filesystems().rename([source], [destination])


def link(source: str, destination: str) -> bool:
    """Hard-links a local file, parent folders created (True), or does nothing (False: not local,
    or links unsupported there)."""
    local_source, local_destination = local_path(source), local_path(destination)
    if local_source is None or local_destination is None:
        return False
    try:
        os.makedirs(os.path.dirname(local_destination) or ".", exist_ok=True)
        os.link(local_source, local_destination)
    except OSError:
        return False
    return True


def append_file(destination: BinaryIO, source: str, chunk: int = 8 * 2**20) -> None:
    """Copies `source` to the end of the open `destination`: in the kernel (copy_file_range)
    between local files, through Python otherwise (e.g. into a gzip stream)."""
    local = local_path(source)
    if local is not None and hasattr(os, "copy_file_range") and hasattr(destination, "fileno") \
            and type(destination).__name__ == "BufferedWriter":
        destination.flush()
        with open(local, "rb") as handle:
            remaining = os.fstat(handle.fileno()).st_size
            while remaining:
                copied = os.copy_file_range(handle.fileno(), destination.fileno(), remaining)
                if not copied:
                    raise OSError(f"copy_file_range stopped with {remaining} bytes of {source} left")
                remaining -= copied
        return
    with open_read(source) as handle:
        while data := handle.read(chunk):
            destination.write(data)


def read_bytes(path: str) -> bytes:
    with open_read(path) as handle:
        return handle.read()


def write_atomically(path: str, data: bytes) -> None:
    """Via a temporary name and a rename, so a reader sees the whole file or none of it; a
    failed write (a full disk) leaves no half-written temporary behind."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with create(temporary) as handle:
            handle.write(data)
        rename(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _remove_quietly(path: str) -> None:
    """Best effort: the error that brought us here is the one to report."""
    local = local_path(path)
    try:
        if local is not None:
            os.remove(local)
        elif _filesystems().exists(path):
            delete([path])
    except Exception:  # pylint: disable=broad-except
        pass


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _read_local(path: str, max_bytes: int) -> bytes:
    """Regular files only: a FIFO would block forever and /dev/zero never ends."""
    try:
        with _open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise FileTooLarge(f"{path} has {size} bytes, more than max_file_bytes={max_bytes}")
            # The stat'ed size, not max_bytes: read(n) allocates n bytes up front. One byte more
            # shows a file that grew past the limit since.
            return handle.read(size + 1)
    except NotARegularFile as exc:
        raise UnreadableFile(f"{path} is {exc.kind}, not a regular file") from None
    except OSError as exc:
        raise UnreadableFile(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_capped(path: str, max_bytes: int, chunk: int = 8 * 2**20) -> bytes:
    """At most max_bytes + 1 bytes, in chunks, so a huge object is never buffered whole."""
    pieces, size = [], 0
    with open_read(path) as handle:
        while size <= max_bytes and (piece := handle.read(chunk)):
            pieces.append(piece)
            size += len(piece)
    return b"".join(pieces)


def read_input(path: str, max_bytes: int) -> bytes:
    """All bytes of an input file, at most `max_bytes`; anything else is an InputRejected."""
    local = local_path(path)
    if local is not None:
        data = _read_local(local, max_bytes)
    else:
        try:
            data = _read_capped(path, max_bytes)
        except Exception as exc:  # each filesystem raises its own error types
            raise UnreadableFile(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if len(data) > max_bytes:
        raise FileTooLarge(f"{path} has more than max_file_bytes={max_bytes} bytes")
    if not data:
        raise EmptyFile(f"{path} is empty (0 bytes)")
    return data
