"""Driver side, before the pipeline runs: check the output and the datasets a run compares with.

Everything here runs on the machine that launches the job, with the output lock held, and
refuses bad layouts before a single image is converted:

- a finished dataset in the output needs --overwrite or --skip_unchanged;
- a non-empty folder that is not an imgrec dataset needs --overwrite, and even then only files
  imgrec wrote are ever removed (those listed in the previous metadata.json, or in the journal
  of a publish that was interrupted); a foreign file with a name every run writes is refused;
- an output inside the input must not hide inputs from discovery;
- staging folders of dead runs are removed, but finished parts are kept for resumption.
"""
from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import posixpath
import re
import string
from typing import Iterator, Mapping, Optional, Sequence, Union

from pipeline.errors import UsageError
from pipeline.output.lock import run_alive
from pipeline.output.publish import JOURNAL_FILE, journal_path, read_json
from transforms import files
from transforms.dataset_format import (
    DEAD_LETTERS_FILE,
    INDEX_DIR,
    LOCK_FILE,
    METADATA_FILE,
    RUN_DIR_PREFIX,
    STAGING_DIR,
    DatasetMetadata,
    FormatError,
    dataset_names,
    index_file_name,
    is_dataset_metadata,
    is_temporary_metadata,
    join,
    listed_files,
    parse_index,
    parts_dir,
    run_id_of,
    staging_dir,
)
from transforms.files import list_names, local_path
from transforms.inputs.discover import OutputFolder
from transforms.plan.reuse import ReuseSource
from transforms.specs import InputSpec, OutputSpec, glob_root
from transforms.write.tfrecord import framed_length

