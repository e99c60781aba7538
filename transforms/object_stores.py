"""What imgrec asks of S3 and GCS that Beam's FileSystems API does not offer, through the stores'
own client libraries (boto3, google-cloud-storage), built by Beam's public helpers from the same
filesystem options Beam's filesystems use (transforms/files.py `filesystem_options`):

- `create_exclusive`: create an object only if no object has that name, atomically (S3's
  conditional write `If-None-Match: *`, GCS's precondition `ifGenerationMatch=0`); the output
  lock (pipeline/output/lock.py) is taken this way;
- `put_empty`: a zero-byte object on S3, which Beam's S3 writer cannot make (it always uploads
  in parts, and S3 refuses to complete an upload of no parts: MalformedXML);
- `delete_each`: single-object deletes on a GCS emulator (`STORAGE_EMULATOR_HOST`), which does
  not take the batch requests Beam's GCS filesystem deletes and renames with;
- `s3io`: Beam's S3IO on a client kept per thread: Beam's S3 filesystem makes a new boto3 client
  (~0.15 s of CPU) for every call, which made reading and writing each image cost more than
  converting it;
- `open_object`, `exists`, `size` and the listings, copies and deletes on GCS: through
  imgrec's GCS client, whose requests give up on a store they cannot reach after GCS_SECONDS
  (Beam's GCS filesystem keeps google-cloud-storage's default of 2 minutes a request: a run whose
  store went away held its lock for 7-9 minutes), a store fault raised as a `StoreUnavailable`;
- `store_fault`: whether an error says the store itself cannot be used (unreachable, credentials
  refused, no such bucket), as opposed to one object being unreadable.

Imported lazily (for paths with a scheme, and to list a VOC folder's annotations), so converter
processes of a local run never load it.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import threading
import time
from typing import Any, Iterable, Optional

from apache_beam.io.filesystems import FileSystems  # loaded with any Beam module (apache_beam/__init__.py)
from apache_beam.utils.retry import PermanentException

from transforms import files

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # google-cloud-storage's own switch to a GCS emulator
# HTTP statuses and S3 error codes that say the store, not one object, is the problem.
_REFUSED_STATUSES = (401, 403)
# How long imgrec's GCS requests retry a store they cannot reach (refused, unresolvable, reset):
# google-cloud-storage's default retry tries each request for 2 minutes (Beam's GCS filesystem
# keeps that default, and a run whose store went away makes several requests in a row, its lock
# held meanwhile). Throttling and server errors keep google's 2 minutes.
GCS_SECONDS = 10.0
# Faults further apart than this are separate outages (tries of one request are GCS_SECONDS apart
# at most, plus the request's own wait).
_GCS_OUTAGE_GAP = 90.0
_STORE_ERROR_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket",
                      "InvalidBucketName", "ExpiredToken", "InvalidToken", "AllAccessDisabled", "AccountProblem"}


class StoreUnavailable(RuntimeError, PermanentException):
    """The object store cannot be used as configured: a setup fault, which fails the run, never
    a dead letter for the object that happened to be read first, and which Beam's retries give
    up on at once."""


def scheme(path: str) -> Optional[str]:
    return path.split("://", 1)[0] if "://" in path else None


def _bucket_and_key(path: str) -> tuple[str, str]:
    bucket, _, key = path.split("://", 1)[1].partition("/")
    return bucket, key


_per_thread = threading.local()


def s3io():
    """Beam's S3IO with this thread's client for the current filesystem options (a client holds
    one download stream, so threads must not share it)."""
    from apache_beam.io.aws.clients.s3.boto3_client import Client
    from apache_beam.io.aws.s3io import S3IO

    clients = _per_thread.__dict__.setdefault("s3", {})
    key = files.filesystem_options_key()
    if key not in clients:
        clients[key] = S3IO(client=_fail_fast(Client)(files.filesystem_options()))
    return clients[key]


# The calls of Beam's S3 client that S3IO makes, each wrapped by Beam in a retry with exponential
# backoff (7 tries, 5 s doubling: ~10 minutes per object for an endpoint that went away).
_S3_CALLS = ("get_object_metadata", "get_stream", "get_range", "list", "create_multipart_upload", "upload_part",
             "complete_multipart_upload", "delete", "delete_batch", "copy")


def _failing_fast(call):
    """`call`, except that an error saying the store itself cannot be used (`store_fault`:
    unreachable after the client's own retries, credentials refused, no such bucket) is raised
    as a `StoreUnavailable`."""
    @functools.wraps(call)
    def failing_fast(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except StoreUnavailable:
            raise
        except Exception as exc:
            fault = store_fault(exc)
            if fault:
                raise StoreUnavailable(fault) from exc
            raise
    return failing_fast


@functools.cache
def _fail_fast(client_class: type, calls: tuple[str, ...] = _S3_CALLS) -> type:
    """Beam's S3 client (or google-cloud-storage's reader or writer of an object), except that
    its `calls` raise a store fault as a `StoreUnavailable` (`_failing_fast`): retrying it for
    every object would keep a run whose store went away, and the lock it holds, for hours. A call
    Beam's client retries itself (get_range) is taken without that retry (`inspect.unwrap`), which
    would otherwise retry the fault, wrapped in an error without a status, for ~10 minutes."""
    wrapped = {name: _failing_fast(inspect.unwrap(getattr(client_class, name))) for name in calls}
    return type(f"FailFast{client_class.__name__}", (client_class,), wrapped)


def _s3_client():
    """The boto3 client under this thread's S3IO."""
    return s3io().client.client


