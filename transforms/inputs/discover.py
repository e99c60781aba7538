"""Discover (path, label) pairs inside the pipeline: class folders, globs, CSV/JSONL manifests.

Every path under the input is accounted for: it becomes a candidate, or a rejection that says
why it is not one (a skipped README, a hidden or macOS `._` file, a `__MACOSX` folder, a file
outside any class folder, a broken symlink, a FIFO). Nothing is dropped silently.

Class folders follow Keras's `image_dataset_from_directory`: every subfolder of the root is a
class (empty ones too, so label ids match Keras's `class_names`), ids follow the sorted folder
names, and files in nested subfolders belong to their top-level class folder. Symlinked folders
are followed (loops are reported, not walked forever).

Paths are listed and manifests read by DoFns on the workers, so a million inputs never pass
through the driver, and any filesystem Beam knows (local, gs://, s3://) works. What a manifest's
header and lines say is transforms/inputs/manifests.py's concern; here they become candidates and dead letters.
"""
from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import errno
import fnmatch
import itertools
import json
import os
import pathlib
import posixpath
import re
import stat
from typing import Iterable, Iterator, Optional, Union

import apache_beam as beam

from transforms.batches import GroupInBuckets, batched, split_by
from transforms.dataset_format import (
    INDEX_DIR,
    LOCK_FILE,
    METADATA_FILE,
    STAGING_DIR,
    dataset_names,
    is_dataset_metadata,
    is_temporary_metadata,
)
from transforms.files import local_path
from transforms.inputs.manifests import (
    MAX_LINE_BYTES,
    ManifestLayout,
    blank,
    canonical_path,
    excerpt,
    header_text,
    manifest_layout,
    manifest_lines,
    open_manifest,
    parse_manifest_line,
    too_long,
)
from transforms.refs import Batch, Candidate
from transforms.rejections import (
    AmbiguousLabel,
    BadManifestLine,
    ConflictingLabels,
    DuplicateListing,
    InputRejected,
    Rejection,
    SkippedFile,
    UnreadableFile,
)
from transforms.specs import InputSpec, glob_root

REJECTED = "rejected"
LABELS = "labels"

MAX_METADATA_BYTES = 256 * 2**20  # a folder's metadata.json read to see if it holds a dataset
LISTINGS_QUOTED = 5  # of a file's conflicting manifest lines, quoted in each of their messages

Found = Union[Candidate, beam.pvalue.TaggedOutput]


def reject(path: str, reason: InputRejected) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(REJECTED, Rejection.from_exception(path, reason))


def skip_reason(name: str, extensions: tuple[str, ...], kind: str = "an image") -> Optional[str]:
    """Why a file called `name` is not an input (`kind`), or None if it is one."""
    if name.startswith("._"):
        return f"macOS AppleDouble metadata file, not {kind}"
    if name.startswith("."):
        return "hidden file"
    if not name.lower().endswith(extensions):
        return f"extension not in {', '.join(extensions)}"
    return None


def folder_skip_reason(name: str) -> Optional[str]:
    """Why a folder called `name` holds no inputs (neither a class nor walked), or None. `__MACOSX`
    (macOS's zips' AppleDouble copies) as a class would shift the ids of the real classes."""
    if name == "__MACOSX":
        return "macOS archive metadata folder"
    if name.startswith("."):
        return "hidden folder"
    return None


def label_text(name: str) -> str:
    """A folder name as a label: valid UTF-8, since labels are text in every record. A name that
    is not keeps its other characters and shows each byte it cannot decode as `\\xNN`: folders
    `a\\xff` and `a\\xfe` stay two classes (one replacement character for both merged them)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def parent_folder(path: str) -> tuple[str, str]:
    """(the folder holding a file, its name). A backslash is a separator only where the OS says
    so (Windows); on POSIX `dog\\v2` is one folder's name."""
    paths = os.path if local_path(path) is not None else posixpath
    folder = paths.dirname(path)
    return folder, paths.basename(folder)


