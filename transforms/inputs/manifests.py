"""What a manifest says: its layout (CSV columns or JSONL keys) and each line's path and label.

CSV and JSONL manifests list (path, label) pairs. The layout is chosen once per file: a CSV
header names the columns (or `--manifest_columns` does), a JSONL file's first line its keys, by
the preferences below and ignoring case and blanks. A line that does not fit the layout is a
`BadManifestLine` with its reason, never a guess; a header that cannot be understood is a
`ManifestError`, a usage error found before the pipeline runs. Relative paths are resolved
against the manifest's folder. transforms/inputs/discover.py reads manifests in the pipeline with these
functions.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import posixpath
import stat
from typing import BinaryIO, Callable, Iterator, Optional, Sequence, Union

from apache_beam.io.filesystems import FileSystems

from transforms.files import file_kind, local_path
from transforms.inputs.labels import LABEL_SEPARATOR, label_list
from transforms.refs import Candidate
from transforms.rejections import BadManifestLine, UnreadableFile
from transforms.specs import InputSpec

# Manifest header names (and JSONL keys), lower case, in order of preference.
PATH_COLUMNS = ("path", "filepath", "file_path", "image_path", "filename", "file_name", "file", "image")
LABEL_COLUMNS = ("label", "class", "category", "class_name", "label_name")

# A manifest line is a path and a label (and, in JSONL, perhaps a few more keys): a longer line
# is a BadManifestLine, so one huge line, or a file without newlines, never fills memory.
MAX_LINE_BYTES = 4 * 2**20
EXCERPT_CHARS = 200  # of a line, quoted in a message


class ManifestError(ValueError):
    """The manifest's header cannot be understood: a usage error, found before anything runs."""


@dataclasses.dataclass(frozen=True)
class ManifestLayout:
    """Where path and label are in each line: CSV column indices or JSONL keys."""

    kind: str  # csv | jsonl
    path: Union[int, str]
    label: Union[int, str]
    header: tuple[str, ...] = ()  # the column names of the first non-blank CSV line, if it has them
    multi_label: bool = False  # the label cell holds a list (`parse_labels_line`)


def excerpt(line: Union[str, bytes]) -> str:
    """A line as quoted in a message: the start of its repr, so a dead letter or an error line
    stays short however long the line is."""
    return repr(line[:EXCERPT_CHARS]) + ("..." if len(line) > EXCERPT_CHARS else "")


def _cells(line: str) -> list[str]:
    """A header's cells, read leniently: only the names matter (csv.Error if it is not CSV at all)."""
    return [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True), [])]


def csv_row(line: str) -> list[str]:
    """One data line's cells, read strictly: lines are parsed one by one (possibly in parallel), so
    a quote left open would otherwise end the line's last cell early instead of being refused."""
    try:
        return next(csv.reader([line], strict=True, skipinitialspace=True), [])
    except csv.Error as exc:
        # The strict reader's only complaint at the end of a single line is an open quote.
        reason = ("unbalanced quote; quoted fields cannot span lines" if str(exc) == "unexpected end of data"
                  else str(exc))
        raise BadManifestLine(f"unparseable CSV line {excerpt(line)}: {reason}") from None


def csv_layout(first_line: Optional[str], columns: Optional[tuple[str, str]],
               extensions: tuple[str, ...]) -> ManifestLayout:
    """The CSV layout from its first non-blank line: a recognised header, or none (path,label)."""
    try:
        named = list(_cells(first_line.lstrip("\ufeff"))) if first_line else []
    except csv.Error:  # e.g. a cell over csv's field size limit: neither a header nor a data line
        raise unrecognised_header(first_line) from None
    while named and not named[-1]:  # a spreadsheet's trailing commas name no column
        named.pop()
    cells = tuple(c.lower() for c in named)
    if columns:
        check_columns(columns)
        found = [_column(named, name, first_line) for name in columns]
        missing = [name for name, index in zip(columns, found) if index is None]
        if missing:
            raise ManifestError(f"manifest header {excerpt(first_line)} has no column {', '.join(missing)} "
                                f"(from --manifest_columns={','.join(columns)})")
        return ManifestLayout("csv", found[0], found[1], header=cells)
    # By the names' order of preference, as JSONL keys are picked: `path,class,label` labels by "label".
    path = next((i for i in (_column(named, name, first_line) for name in PATH_COLUMNS) if i is not None), None)
    label = next((i for i in (_column(named, name, first_line) for name in LABEL_COLUMNS) if i is not None), None)
    if path is not None and label is not None:
        return ManifestLayout("csv", path, label, header=cells)
    if not cells or cells[0].endswith(extensions):  # a first line naming an image file is data
        return ManifestLayout("csv", 0, 1)
    raise unrecognised_header(first_line)