_gcs_clients: dict[str, Any] = {}  # by the options they were made with (the client is thread-safe)


def _gcs_bucket(name: str):
    from apache_beam.io.gcp.gcsio import create_storage_client

    key = files.filesystem_options_key()
    if key not in _gcs_clients:
        _gcs_clients[key] = create_storage_client(files.filesystem_options())
    return _gcs_clients[key].bucket(name)


class _GcsRetryPredicate:
    """google-cloud-storage's default retry predicate, except that store faults (`store_fault`: a
    store that cannot be reached) are retried for only GCS_SECONDS in a row: throttling (429) and
    server errors keep google's 2 minutes, which a large run reading many objects rides out."""

    def __init__(self, retried):
        self._retried = retried
        self._first = self._last = 0.0

    def __call__(self, exc: Exception) -> bool:
        if not self._retried(exc):
            return False
        if store_fault(exc) is None:
            return True
        now = time.monotonic()
        if now - self._last > _GCS_OUTAGE_GAP:  # a new outage (a reader's or writer's later request)
            self._first = now
        self._last = now
        return now - self._first < GCS_SECONDS


def _gcs_request() -> dict[str, Any]:
    """The retry of each of imgrec's GCS requests (a predicate object of its own: its state is
    the request's, or one reader's or writer's)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    # at most GCS_SECONDS between tries (google's 60 s would let a streak of faults run on for a minute)
    retry = DEFAULT_RETRY.with_predicate(_GcsRetryPredicate(DEFAULT_RETRY._predicate)).with_delay(maximum=GCS_SECONDS)
    return {"retry": retry}


def _gcs_probe_request() -> dict[str, Any]:
    """The check before a run: any error within GCS_SECONDS, so a wrong setting is told at once."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return {"retry": DEFAULT_RETRY.with_timeout(GCS_SECONDS), "timeout": GCS_SECONDS}


def _gcs_blob(path: str):
    bucket, key = _bucket_and_key(path)
    return _gcs_bucket(bucket).blob(key)


# The calls of google-cloud-storage's reader and writer of an object that make requests.
_GCS_READS = ("read", "read1", "seek")
_GCS_WRITES = ("write", "flush", "close")


def open_object(path: str, mode: str):
    """An object to read ("rb") or write ("wb") through imgrec's clients: on S3 this thread's
    S3IO; on GCS as Beam's GCS filesystem opens it (raw bytes, the same buffer sizes), with
    imgrec's retry (`_gcs_request`) and a store fault raised as a StoreUnavailable."""
    if scheme(path) == "s3":
        return s3io().open(path, mode)
    from apache_beam.io.gcp.gcsio import DEFAULT_READ_BUFFER_SIZE, DEFAULT_WRITE_BUFFER_SIZE
    from google.cloud.storage.fileio import BlobReader, BlobWriter

    if mode == "rb":
        return _fail_fast(BlobReader, _GCS_READS)(_gcs_blob(path), chunk_size=DEFAULT_READ_BUFFER_SIZE,
                                                  raw_download=True, **_gcs_request())
    return _fail_fast(BlobWriter, _GCS_WRITES)(_gcs_blob(path), chunk_size=DEFAULT_WRITE_BUFFER_SIZE,
                                               ignore_flush=True, content_type="application/octet-stream",
                                               **_gcs_request())