LATEST = "latest"
# The fields of a dated output template: the UTC strftime format of each, and a regex of its values.
_TEMPLATE_FIELDS = {"date": ("%Y-%m-%d", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
                    "timestamp": ("%Y%m%dT%H%M%S", r"[0-9]{8}T[0-9]{6}")}


# What every run writes at the top of its output, whatever its counts (shard names depend on them).
ALWAYS_WRITTEN = (METADATA_FILE, INDEX_DIR, DEAD_LETTERS_FILE)


@dataclasses.dataclass(frozen=True)
class OutputState:
    """What is in the output folder before a run."""

    previous: Optional[dict]  # the finished dataset's metadata.json, as JSON (any format version)
    owned: tuple[str, ...]  # files imgrec wrote: may be replaced
    foreign: tuple[str, ...]  # anything else: never touched
    folders: tuple[str, ...] = ()  # files of the dataset that are folders now: no rename can replace them

    @property
    def previous_run_id(self) -> Optional[str]:
        return run_id_of(self.previous)

    @property
    def owned_names(self) -> set[str]:
        """Names directly inside the output that belong to imgrec's files."""
        return {f.split("/", 1)[0] for f in self.owned}

    @property
    def in_the_way(self) -> tuple[str, ...]:
        """Foreign names this run would have to write over."""
        return tuple(name for name in self.foreign if name in ALWAYS_WRITTEN)


def inspect_output(output: str) -> OutputState:
    previous = None
    metadata_path = join(output, METADATA_FILE)
    if files.exists(metadata_path):
        try:
            previous = read_json(metadata_path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # OSError: a folder named metadata.json
            raise UsageError(f"{metadata_path} is not a readable JSON file ({exc}); imgrec cannot tell which files "
                             "are its own, so it will not write here: fix or remove it") from None
        if not is_dataset_metadata(previous):
            previous = None  # somebody else's metadata.json
    owned = set(listed_files(previous)) if previous else set()
    journal = journal_path(output)
    if files.exists(journal):  # an interrupted publish was moving these: the old and the new dataset's files
        moved = read_json(journal)
        owned.update(moved.get("old", []), moved.get("new", []))
    folders = tuple(f for f in sorted(owned) if files.is_folder(join(output, f)))
    state = OutputState(previous, tuple(sorted(owned)), (), folders)
    ours = {LOCK_FILE, STAGING_DIR} | state.owned_names
    if previous:
        # Publishing makes index/ even for a dataset without shards, which lists no file in it.
        ours |= {METADATA_FILE} | ({INDEX_DIR} if previous.get("format_version", 0) >= 2 else set())
    index = local_path(join(output, INDEX_DIR))
    if index is not None and os.path.lexists(index) and not files.is_folder(index):
        ours.discard(INDEX_DIR)  # a file or a symlink there is the user's: the index files go in a folder
    foreign = tuple(n for n in list_names(output) if n not in ours and not is_temporary_metadata(n))
    return dataclasses.replace(state, foreign=foreign)


def check_output(output: str, spec: OutputSpec, state: OutputState) -> None:
    """Refusals: replacing a finished dataset, or writing into someone else's folder."""
    if state.previous is not None and not (spec.overwrite or spec.skip_unchanged):
        raise UsageError(f"{output} already holds a finished dataset ({METADATA_FILE}); pass --overwrite to "
                         "replace it, or --skip_unchanged to re-run only on changes")
    if state.previous is None and state.foreign and not spec.overwrite:
        raise UsageError(f"{output} is not empty and not an imgrec dataset (it holds {_some(state.foreign)}); pass "
                         "--overwrite to write the dataset into it anyway (files imgrec did not write are left alone)")
    if state.folders:
        raise UsageError(f"{output} holds folders where its dataset's files go ({_some(state.folders)}); imgrec "
                         "never replaces what it did not write: move them away")
    if state.in_the_way:
        raise UsageError(f"{output} holds {_some(state.in_the_way)}, which imgrec did not write but every run "
                         "writes; imgrec never replaces files it did not write: move them away or choose another "
                         "output")


def _some(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def output_folder(output: str, state: OutputState) -> OutputFolder:
    """The output as discovery may meet it: the entries imgrec wrote there are not inputs. The
    pictures `imgrec verify` draws are its own only beside a dataset; elsewhere they are the
    user's."""
    own = {STAGING_DIR, LOCK_FILE, *ALWAYS_WRITTEN} | state.owned_names
    if state.previous is not None:
        own |= dataset_names(state.previous)
    return OutputFolder(folder_identity(output), frozenset(own))


def folder_identity(folder: str) -> str:
    """One spelling per folder: local paths resolved (relative, through symlinks), URLs without a
    trailing slash."""
    local = local_path(folder)
    return os.path.realpath(local) if local is not None else folder.rstrip("/")


def check_layout(input_spec: InputSpec, output: str, state: OutputState) -> None:
    """A dataset is not written in among its own inputs: the output may not be the input folder
    itself, nor a folder of the input that already holds files and is not an imgrec dataset (a
    class folder, say). A new folder inside the input is fine: discovery passes over what imgrec
    writes there (transforms/inputs/discover.py OutputFolder)."""
    kind, local_input, local_output = input_spec.resolved_kind, local_path(input_spec.path), local_path(output)
    if kind not in ("folders", "glob") or local_input is None or local_output is None:
        return
    root = os.path.realpath(local_input if kind == "folders" else glob_root(local_input))
    target = os.path.realpath(local_output)
    if target == root:
        raise UsageError(f"--output={output} is the input folder: the dataset would be written in among its "
                         "inputs; choose another output (a new folder inside the input is fine)")
    if target.startswith(root.rstrip(os.sep) + os.sep) and state.previous is None and state.foreign:
        raise UsageError(f"--output={output} is inside --input={input_spec.path} and holds files imgrec did not "
                         f"write ({_some(state.foreign)}): the dataset would be written in among inputs; choose an "
                         "output outside the input or a new folder")


def clear_dead_runs(output: str) -> None:
    """Removes the staging of runs that died (the lock is ours, so none is alive), but keeps
    their finished parts: a restarted run with the same inputs and config takes them as they are."""
    staging = staging_dir(output)
    keep = parts_dir(output).rstrip("/").rsplit("/", 1)[-1]
    stale = [join(staging, name) for name in list_names(staging) if name not in (keep, JOURNAL_FILE)]
    if stale:
        files.delete(stale)


def stopped_runs_beside(template: str, output: str) -> list[str]:
    """The sibling folders of a dated output holding the staging of a stopped run: no later run
    expands to them to resume or remove it, so the run reports them (whether it is wanted, only
    the user knows). Local folders only: on a store each look would be a request."""
    if sibling_pattern(template) is None or local_path(output) is None:
        return []
    mine = folder_identity(output)
    return [folder for folder in _siblings(template) if folder_identity(folder) != mine and _stopped_run_left(folder)]


def _stopped_run_left(folder: str) -> bool:
    """Whether `folder` holds the staging of a run that was killed (its lock is left, not held)
    or interrupted (no lock, no run folder, finished parts kept); not one that failed (its run
    folder holds the dead letters its message named) or is alive."""
    staging = staging_dir(folder)
    try:
        if not os.path.isdir(staging):
            return False
        if os.path.exists(join(folder, LOCK_FILE)):
            return not run_alive(folder)
        return not any(name.startswith(RUN_DIR_PREFIX) for name in os.listdir(staging))
    except OSError:  # unreadable: not ours to judge
        return False


# --------------------------------------------------------------------------------------------
# Datasets a run compares with (--skip_unchanged) or takes images from (--reuse_from)


def expand_output_template(path: str, now: datetime.datetime) -> str:
    """`{date}` → 2026-12-02 and `{timestamp}` → 20261202T131500 (UTC), for scheduled runs; `{{`
    and `}}` are literal braces. Any other `{...}` is a usage error, not a traceback."""
    allowed = ", ".join(f"{{{field}}}" for field in _TEMPLATE_FIELDS)
    try:
        for _, field, spec, conversion in string.Formatter().parse(path):
            if field is not None and (field not in _TEMPLATE_FIELDS or spec or conversion):
                written = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise ValueError(f"unknown field {{{written}}}")
    except ValueError as exc:
        raise UsageError(f"--output={path}: {exc}; only {allowed} expand (write {{{{ and }}}} for a brace)") from None
    return path.format(**{field: now.strftime(fmt) for field, (fmt, _) in _TEMPLATE_FIELDS.items()})


def sibling_pattern(template: str) -> Optional[tuple[str, re.Pattern]]:
    """(parent folder, regex of sibling names) for a `.../{date}`-style output, else None (an
    escaped `{{date}}` is no field, and a parent `{{` is the folder `{`). The siblings are those
    of one folder: a field in the parent is no dated output."""
    parent, name = posixpath.split(template.rstrip("/"))
    parent_parts, name_parts = (list(string.Formatter().parse(part)) for part in (parent, name))
    if any(field is not None for _, field, _, _ in parent_parts) or not any(field for _, field, _, _ in name_parts):
        return None
    return "".join(text for text, _, _, _ in parent_parts), re.compile(
        "".join(re.escape(text) + (_TEMPLATE_FIELDS[field][1] if field else "") for text, field, _, _ in name_parts))


def finished_siblings(template: str) -> Iterator[str]:
    """The finished datasets among the folders a dated output template produces, newest first,
    this run's output included."""
    return (folder for folder in reversed(_siblings(template)) if _is_dataset(folder))


def _siblings(template: str) -> list[str]:
    """The folders a dated output template produces, oldest first."""
    parent, pattern = sibling_pattern(template)
    # `--output={date}`: the current folder's, named as the output is (join would make them /NAME)
    return [join(parent, name) if parent else name for name in sorted(list_names(parent or "."))
            if pattern.fullmatch(name)]


def latest_sibling(template: str) -> Optional[str]:
    """The newest finished dataset of a dated output template: a second run on the same {date}
    reuses what the first wrote there."""
    if sibling_pattern(template) is None:
        raise UsageError(f"'latest' needs an output template with {{date}} or {{timestamp}} in its last "
                         f"folder, got --output={template}")
    return next(finished_siblings(template), None)


def _is_dataset(folder: str) -> bool:
    """A finished imgrec dataset: a sibling whose metadata.json is somebody else's is none."""
    path = join(folder, METADATA_FILE)
    try:
        return files.exists(path) and is_dataset_metadata(read_json(path))
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def resolve_dataset(reference: Optional[str], template: str) -> Optional[str]:
    return latest_sibling(template) if reference == LATEST else reference


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The dataset --skip_unchanged compares with, and its input + config fingerprint: None when it
    cannot be kept as it is (files missing, shards not whole, no image without --allow_empty), and
    then `why_not` says so."""

    dataset: str
    fingerprint: Optional[str]
    why_not: Optional[str] = None


def comparison(spec: OutputSpec, template: str, state: OutputState) -> Optional[Comparison]:
    """The dataset --skip_unchanged compares with: the output's own when it holds one (a skip
    leaves it in place, so it must be what matched, whatever --compare_to names), else
    --compare_to's (a path or the latest dated sibling). --compare_to is checked either way."""
    if not spec.skip_unchanged:
        return None
    named = _compared_to(spec.compare_to, template) if spec.compare_to else None
    if state.previous:
        dataset, previous = spec.path, state.previous
    elif named:
        dataset, previous = named
    else:
        return None
    missing = tuple(f for f in listed_files(previous) if not files.exists(join(dataset, f)))
    if missing:
        return Comparison(dataset, None, f"{dataset} is missing {len(missing)} of its files ({', '.join(missing[:3])})")
    damaged = not_whole(dataset, previous)
    if damaged:
        return Comparison(dataset, None, f"{dataset} has shards or record indexes that do not match its "
                          f"{METADATA_FILE} ({', '.join(damaged[:3])}): cut short or appended to")
    # allow_empty is no part of the fingerprint, so a dataset published empty with it matches.
    splits = (previous.get("splits") or {}).values()
    if not spec.allow_empty and not any(split.get("num_examples") for split in splits):
        return Comparison(dataset, None, f"{dataset} holds no image, which only --allow_empty accepts")
    return Comparison(dataset, previous.get("fingerprint"))


def _compared_to(reference: str, template: str) -> Optional[tuple[str, dict]]:
    """(folder, parsed metadata.json) of the dataset --compare_to names; None when 'latest'
    finds none."""
    dataset = resolve_dataset(reference, template)
    if dataset is None:
        return None
    try:
        previous = read_json(join(dataset, METADATA_FILE))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--compare_to: cannot read {join(dataset, METADATA_FILE)}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if not is_dataset_metadata(previous):
        raise UsageError(f"--compare_to: {join(dataset, METADATA_FILE)} is not the metadata of an imgrec dataset")
    return dataset, previous


def not_whole(dataset: str, previous: Mapping) -> tuple[str, ...]:
    """The shards and record indexes that are not what metadata.json says, found from sizes and
    indexes without reading a record: uncompressed shards must add up to their records' framed
    bytes, and each record index (format 2 on) must frame its shard's records back to back (to
    the shard's end when its size is known: not gzip); --reuse_from and DALI read the indexes."""
    uncompressed = previous.get("compression") == "none"
    indexed = previous.get("format_version", 0) >= 2
    found: list[str] = []
    for split in (previous.get("splits") or {}).values():
        names = split.get("files")
        if not isinstance(names, list):
            continue
        sizes = [files.size(join(dataset, name)) if uncompressed else None for name in names]
        num_bytes, examples = split.get("num_bytes"), split.get("num_examples")
        if (uncompressed and isinstance(num_bytes, int) and isinstance(examples, int)
                and sum(sizes) != num_bytes + examples * framed_length(0)):
            found.extend(names)
        lengths = split.get("shard_lengths")
        if indexed and isinstance(lengths, list) and len(lengths) == len(names):
            found.extend(index_file_name(name) for name, records, size in zip(names, lengths, sizes)
                         if isinstance(name, str) and "/" not in name  # listed_files names no index for others
                         and not _index_whole(join(dataset, index_file_name(name)), records, size))
    return tuple(found)


def _index_whole(path: str, records: object, shard_bytes: Optional[int]) -> bool:
    try:
        return index_lists_records(files.read_bytes(path), records, shard_bytes)
    except OSError:  # unreadable, or no regular file (a FIFO would block the read)
        return False


def index_lists_records(data: bytes, records: object, shard_bytes: Optional[int]) -> bool:
    """Whether an index file holds `records` whole lines framing consecutive records from the
    shard's start, the last one ending where the shard does (when its uncompressed size is known)."""
    try:
        entries = parse_index(data.decode("ascii"))
    except ValueError:  # UnicodeDecodeError and FormatError are ValueErrors
        return False
    if len(entries) != records or (data and not data.endswith(b"\n")):
        return False
    ends = [0, *itertools.accumulate(entry.length for entry in entries)]
    if any(entry.offset != start for entry, start in zip(entries, ends)):
        return False
    return shard_bytes is None or ends[-1] == shard_bytes


@dataclasses.dataclass(frozen=True)
class Reuse:
    """What --reuse_from gives this run: a dataset to copy images from, or none, and then why."""

    source: Optional[ReuseSource] = None
    note: Optional[str] = None  # why no image is reused, when the run found that out itself


def reuse_source(spec: OutputSpec, template: str, pixel_fingerprint: str, output: str,
                 state: OutputState) -> Reuse:
    """The dataset --reuse_from names, checked to be able to serve this run's images. One the user
    named that cannot is a usage error; one the run picks itself (`latest`, its own output) may
    not (none yet, other image settings): every image is then converted, with a note, so that a
    schedule is never stuck on it."""
    if not spec.reuse_from:
        return Reuse()
    dataset = resolve_dataset(spec.reuse_from, template)
    own = dataset is not None and folder_identity(dataset) == folder_identity(output)
    if dataset is None or (own and state.previous is None):
        return Reuse(note="no finished dataset there yet")
    served = _serving(dataset, pixel_fingerprint)
    if isinstance(served, ReuseSource):
        return Reuse(served)
    if spec.reuse_from == LATEST or own:
        return Reuse(note=f"{dataset} cannot serve this run: {served}")
    raise UsageError(f"--reuse_from={dataset} cannot serve this run: {served}")


def _serving(dataset: str, pixel_fingerprint: str) -> Union[ReuseSource, str]:
    """The dataset as a source of this run's images, or why it cannot be one."""
    try:
        with files.open_regular(join(dataset, METADATA_FILE)) as handle:
            metadata = DatasetMetadata.loads(handle.read())
    except OSError as exc:
        return f"cannot read {join(dataset, METADATA_FILE)}: {exc.strerror or exc}"
    except FormatError as exc:
        return str(exc)
    if metadata.pixel_fingerprint != pixel_fingerprint:
        return ("it was written with other image settings or library versions (its pixel_fingerprint "
                "differs), so its image bytes would differ")
    if "content_hash" not in metadata.role_keys():
        return ("its records hold no content hash (no content_hash feature), so a record could not be "
                "checked against its index entry")
    if metadata.compression != "none":
        return f"its shards are {metadata.compression}-compressed, so records cannot be read at their offsets"
    shards = tuple((join(dataset, f), join(dataset, index_file_name(f))) for f in metadata.shard_files)
    missing = [i for _, i in shards if not files.exists(i)]
    if missing:
        return f"record index files are missing ({missing[0]}, ...)"
    run_id = metadata.run.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return (f"its {METADATA_FILE} names no run (run.run_id), so a run replacing it while this one reads "
                "it could not be noticed")
    return ReuseSource(dataset, run_id, shards, metadata.role_keys()["image"])