def same_name(a: object, b: object) -> bool:
    """Column and key names are compared ignoring case and surrounding blanks, in CSV and JSONL."""
    return str(a).strip().lower() == str(b).strip().lower()


def _column(cells: list[str], name: str, first_line: str) -> Optional[int]:
    """Where the column `name` is, if the header has it; named twice (`path,Path`), which file
    is meant would be a guess: refused."""
    found = [i for i, cell in enumerate(cells) if same_name(cell, name)]
    if len(found) > 1:
        raise ManifestError(f"manifest header {excerpt(first_line)} has {len(found)} columns named {name!r}")
    return found[0] if found else None


def check_columns(columns: tuple[str, str]) -> None:
    """--manifest_columns must name two columns: one for both would label each file by its path."""
    if same_name(*columns):
        raise ManifestError(f"--manifest_columns={','.join(columns)} names the same column for the path and the label")


def unrecognised_header(first_line: str) -> ManifestError:
    """One message, naming the accepted columns, whatever made the header unusable, and what
    the line suggests went wrong."""
    hint = ""
    if "\r" in first_line:
        hint = " (its lines end in a carriage return alone, as old Mac Excel saves: save it as CSV UTF-8)"
    elif "," not in first_line and ("\t" in first_line or ";" in first_line):
        hint = " (imgrec reads comma-separated lines; this one is separated by tabs or semicolons)"
    return ManifestError(
        f"manifest header {excerpt(first_line.strip())} is not recognised{hint}: name the path column one of "
        f"{', '.join(PATH_COLUMNS)} and the label column one of {', '.join(LABEL_COLUMNS)}, "
        "or pass --manifest_columns=PATH_COLUMN,LABEL_COLUMN")


def jsonl_layout(first_line: Optional[str], columns: Optional[tuple[str, str]] = None) -> ManifestLayout:
    """The keys every line's path and label are read from, chosen once per file as CSV columns
    are: --manifest_columns, else the preferred names among the first line's keys (else `path`
    and `label`). Chosen per line, a line without `label` was labelled by its `category`."""
    if columns:
        check_columns(columns)
        return ManifestLayout("jsonl", columns[0], columns[1])
    keys = first_line_names(first_line, "jsonl")
    return ManifestLayout("jsonl", preferred_name(keys, PATH_COLUMNS) or PATH_COLUMNS[0],
                          preferred_name(keys, LABEL_COLUMNS) or LABEL_COLUMNS[0])


def first_line_names(first_line: Optional[str], kind: str) -> tuple[str, ...]:
    """The column names (CSV) or keys (JSONL) a manifest's first line gives; none if it cannot
    be read (a JSONL line that is not JSON is then reported as a bad line, as any other)."""
    if not first_line:
        return ()
    try:
        if kind == "csv":
            return tuple(_cells(first_line.lstrip("\ufeff")))
        row = _json_row(first_line.lstrip("\ufeff"))
    except (csv.Error, BadManifestLine):
        return ()
    return row.given if isinstance(row, _JsonObject) else ()


def preferred_name(names: Sequence[str], preferences: Sequence[str]) -> Optional[str]:
    """The first of `names` to match the earliest of `preferences` (`same_name`), or None."""
    return next((name for preferred in preferences for name in names if same_name(name, preferred)), None)


def open_manifest(path: str) -> BinaryIO:
    """A local manifest must be a regular file: a FIFO would block and /dev/zero never ends."""
    local = local_path(path)
    if local is not None:
        mode = os.stat(local).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(f"{file_kind(mode)}, not a regular file")
    return FileSystems.open(path, compression_type="uncompressed")