def label_from_parent(path: str) -> str:
    """Glob convention: the label is the name of the folder holding the file."""
    return label_text(parent_folder(path)[1])


@dataclasses.dataclass(frozen=True)
class OutputFolder:
    """imgrec's output, where discovery may meet it (inside the input, behind a symlink, matched
    by a glob or listed in a manifest). What imgrec wrote there is not an input and is passed
    over; anything else there is an input like any other, never silently left out."""

    path: str  # real path (local) or URL
    own: frozenset = frozenset()  # names directly inside it that imgrec wrote

    def owns(self, path: str) -> bool:
        """Whether `path` (a real path or URL) is, or lies inside, an entry imgrec wrote there."""
        prefix = self.path.rstrip("/") + "/"
        if not path.startswith(prefix):
            return False
        name = path[len(prefix):].split("/", 1)[0]
        return name in self.own or is_temporary_metadata(name)

    def holds_inputs(self, folder: str) -> bool:
        """Whether the output, met as `folder` (a path to it), holds anything imgrec did not write."""
        return any(not self.owns(f"{self.path}/{name}") for name in os.listdir(folder))


def imgrec_dataset(folder: str) -> Optional[OutputFolder]:
    """A local folder holding a finished imgrec dataset (an earlier dated output of a scheduled
    run inside its input, say), as an output discovery passes over; else None."""
    path = os.path.join(folder, METADATA_FILE)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_METADATA_BYTES:  # a FIFO would block open()
            return None
        with open(path, "rb") as handle:
            value = json.loads(handle.read(MAX_METADATA_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return OutputFolder(os.path.realpath(folder), dataset_names(value)) if is_dataset_metadata(value) else None


def unfinished_output(folder: str) -> bool:
    """A local folder holding only what an imgrec run writes before it publishes (its lock and
    staging): the dated output of a run under way, or of one that stopped, inside its input."""
    try:  # three names at most: a class folder of a million images is not listed for this
        with os.scandir(folder) as entries:
            names = {entry.name for entry in itertools.islice(entries, 3)}
    except OSError:
        return False
    return bool(names) and names <= {LOCK_FILE, STAGING_DIR}


# --------------------------------------------------------------------------------------------
# Class folders on a local filesystem


LOOP = "symlink loop: it leads to a folder that contains it"


def depth_first(walk: Iterator) -> Iterator:
    """A folder walk flattened: a folder's generator yields its entries, and for a subfolder the
    generator that walks it, walked there and then; a stack, so no depth of nesting stops it."""
    stack = [walk]
    while stack:
        found = next(stack[-1], None)
        if found is None:
            stack.pop()
        elif isinstance(found, collections.abc.Iterator):
            stack.append(found)
        else:
            yield found


def _walk_local(folder: str, label: str, extensions: tuple[str, ...], output: Optional[OutputFolder],
                ancestors: frozenset) -> Iterator[Union[Found, Iterator]]:
    """One folder's entries: candidates, rejections, and (walked by `depth_first`) subfolders."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        yield reject(folder, UnreadableFile(f"cannot list folder {folder}: {exc.strerror or exc}"))
        return
    in_output = output is not None and os.path.realpath(folder) == output.path
    for entry in entries:
        if in_output and output.owns(f"{output.path}/{entry.name}"):
            continue
        try:
            info = os.stat(entry.path)  # follows symlinks
        except OSError as exc:
            yield reject(entry.path, UnreadableFile(_unreadable(entry, exc)))
            continue
        if not stat.S_ISDIR(info.st_mode):
            reason = skip_reason(entry.name, extensions)  # FIFOs and devices are refused when read
            yield reject(entry.path, SkippedFile(reason)) if reason else Candidate(entry.path, label)
        elif reason := folder_skip_reason(entry.name):
            yield reject(entry.path, SkippedFile(f"{reason}, not walked"))
        elif (info.st_dev, info.st_ino) in ancestors:
            yield reject(entry.path, SkippedFile(LOOP))
        else:
            yield _walk_local(entry.path, label, extensions, output, ancestors | {(info.st_dev, info.st_ino)})


def _unreadable(entry: os.DirEntry, exc: OSError) -> str:
    """Why stat failed: a dangling symlink, or (a folder that can be listed but not entered, a
    symlink to itself) what the OS said."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and entry.is_symlink():
        return f"{entry.path} is a broken symlink (to {os.readlink(entry.path)})"
    return f"cannot read {entry.path}: {exc.strerror or exc}"


def walk_class_folder(folder: str, label: str, extensions: tuple[str, ...], output: Optional[OutputFolder] = None,
                      same_label_as: Optional[str] = None) -> Iterator[Found]:
    """Every file under a local class folder, recursively, as a candidate or a rejection; all
    rejected if its label is ambiguous (`same_label_as`: ClassFolder). A symlink inside it to the
    class folder, the root or a folder above is a loop: walked, it would give this class the
    files of every other class."""
    ancestors = folders_holding(folder) | folders_holding(os.path.dirname(folder))
    for found in depth_first(_walk_local(folder, label, extensions, output, ancestors)):
        if same_label_as and isinstance(found, Candidate):
            found = reject(found.path, ambiguous_label(label, same_label_as))
        yield found


def folders_holding(folder: str) -> frozenset:
    """(device, inode) of `folder` and of every folder above its real path; unreachable ones are
    left out (they cannot be walked either)."""
    found, real = set(), pathlib.PurePath(os.path.realpath(folder))
    for path in (real, *real.parents):
        with contextlib.suppress(OSError):
            info = os.stat(path)
            found.add((info.st_dev, info.st_ino))
    return frozenset(found)


@dataclasses.dataclass(frozen=True)
class ClassFolder:
    """A class folder to walk (a value, not a tuple, so Beam pickles a path that is not UTF-8)."""

    label: str
    path: str
    same_label_as: Optional[str] = None  # another folder whose name reads as this label


def ambiguous_names(folders: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(name, path) of folders, one per name → {name: a folder of another name} for each name
    that is not UTF-8 and reads as the label another name reads as too (`a` + byte 0xFF and a
    folder named `a\\xff`): its files are rejected, not merged into the other class."""
    folders = list(folders)
    labels = {name: label_text(name) for name, _ in folders}
    by_label = split_by(folders, lambda folder: labels[folder[0]])
    return {name: next(path for other, path in by_label[label] if other != name)
            for name, label in labels.items() if label != name and len(by_label[label]) > 1}


def ambiguous_label(label: str, other_folder: str) -> AmbiguousLabel:
    return AmbiguousLabel(f"the folder name is not UTF-8 and reads as label {label!r}, as folder "
                          f"{other_folder} does; rename one")


def list_local_root(root: str,
                    output: Optional[OutputFolder] = None) -> Iterator[Union[ClassFolder, beam.pvalue.TaggedOutput]]:
    """A ClassFolder for each class folder of a local root; other entries as rejections. The
    output folder, and any other folder holding an imgrec dataset, is a class only if it holds
    something imgrec did not write, and one holding only a run's lock and staging is none: dated
    outputs inside the input never become classes."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise UnreadableFile(f"cannot list the input folder {root}: {exc.strerror or exc}") from None
    folders, above = [], folders_holding(root)
    for entry in entries:
        try:
            info = os.stat(entry.path)  # follows symlinks
        except OSError as exc:  # a broken symlink, a symlink loop (ELOOP), an unreadable target
            yield reject(entry.path, UnreadableFile(_unreadable(entry, exc)))
            continue
        if not stat.S_ISDIR(info.st_mode):
            yield reject(entry.path, SkippedFile("not inside a class folder"))
        elif (info.st_dev, info.st_ino) in above:  # `IN/all -> .`: every class again
            yield reject(entry.path, SkippedFile(LOOP))
        elif output and os.path.realpath(entry.path) == output.path and not output.holds_inputs(entry.path):
            continue
        elif (dataset := imgrec_dataset(entry.path)) and not dataset.holds_inputs(entry.path):
            continue
        elif unfinished_output(entry.path):
            continue
        elif reason := folder_skip_reason(entry.name):
            yield reject(entry.path, SkippedFile(f"{reason}, not a class"))
        else:
            folders.append((entry.name, entry.path))
    ambiguous = ambiguous_names(folders)
    yield from (ClassFolder(label_text(name), path, ambiguous.get(name)) for name, path in folders)


# --------------------------------------------------------------------------------------------
# Class folders on object stores (gs://, s3://, ...): no folders, only object names


def classify_remote(root: str, path: str, extensions: tuple[str, ...]) -> Optional[Found]:
    """An object under `root` as a candidate (label: first path segment) or a rejection."""
    relative = path[len(root.rstrip("/")) + 1:]
    if not relative or relative.endswith("/"):
        return None  # a folder placeholder object, not a file
    segments = relative.split("/")
    if len(segments) == 1:
        return reject(path, SkippedFile("not inside a class folder"))
    return classify_file(path, segments[:-1], extensions, label_text(segments[0]))


def classify_file(path: str, folders: Iterable[str], extensions: tuple[str, ...], label: str) -> Found:
    """A file inside `folders` (those below the input's root) as a candidate or a rejection: no
    input if it is inside a hidden or `__MACOSX` one (the first such is named)."""
    skipped = next((folder for folder in folders if folder_skip_reason(folder)), None)
    if skipped:
        return reject(path, SkippedFile(f"inside {folder_skip_reason(skipped)} {skipped}"))
    reason = skip_reason(posixpath.basename(path), extensions)
    return reject(path, SkippedFile(reason)) if reason else Candidate(path, label)


def list_root(root: str, extensions: tuple[str, ...], output: Optional[OutputFolder]):
    """Input root → class names (LABELS), class folders to walk, or, on object stores, batches of
    the candidates themselves ("remote")."""
    local = local_path(root)
    if local is not None:
        for found in list_local_root(local, output):
            if isinstance(found, ClassFolder) and not found.same_label_as:
                yield beam.pvalue.TaggedOutput(LABELS, (found.label,))
            yield found
        return
    from transforms import object_stores  # through imgrec's S3 client: a store gone away fails at once

    matched = object_stores.objects_under(root)
    found = (f for f in (classify_remote(root, path, extensions) for path in matched) if f is not None)
    for item in batched(found):
        if isinstance(item, beam.pvalue.TaggedOutput):
            yield item
        else:
            yield beam.pvalue.TaggedOutput(LABELS, tuple(sorted({c.label for c in item})))
            yield beam.pvalue.TaggedOutput("remote", item)


def walk_folder(folder: ClassFolder, extensions: tuple[str, ...], output: Optional[OutputFolder]) -> Iterator:
    return batched(walk_class_folder(folder.path, folder.label, extensions, output, folder.same_label_as))


# --------------------------------------------------------------------------------------------
# Manifests: read on the workers, one candidate per listed file


ManifestRow = tuple[str, tuple[str, int, str]]  # (canonical path, (label, line number, path))


def manifest_rows(lines: Iterable[bytes], layout: ManifestLayout,
                  manifest: str) -> Iterator[Union[ManifestRow, beam.pvalue.TaggedOutput]]:
    """(canonical path, (label, line number, path)) per data line; undecodable, malformed or too
    long lines (`manifest_lines` cuts those) as rejections."""
    header_pending = bool(layout.header)
    for number, raw in enumerate(lines, 1):
        if header_pending:  # the line `first_line` read, even one not UTF-8 or too long
            header_pending = not header_text(raw)
            continue
        if too_long(raw):
            yield reject(manifest, BadManifestLine(f"line {number} is longer than {MAX_LINE_BYTES} bytes: "
                                                   f"{excerpt(raw)}"))
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield reject(manifest, BadManifestLine(f"line {number} is not UTF-8 ({exc.reason} at byte "
                                                   f"{exc.start}): {excerpt(raw)}"))
            continue
        line = line.lstrip("\ufeff").strip()  # editors and pandas may save manifests with a UTF-8 BOM
        if blank(line):
            continue
        try:
            candidate = parse_manifest_line(line, layout, manifest)
        except BadManifestLine as exc:
            yield reject(manifest, BadManifestLine(f"line {number}: {exc}"))
            continue
        yield canonical_path(candidate.path), (candidate.label, number, candidate.path)


def resolve_listings(canonical: str, listings: Iterable[tuple[str, int, str]],
                     output: Optional[OutputFolder] = None) -> Iterator[Found]:
    """One file's manifest lines → one candidate, or a ConflictingLabels rejection per line when
    they disagree on the label; repeats with the same label are reported, not written twice. A
    file imgrec wrote into its `output` is a rejection, since every manifest line is a record or
    a row (a glob passes over them as it matches: glob_candidates)."""
    listings = sorted(listings, key=lambda listing: listing[1])
    if len({label for label, _, _ in listings}) > 1:
        where = ", ".join(f"line {n}: {excerpt(label)}" for label, n, _ in listings[:LISTINGS_QUOTED])
        if len(listings) > LISTINGS_QUOTED:  # one message per listing: quoting all would grow as n²
            where += f" and {len(listings) - LISTINGS_QUOTED} more lines"
        for _, _, path in listings:
            yield reject(path, ConflictingLabels(f"listed with different labels ({where})"))
        return
    (label, first, path), *repeats = listings
    if output is not None and output.owns(canonical):
        yield reject(path, SkippedFile(f"imgrec wrote it into the output {output.path}: not an input"))
    else:
        yield Candidate(path, label)
    for _, number, repeated in repeats:
        yield reject(repeated, DuplicateListing(f"listed again on line {number} (first on line {first})"))


def read_manifest(manifest: str, layout: ManifestLayout):
    """Rows in batches, rejections as they come."""
    with open_manifest(manifest) as handle:
        yield from batched(manifest_rows(manifest_lines(handle), layout, manifest))


def resolve_bucket(element: tuple[int, Batch], output: Optional[OutputFolder]):
    """One bucket's manifest rows → batches of candidates (`resolve_listings` per file)."""
    _, rows = element
    yield from batched(found for canonical, listings in split_by(rows, lambda row: row[0]).items()
                       for found in resolve_listings(canonical, [listing for _, listing in listings], output))


# --------------------------------------------------------------------------------------------


def glob_matches(pattern: str, path: str) -> bool:
    """Whether `path` matches `pattern` as a shell with globstar matches it: segment by segment
    (no `*`, `?` or `[...]` reaches past a `/`; a backslash is part of a name), with Python's
    fnmatch inside a segment, and a `**` segment standing for any number of folders, none too.
    Beam's own matching let `*` stop at a backslash and `[...]` span folders."""
    return _segments_match(tuple(pattern.split("/")), tuple(path.split("/")))


def _segments_match(patterns: tuple[str, ...], names: tuple[str, ...]) -> bool:
    if not patterns:
        return not names
    if patterns[0] == "**":
        return any(_segments_match(patterns[1:], names[skip:]) for skip in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], patterns[0]) and _segments_match(patterns[1:], names[1:])


def _local_files(folder: str, depth: Optional[int], ancestors: frozenset
                 ) -> Iterator[Union[str, Rejection, Iterator]]:
    """Paths under a local folder that are not folders (dangling symlinks and FIFOs too: reading
    reports them), `depth` levels deep at most (None: any), walked by `depth_first`; a folder
    that cannot be listed is a Rejection (a shell's glob passes over it without a word). Symlinked
    folders are followed, as a shell's glob does; one that leads to a folder it lies in is not
    walked again."""
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError as exc:
        yield Rejection.from_exception(folder, UnreadableFile(f"cannot list folder {folder}: {exc.strerror or exc}"))
        return
    for name in names:
        path = f"{folder}/{name}" if folder else name
        try:
            info = os.stat(path)
        except OSError:  # a dangling symlink, or a symlink loop
            yield path
            continue
        if not stat.S_ISDIR(info.st_mode):
            yield path
        elif (depth is None or depth > 1) and (info.st_dev, info.st_ino) not in ancestors:
            yield _local_files(path, None if depth is None else depth - 1, ancestors | {(info.st_dev, info.st_ino)})


def match_glob(pattern: str) -> Iterator[Union[str, Rejection]]:
    """The files `pattern` matches (`glob_matches`), listed below its literal prefix: locally by
    walking (following symlinked folders, reporting dangling symlinks and the folders that could
    hold matches but cannot be listed), elsewhere with Beam."""
    root = glob_root(pattern)
    if local_path(pattern) is None:
        from transforms import object_stores  # through imgrec's S3 client: a store gone away fails at once

        listed = object_stores.objects_named_from(re.match(r"[^[*?]*", pattern).group(0))
    elif root and not os.path.isdir(root):
        listed = [root]  # a pattern without wildcards names one file
    else:
        segments = pattern.split("/")
        depth = None if "**" in segments else len(segments) - (len(root.split("/")) if root else 0)
        listed = depth_first(_local_files(root, depth, folders_holding(root or ".")))
    return (found for found in listed if (_could_hold_matches(pattern, found.path) if isinstance(found, Rejection)
                                          else glob_matches(pattern, found)))


def _could_hold_matches(pattern: str, folder: str) -> bool:
    """Whether files under `folder` could match `pattern`: its first segments match the folder."""
    segments = pattern.split("/")[:len(folder.split("/"))]
    return "**" in segments or glob_matches("/".join(segments), folder)


def classify_glob_match(root: str, path: str, extensions: tuple[str, ...]) -> Found:
    """A file a glob matched as a candidate (label: its parent folder's name) or a rejection. A
    hidden or `__MACOSX` folder the wildcards went into holds no inputs (Python's glob does not
    go into dot folders at all); one the pattern names itself (`~/.datasets/*/*.jpg`) is fine."""
    below = path[len(root):] if path.startswith(root) else posixpath.basename(path)
    return classify_file(path, posixpath.dirname(below).split("/"), extensions, label_from_parent(path))


def glob_candidates(pattern: str, extensions: tuple[str, ...], output: Optional[OutputFolder] = None):
    """The glob's matches as candidates and rejections; what imgrec wrote into `output` (its lock,
    staging, `index/`, ...) is passed over before it is classified, so never a SkippedFile row."""
    root = glob_root(pattern)
    datasets: dict[str, Optional[OutputFolder]] = {}  # folder → the dataset it holds

    def found() -> Iterator[Found]:
        for match in match_glob(pattern):
            if isinstance(match, Rejection):  # a folder that cannot be listed
                yield beam.pvalue.TaggedOutput(REJECTED, match)
            elif not (output is not None and output.owns(canonical_path(match)) or written_by_imgrec(match, datasets)):
                yield classify_glob_match(root, match, extensions)

    yield from batched(unambiguous(found()))


def unambiguous(matches: Iterable[Found]) -> Iterator[Found]:
    """Glob matches, the files of a non-UTF-8 folder name whose label is also another folder
    name's rejected as in class folders (`ambiguous_names`); only candidates whose label holds a
    backslash, as such labels do, wait until every match is seen."""
    held: list[Candidate] = []
    for found in matches:
        if isinstance(found, Candidate) and "\\" in found.label:
            held.append(found)
        else:
            yield found
    first_folders: dict[str, str] = {}  # folder name → the first folder of that name
    for candidate in held:
        folder, name = parent_folder(candidate.path)
        first_folders.setdefault(name, folder)
    ambiguous = ambiguous_names(sorted(first_folders.items()))
    for candidate in held:
        other = ambiguous.get(parent_folder(candidate.path)[1])
        yield reject(candidate.path, ambiguous_label(candidate.label, other)) if other else candidate


def written_by_imgrec(path: str, datasets: dict[str, Optional[OutputFolder]]) -> bool:
    """Whether a local file a glob matched is one imgrec wrote beside a dataset (an earlier
    output inside the input: `imgrec verify`'s contact_sheet.png, say), so no input."""
    local = local_path(path)
    if local is None:
        return False
    parent = os.path.dirname(local) or "."
    for folder in (parent, os.path.dirname(parent)) if os.path.basename(parent) == INDEX_DIR else (parent,):
        if folder not in datasets:  # a file directly beside the dataset, or in its index/
            datasets[folder] = imgrec_dataset(folder or ".")
        dataset = datasets[folder]
        if dataset is not None and dataset.owns(os.path.join(dataset.path, os.path.relpath(local, folder or "."))):
            return True
    return False


@beam.ptransform_fn
def DiscoverImages(pbegin: beam.pvalue.PBegin, spec: InputSpec, output: Optional[OutputFolder] = None,
                   spread: bool = True):
    """PBegin → {"candidates": batches of Candidate, "rejected": Rejection, "labels": tuples of
    label names}: every class folder's (even an empty one's) for folders, the candidates' labels
    otherwise. Files imgrec wrote into its `output` are not inputs. `spread` reshuffles the class
    folders so that workers walk them in parallel (pointless when one process runs every step)."""
    kind = spec.resolved_kind
    extensions = tuple(e.lower() for e in spec.extensions)
    if kind == "folders":
        listed = (pbegin
                  | "InputRoot" >> beam.Create([spec.path])
                  | "ListClassFolders" >> beam.FlatMap(list_root, extensions, output).with_outputs(
                      REJECTED, LABELS, "remote", main="folders"))
        folders = (listed.folders | "SpreadFolders" >> beam.Reshuffle()) if spread else listed.folders
        walked = (folders
                  | "WalkClassFolders" >> beam.FlatMap(walk_folder, extensions, output).with_outputs(
                      REJECTED, main="candidates"))
        candidates = (walked.candidates, listed.remote) | "AllCandidates" >> beam.Flatten()
        rejected = (listed[REJECTED], walked[REJECTED]) | "FolderRejections" >> beam.Flatten()
        return {"candidates": candidates, REJECTED: rejected, LABELS: listed[LABELS]}
    if kind == "glob":
        parsed = (pbegin
                  | "Pattern" >> beam.Create([spec.path])
                  | "MatchFiles" >> beam.FlatMap(glob_candidates, extensions, output).with_outputs(
                      REJECTED, main="candidates"))
        candidates, rejected = parsed.candidates, parsed[REJECTED]
    else:
        layout = manifest_layout(spec, kind)
        rows = (pbegin
                | "Manifest" >> beam.Create([spec.path])
                | "ReadManifest" >> beam.FlatMap(read_manifest, layout).with_outputs(REJECTED, main="rows"))
        resolved = (rows.rows
                    | "ByFile" >> GroupInBuckets(lambda row: row[0])
                    | "ResolveListings" >> beam.FlatMap(resolve_bucket, output).with_outputs(
                        REJECTED, main="candidates"))
        candidates = resolved.candidates
        rejected = (rows[REJECTED], resolved[REJECTED]) | "ManifestRejections" >> beam.Flatten()
    labels = candidates | "CandidateLabels" >> beam.Map(lambda batch: tuple(sorted({c.label for c in batch})))
    return {"candidates": candidates, REJECTED: rejected, LABELS: labels}
