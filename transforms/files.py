"""File access for the per-image work: plain OS calls for local paths, Beam's FileSystems for URLs.

Worker processes that convert images import this module, not Beam: importing Beam costs a
process about 1.3 s, so a local pool of converters starts in a fraction of that. Paths with a
scheme (gs://, s3://, ...) load Beam's FileSystems on first use, configured with the run's
filesystem options (`use_filesystem_options`): endpoint, credentials, project.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import uuid
from typing import Any, BinaryIO, Iterable, Mapping, Optional

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


_options: Optional[dict[str, Any]] = None  # this process's filesystem options, once given
_options_applied = False


def use_filesystem_options(values: Mapping[str, Any]) -> None:
    """The options of the object stores' clients (Beam's S3Options, AwsOptions,
    GoogleCloudOptions... by option name) for every remote path this process opens: Beam's
    FileSystems get them (now, if Beam is loaded here already, else on first use) and so do
    imgrec's own store requests (transforms/object_stores.py)."""
    global _options, _options_applied
    _options, _options_applied = dict(values), False
    if "apache_beam.io.filesystems" in sys.modules:
        _filesystems()


def filesystem_options():
    """This process's filesystem options as Beam's PipelineOptions (none given: Beam's defaults)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(flags=[], **(_options or {}))


def filesystem_options_key() -> str:
    """This process's filesystem options as text: what a store client made with them is kept by."""
    return FilesystemOptions.of(_options or {}).values


@dataclasses.dataclass(frozen=True)
class FilesystemOptions:
    """The run's filesystem options, travelling with the work (as JSON, so the value is
    hashable) to processes Beam does not configure: imgrec's converter processes."""

    values: str = "{}"

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "FilesystemOptions":
        return cls(json.dumps(dict(values), sort_keys=True, default=str))

    def use(self) -> None:
        use_filesystem_options(json.loads(self.values))


def below(path: str, root: str) -> str:
    """`path` named from `root` (`/in/cat/x.jpg` below `/in` is `cat/x.jpg`): how records name
    their image, and what shard assignment and path splits hash, so a dataset's bytes do not
    depend on where its input lies. A path outside `root`, or no root, stays as it is."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if root and path.startswith(prefix) else path


def absolute(path: str) -> str:
    """A local path made absolute, without `.` segments, repeated or trailing slashes; `..` is
    kept (after a symlink it does not mean the folder above as text does). URLs are unchanged."""
    if local_path(path) is None:
        return path
    parts = [part for part in os.path.join(os.getcwd(), path).split(os.sep) if part not in ("", ".")]
    return os.sep + os.sep.join(parts)


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    global _options_applied
    if _options is not None and not _options_applied:
        FileSystems.set_options(filesystem_options())
        _options_applied = True
    return FileSystems


def _object_stores():
    from transforms import object_stores

    return object_stores


def own_client(path: str) -> bool:
    """S3 and GCS through imgrec's own clients (transforms/object_stores.py: a kept S3 client, GCS
    requests that give up on a store they cannot reach) where this process was given the
    filesystem options; in a Beam worker that was not, through Beam's FileSystems, which Beam
    configured."""
    return path.startswith(("s3://", "gs://")) and _options is not None


def as_pattern(path: str) -> str:
    """A path as a Beam match pattern that matches only itself: Beam reads `[`, `*` and `?` in
    any path it matches or deletes as wildcards, so an output `ds?` would also mean `ds1`
    (glob.escape brackets each; on POSIX it has no drive to leave out)."""
    return glob.escape(path)


def delete(paths: Iterable[str]) -> None:
    """Removes files, and folders with what they hold, each path taken literally (a symlink
    itself, not what it points to)."""
    remote = []
    for path in paths:
        local = local_path(path)
        if local is None:
            remote.append(path)
        elif is_folder(path):
            shutil.rmtree(local)
        else:
            os.remove(local)
    if remote:
        _object_stores().delete(remote)


def list_names(folder: str) -> list[str]:
    """Names directly inside `folder` (files and subfolders), on any filesystem."""
    local = local_path(folder)
    if local is not None:
        return sorted(os.listdir(local)) if os.path.isdir(local) else []
    prefix = folder.rstrip("/") + "/"
    return sorted({path[len(prefix):].split("/", 1)[0] for path in _object_stores().objects_under(folder)
                   if path.startswith(prefix)})


def open_read(path: str) -> BinaryIO:
    """`open_regular`, except that S3 and GCS are read through imgrec's own clients where this
    process has them (`own_client`)."""
    if own_client(path):  # never a local path
        return _object_stores().open_object(path, "rb")
    return open_regular(path)


def open_regular(path: str) -> BinaryIO:
    """A file to read through Beam's FileSystems, for callers that handle Beam's errors; a local
    one must be a regular file (an OSError otherwise: a FIFO would block the open)."""
    local = local_path(path)
    return _open_regular(local) if local is not None else _filesystems().open(path, compression_type="uncompressed")


class NotARegularFile(OSError):
    """strerror: `a FIFO, not a regular file` and the like."""


def _open_regular(path: str) -> BinaryIO:
    """A local regular file, for reading; anything else is an OSError. Opened without blocking
    and checked on the open descriptor: a FIFO (an input, or in place of an index or a
    metadata.json) would block the open, and the run holding the output's lock, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(errno.EINVAL, f"{file_kind(mode)}, not a regular file", path)
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
    if not gzip:
        return _ObjectWriter(path)
    return _filesystems().create(path, compression_type="gzip")