@_failing_fast
def exists(path: str) -> bool:
    if scheme(path) == "s3":
        return s3io().exists(path)
    return _gcs_blob(path).exists(**_gcs_request())


@_failing_fast
def size(path: str) -> int:
    if scheme(path) == "s3":
        return s3io().size(path)
    blob = _gcs_blob(path)
    blob.reload(**_gcs_request())
    return blob.size


@_failing_fast
def create_exclusive(path: str, data: bytes) -> Optional[bool]:
    """Writes `data` to `path` only if no object is there, in one atomic request: True if this
    call created it, False if an object was there; None on stores without such a request
    (the caller then falls back to writing and reading back)."""
    bucket, key = _bucket_and_key(path)
    if scheme(path) == "s3":
        from botocore.exceptions import ClientError

        try:
            _s3_client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True
    if scheme(path) == "gs":
        from google.api_core.exceptions import PreconditionFailed

        try:
            _gcs_bucket(bucket).blob(key).upload_from_string(data, if_generation_match=0, **_gcs_request())
        except PreconditionFailed:
            return False
        return True
    return None


def put_empty(path: str) -> bool:
    """Writes a zero-byte object at `path` where Beam's writer cannot (S3): True if done here."""
    if scheme(path) != "s3":
        return False
    bucket, key = _bucket_and_key(path)
    _s3_client().put_object(Bucket=bucket, Key=key, Body=b"")
    return True


def _deletes_one_at_a_time(path: str) -> bool:
    """A GCS emulator takes no batch requests (fake-gcs-server's issue #2019); on real GCS,
    Beam's batched deletes (100 objects a request) are kept."""
    return scheme(path) == "gs" and bool(os.environ.get(EMULATOR_ENV))


def objects_under(folder: str, limit: Optional[int] = None) -> list[str]:
    """Every object whose name starts with `folder/`, or the first `limit` of them (listing
    stops there: whether a prefix holds anything takes one request, not a listing of all)."""
    return objects_named_from(folder.rstrip("/") + "/", limit)


def objects_named_from(prefix: str, limit: Optional[int] = None) -> list[str]:
    """Every object whose name starts with the text `prefix` (`s3://b/in/cat_` lists `cat_1.jpg`
    and `cat_2/x.jpg`), or the first `limit` of them; on S3, through this thread's client, whose
    store faults are not retried for minutes as Beam's own S3 filesystem retries them."""
    if not files.own_client(prefix):
        return [m.path for m in FileSystems.match([f"{files.as_pattern(prefix)}**"], limits=[limit])[0].metadata_list]
    if scheme(prefix) == "s3":
        return [path for path, _ in itertools.islice(s3io().list_files(prefix), limit)]
    return _gcs_objects_named_from(prefix, limit)


@_failing_fast
def _gcs_objects_named_from(prefix: str, limit: Optional[int]) -> list[str]:
    bucket, key = _bucket_and_key(prefix)
    return [f"gs://{bucket}/{blob.name}"
            for blob in _gcs_bucket(bucket).list_blobs(prefix=key, max_results=limit, **_gcs_request())]


def delete(paths: Iterable[str]) -> None:
    """Removes each path taken literally: the object of that name, and every object under it as
    a folder (Beam's filesystems delete a folder's objects only for a name ending in `/` on S3,
    and never on GCS); what is not there is skipped."""
    targets = [target for path in paths for target in (path, *objects_under(path))]
    if not targets:
        return
    if scheme(targets[0]) == "s3" and files.own_client(targets[0]):
        failed = {path: error for path, error in s3io().delete_files(targets) if error is not None}
        if failed:
            raise OSError(f"cannot delete {', '.join(sorted(failed)[:3])}: {next(iter(failed.values()))}")
    elif _deletes_one_at_a_time(targets[0]):
        _delete_each(targets)
    else:
        literal = scheme(targets[0]) == "s3"  # Beam's S3 filesystem takes names literally
        FileSystems.delete(targets if literal else [files.as_pattern(path) for path in targets if files.exists(path)])