def manifest_lines(handle: BinaryIO) -> Iterator[bytes]:
    """The lines of an open manifest, with at most MAX_LINE_BYTES + 1 bytes of one in memory: a
    longer line comes cut to that (so `too_long` tells it) and its rest is skipped piece by piece."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        if not line.endswith(b"\n"):
            while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
        yield line


def too_long(raw: bytes) -> bool:
    return len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES


def header_text(raw: bytes) -> str:
    """A line as the header check reads it: undecodable bytes replaced, since it only needs the
    names. Its first non-blank line is the header, however it decodes (`manifest_rows` agrees)."""
    text = raw.decode("utf-8", "replace").lstrip("\ufeff").strip()
    return "" if blank(text) else text


def blank(line: str) -> bool:
    """A line with nothing in it: blanks, a byte-order mark alone, or only commas (a
    spreadsheet's empty row, whose cells name no file)."""
    return not line.lstrip("\ufeff").replace(",", "").strip()


def first_line(path: str) -> Optional[str]:
    """The manifest's first non-blank line, or None (empty file)."""
    with open_manifest(path) as handle:
        for raw in manifest_lines(handle):
            if line := header_text(raw):
                return line
    return None


def manifest_layout(spec: InputSpec, kind: str) -> ManifestLayout:
    """Read before the pipeline runs, so an unreadable manifest (a folder, a FIFO, a device) or a
    bad header is a usage error, not a failed job."""
    try:
        line = first_line(spec.path)
    except Exception as exc:  # each filesystem raises its own error types
        raise ManifestError(f"cannot read the manifest {spec.path}: {exc}") from None
    if spec.multi_label:
        return dataclasses.replace(multilabel_layout(line, kind, spec.manifest_columns), multi_label=True)
    if kind == "jsonl":
        return jsonl_layout(line, spec.manifest_columns)
    return csv_layout(line, spec.manifest_columns, tuple(e.lower() for e in spec.extensions))


def resolve_path(path: str, manifest: str) -> str:
    """Manifest paths may be absolute, URLs, or relative to the manifest's folder (on a store
    without its `./` segments, which no object key holds, as the OS reads them)."""
    if "://" in path or path.startswith("/"):
        return path
    folder = posixpath.dirname(manifest)
    if local_path(manifest) is not None:
        return join_local(folder, path)
    return FileSystems.join(folder, "/".join(part for part in path.split("/") if part != "."))


def join_local(folder: str, path: str) -> str:
    """`folder/path`, tidied (`./`, `//`), with `..` resolved as the OS opens it: after a symlink,
    `link/../x.png` is the x.png beside the link's target, not beside the link."""
    joined = posixpath.join(folder, path)
    parts = joined.split("/")
    if ".." not in parts:
        return posixpath.normpath(joined)
    last = len(parts) - 1 - parts[::-1].index("..")
    up_to = os.path.realpath("/".join(parts[:last + 1]))
    return posixpath.normpath(posixpath.join(up_to, *parts[last + 1:]))


class _JsonObject(dict):
    """A JSON object that remembers its keys as given: `json.loads` keeps the last of two."""

    def __init__(self, pairs: list[tuple[str, object]]):
        super().__init__(pairs)
        self.given = tuple(key for key, _ in pairs)


def _pick(row: _JsonObject, key: str) -> object:
    """The value of the layout's `key`, found as a CSV column is (`same_name`); given twice
    (`"path"` and `"Path "`), which file is meant would be a guess."""
    found = [given for given in row.given if same_name(given, key)]
    if len(found) > 1:
        raise BadManifestLine(f"the key {key!r} is given {len(found)} times ({', '.join(map(repr, found))})")
    return row[found[0]] if found else None


def _json_row(line: str) -> object:
    try:
        return json.loads(line, object_pairs_hook=_JsonObject)
    except (ValueError, RecursionError) as exc:  # also integers over 4300 digits, nesting too deep
        raise BadManifestLine(f"invalid JSON {excerpt(line)}: {exc}") from None


def _is_label(value: object) -> bool:
    """A JSON label is text (not blank) or an integer id; a bool, list, object or float would
    become a made-up class ('True', "['dog']")."""
    return (isinstance(value, str) and value.strip() != "") or (isinstance(value, int) and not isinstance(value, bool))


def parse_manifest_line(line: str, layout: ManifestLayout, manifest: str) -> Candidate:
    """One data line → its Candidate. Labels are stripped in both formats (`cat ` is `cat`); a
    multi-label line's are joined by LABEL_SEPARATOR."""
    if layout.multi_label:
        return parse_labels_line(line, layout, manifest)[0]
    return _single_label_line(line, layout, manifest)


def _single_label_line(line: str, layout: ManifestLayout, manifest: str) -> Candidate:
    if layout.kind == "csv":
        row = csv_row(line)
        path, label = (row[i].strip() if i < len(row) else "" for i in (layout.path, layout.label))
        # Both naming columns (this manifest's, or any of the usual names, in either place): a
        # header, as when manifests are joined with `cat` (`label,path` under `path,label` too).
        if {path.lower(), label.lower()} <= {*PATH_COLUMNS, *LABEL_COLUMNS, *layout.header} - {""}:
            raise BadManifestLine(f"a header line, {excerpt(line)} (manifests joined with their headers?)")
        width = len(layout.header) or 2
        if any(cell.strip() for cell in row[width:]):  # an unquoted comma: the cells after it moved
            raise BadManifestLine(f"{len(row)} cells where the {'header names' if layout.header else 'layout has'} "
                                  f"{width} (quote a path or label that holds a comma): {excerpt(line)}")
        if not path or not label:
            raise BadManifestLine(f"expected a path and a label, got {excerpt(line)}")
        return listed_candidate(path, label, manifest)
    path, label = _json_fields(line, layout, _is_label, "text or integer")
    return listed_candidate(path, str(label).strip(), manifest)


def _json_fields(line: str, layout: ManifestLayout, valid: Callable[[object], bool], what: str) -> tuple[str, object]:
    """A JSONL line's path and label value, refused unless the path is text and `valid` takes the
    value (`what` says what it must be)."""
    row = _json_row(line)
    if not isinstance(row, dict):
        raise BadManifestLine(f"expected a JSON object, got {excerpt(line)}")
    path, value = _pick(row, layout.path), _pick(row, layout.label)
    if not isinstance(path, str) or not path or not valid(value):
        raise BadManifestLine(f"expected {{{json.dumps(layout.path)}: text, {json.dumps(layout.label)}: {what}}}, "
                              f"got {excerpt(line)}")
    return path, value


def listed_candidate(path: str, label: str, manifest: str) -> Candidate:
    if "\0" in path:  # no file system has such a name, and os calls refuse it (ValueError)
        raise BadManifestLine(f"the path holds a NUL character: {excerpt(path)}")
    try:  # JSON's \ud800 escapes decode to lone surrogates, which are no text: no label, no file name.
        label.encode("utf-8")
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise BadManifestLine(f"a lone surrogate escape (not text) in {excerpt(path)}, "
                              f"label {excerpt(label)}") from None
    return Candidate(resolve_path(path, manifest), label)


def canonical_path(path: str) -> str:
    """One spelling per file, so `imgs/a.jpg`, `./imgs/a.jpg`, an absolute path and a path through
    a symlinked folder are recognised as the same listing."""
    local = local_path(path)
    return os.path.realpath(local) if local is not None else path


# Multi-label manifests: a path and a list of labels per line. A CSV cell holds the labels
# joined by LABEL_SEPARATOR (`cat|dog`); a JSONL line a list (`"labels": ["cat", "dog"]`).
MULTI_LABEL_COLUMNS = ("labels", "tags", "classes", "categories")


def multilabel_layout(first_line: Optional[str], kind: str,
                      columns: Optional[tuple[str, str]] = None) -> ManifestLayout:
    """The path column as in single-label manifests, the labels column the first of
    MULTI_LABEL_COLUMNS the header (CSV) or first line (JSONL) names; or `columns`
    (--manifest_columns), as in single-label manifests."""
    if not columns:
        names = first_line_names(first_line, kind)
        path, labels = preferred_name(names, PATH_COLUMNS), preferred_name(names, MULTI_LABEL_COLUMNS)
        if path is None or labels is None:
            raise ManifestError(f"multi-label manifest's first line {excerpt(first_line or '')} names no path "
                                f"column ({', '.join(PATH_COLUMNS)}) and labels column "
                                f"({', '.join(MULTI_LABEL_COLUMNS)})")
        columns = (path, labels)
    return csv_layout(first_line, columns, ()) if kind == "csv" else jsonl_layout(first_line, columns)


def parse_labels_line(line: str, layout: ManifestLayout, manifest: str) -> tuple[Candidate, tuple[str, ...]]:
    """One multi-label line → (its Candidate, whose label is the sorted labels joined by
    LABEL_SEPARATOR, and those labels). A CSV line's cell must name a label; a JSONL line may
    give an empty list (an image with none of the classes)."""
    if layout.kind == "csv":
        found = _with_labels(_single_label_line(line, layout, manifest))
        if not found[1]:  # `|` alone: separators around nothing, which an empty cell is refused for too
            raise BadManifestLine(f"the labels cell names no label (a JSONL line's [] is an image with none): "
                                  f"{excerpt(line)}")
        return found
    path, given = _json_fields(line, layout, _are_labels, "[text or integer, ...]")
    if any(LABEL_SEPARATOR in str(label) for label in given):
        raise BadManifestLine(f"a label holds {LABEL_SEPARATOR!r}, which joins labels: {excerpt(line)}")
    return _with_labels(listed_candidate(path, LABEL_SEPARATOR.join(map(str, given)), manifest))


def _are_labels(value: object) -> bool:
    return isinstance(value, list) and all(map(_is_label, value))


def _with_labels(candidate: Candidate) -> tuple[Candidate, tuple[str, ...]]:
    labels = label_list(candidate.label)
    return Candidate(candidate.path, LABEL_SEPARATOR.join(labels)), labels