class _ObjectWriter(io.BufferedIOBase):
    """Beam's writer of an object, opened at the first byte written: an object closed without
    any is written whole where Beam's writer cannot make an empty one (S3, whose uploads in
    parts need at least one part)."""

    def __init__(self, path: str):
        super().__init__()
        self._path = path
        self._handle: Optional[BinaryIO] = None

    def writable(self) -> bool:
        return True

    def _create(self) -> BinaryIO:
        if own_client(self._path):
            return _object_stores().open_object(self._path, "wb")
        return _filesystems().create(self._path, compression_type="uncompressed")

    def write(self, data) -> int:
        if self._handle is None:
            if not len(data):
                return 0
            self._handle = self._create()
        return self._handle.write(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._handle is not None:
                self._handle.close()
            elif not _object_stores().put_empty(self._path):
                self._create().close()
        finally:
            super().close()


def is_folder(path: str) -> bool:
    """A local folder (not a symlink to one); object stores have no folders to be in the way."""
    local = local_path(path)
    return local is not None and os.path.isdir(local) and not os.path.islink(local)


def exists(path: str) -> bool:
    local = local_path(path)
    if local is not None:
        return os.path.exists(local)
    return _object_stores().exists(path) if own_client(path) else _filesystems().exists(path)


def present(path: str) -> bool:
    """A file or folder; on an object store, which has no folders, an object of that name or
    any object under it."""
    local = local_path(path)
    if local is not None:
        return os.path.lexists(local)
    return exists(path) or bool(_object_stores().objects_under(path, limit=1))


def size(path: str) -> int:
    local = local_path(path)
    if local is not None:
        return os.path.getsize(local)
    if own_client(path):
        return _object_stores().size(path)
    return _filesystems().match([path])[0].metadata_list[0].size_in_bytes


def rename(source: str, destination: str) -> None:
    rename_all([source], [destination])


def rename_all(sources: list[str], destinations: list[str]) -> None:
    """Renames files, or objects (a copy and a delete each: object_stores.rename)."""
    if not sources:
        return
    if local_path(sources[0]) is not None and local_path(destinations[0]) is not None:
        for source, destination in zip(sources, destinations):
            os.replace(local_path(source), local_path(destination))
    else:
        _object_stores().rename(sources, destinations)


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
        shutil.copyfileobj(handle, destination, chunk)


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
        with contextlib.suppress(Exception):  # best effort: the error that brought us here is the one to report
            delete([temporary])
        raise


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
        raise UnreadableFile(f"{path} is {exc.strerror}") from None
    except OSError as exc:
        raise UnreadableFile(f"cannot read {path}: {exc.strerror or exc}") from None


def read_input(path: str, max_bytes: int) -> bytes:
    """All bytes of an input file, at most `max_bytes`; anything else is an InputRejected."""
    local = local_path(path)
    if local is not None:
        data = _read_local(local, max_bytes)
    else:
        pieces, size = [], 0
        try:  # at most max_bytes + 1 bytes, in chunks, so a huge object is never buffered whole
            with open_read(path) as handle:
                while size <= max_bytes and (piece := handle.read(8 * 2**20)):
                    pieces.append(piece)
                    size += len(piece)
            data = b"".join(pieces)
        except Exception as exc:  # each filesystem raises its own error types
            fault = _object_stores().store_fault(exc)
            if fault:  # the store, not this object: a setup fault fails the run
                raise _object_stores().StoreUnavailable(f"cannot read {path}: {fault}") from None
            raise UnreadableFile(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if len(data) > max_bytes:
        raise FileTooLarge(f"{path} has more than max_file_bytes={max_bytes} bytes")
    if not data:
        raise EmptyFile(f"{path} is empty (0 bytes)")
    return data