@_failing_fast
def _delete_each(paths: Iterable[str]) -> None:
    from google.api_core.exceptions import NotFound

    for path in paths:
        with contextlib.suppress(NotFound):
            _gcs_blob(path).delete(**_gcs_request())


@_failing_fast
def _copy_each(sources: Iterable[str], destinations: Iterable[str]) -> None:
    for source, destination in zip(sources, destinations):
        blob, (to_bucket, to_key) = _gcs_blob(source), _bucket_and_key(destination)
        blob.bucket.copy_blob(blob, _gcs_bucket(to_bucket), to_key, **_gcs_request())


def rename(sources: list[str], destinations: list[str]) -> None:
    """Renames objects: a copy and a delete each, which Beam batches (on a GCS emulator, which
    takes no batches, copied and then deleted one at a time)."""
    if scheme(sources[0]) == "s3" and files.own_client(sources[0]):
        failed = [(source, error) for source, _, error in s3io().rename_files(list(zip(sources, destinations)))
                  if error is not None]
        if failed:
            raise OSError(f"cannot rename {failed[0][0]}: {failed[0][1]}")
        return
    if _deletes_one_at_a_time(sources[0]):
        _copy_each(sources, destinations)
        _delete_each(sources)
    else:
        FileSystems.rename(sources, destinations)


def probe(path: str) -> Optional[str]:
    """Why the store of `path` (s3:// or gs://) cannot be used, or None: one request about its
    bucket, which fails the same way every later request would (unreachable, refused, missing).
    A bucket's root is refused before any request: Beam's S3 retried the ValueError of a path
    without a key for ~8 minutes, deaf to Ctrl-C."""
    bucket, key = _bucket_and_key(path)
    if not key.strip("/"):
        return f"a bucket's root; name a folder in it ({scheme(path)}://{bucket}/FOLDER)"
    try:
        if scheme(path) == "s3":
            _s3_client().head_bucket(Bucket=bucket)
        elif not _gcs_bucket(bucket).exists(**_gcs_probe_request()):
            return f"no such bucket {bucket!r}"
    except Exception as exc:  # each client raises its own error types
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in ("404", "NoSuchBucket"):
            return f"no such bucket {bucket!r}"
        return store_fault(exc) or f"{type(exc).__name__}: {_first_line(str(exc))}"
    return None


def _causes(exc: BaseException) -> Iterable[BaseException]:
    """The error, what it wraps (causes, contexts) and, for Beam's BeamIOError, each error it
    collected."""
    seen, pending = set(), [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending.extend([error.__cause__, error.__context__])
        details = getattr(error, "exception_details", None)
        if isinstance(details, dict):
            pending.extend(value for value in details.values() if isinstance(value, BaseException))


def unavailable(exc: BaseException) -> Optional[StoreUnavailable]:
    """The StoreUnavailable `exc` is or wraps, if any."""
    return next((error for error in _causes(exc) if isinstance(error, StoreUnavailable)), None)


def store_fault(exc: BaseException) -> Optional[str]:
    """Why the store itself cannot be used (a connection that fails, credentials or access
    refused, a bucket that does not exist), read from the error and what it wraps; None for an
    error about one object (missing, changed)."""
    for error in _causes(exc):
        name = type(error).__name__
        code = getattr(error, "code", None)
        response = getattr(error, "response", None)
        error_code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        status = (response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict)
                  else code if isinstance(code, int) else None)
        text = str(getattr(error, "message", None) or error)
        if error_code in _STORE_ERROR_CODES or any(code in text for code in _STORE_ERROR_CODES):
            return f"{error_code or name}: {_first_line(text)}"
        if status in _REFUSED_STATUSES:
            return f"access refused ({status}): {_first_line(text)}"
        if name in ("EndpointConnectionError", "ConnectionError", "ConnectTimeoutError", "NewConnectionError",
                    "ConnectionRefusedError", "TransportError", "NameResolutionError"):
            return f"cannot connect ({name}): {_first_line(text)}"
        if name in ("DefaultCredentialsError", "RefreshError", "NoCredentialsError"):
            return f"no usable credentials ({name}): {_first_line(text)}"
    return None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:300]
