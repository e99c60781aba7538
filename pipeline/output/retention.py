"""Retention for scheduled runs: `--keep_last=N` keeps the newest N datasets of a dated output.

After a successful run (published, or kept unchanged), the older finished datasets among the
folders the output template names are removed, oldest first, each under its own output lock
(a folder a live run holds is left for the next time). Only what imgrec wrote goes: the files
the dataset's metadata.json lists, metadata.json itself first (so nothing reads a half-removed
folder as a dataset), the pictures `imgrec verify` draws beside it, then the folder if nothing
else is left in it.
"""
from __future__ import annotations

import uuid
from typing import Optional

from pipeline.errors import OutputLocked, UsageError
from pipeline.output.lock import OutputLock
from pipeline.prepare import finished_siblings, folder_identity, read_json, sibling_pattern
from transforms import files
from transforms.dataset_format import (
    CLASS_COUNTS,
    CONTACT_SHEET,
    INDEX_DIR,
    METADATA_FILE,
    STAGING_DIR,
    is_dataset_metadata,
    join,
    listed_files,
    staging_dir,
)


def check_retention(template: str, keep_last: int) -> None:
    if keep_last and sibling_pattern(template) is None:
        raise UsageError(f"--keep_last needs an output template with {{date}} or {{timestamp}} in its last folder, "
                         f"got --output={template}")


def datasets_to_remove(template: str, keep_last: int, output: Optional[str] = None) -> list[str]:
    """The finished datasets of the template beyond the newest `keep_last`, oldest first; never
    `output`, the one this run just published or kept (a sibling named later can outrank it)."""
    if not keep_last:
        return []
    own = folder_identity(output) if output is not None else None
    return [folder for folder in reversed(list(finished_siblings(template))[keep_last:])
            if folder_identity(folder) != own]


def remove_dataset(folder: str) -> Optional[str]:
    """Removes what imgrec wrote in `folder`, and says what went; None when a live run holds its
    lock (left as is)."""
    try:
        with OutputLock(folder, uuid.uuid4().hex):  # only its acquiring raises OutputLocked
            metadata = read_json(join(folder, METADATA_FILE))
            if not is_dataset_metadata(metadata):
                return None
            files.delete([join(folder, METADATA_FILE)])
            names = [*listed_files(metadata), CONTACT_SHEET, CLASS_COUNTS]  # and what `imgrec verify` drew beside it
            files.delete([path for path in (join(folder, name) for name in names) if files.exists(path)])
            if files.is_folder(join(folder, INDEX_DIR)) and not files.list_names(join(folder, INDEX_DIR)):
                files.delete([join(folder, INDEX_DIR)])
    except OutputLocked:
        return None
    left = files.list_names(folder)
    if left == [STAGING_DIR]:
        return (f"removed the dataset in {folder}, not the folder: it holds the staging of a stopped run "
                f"(delete {staging_dir(folder)} once nothing there is needed)")
    if left:
        return f"removed the dataset in {folder}, not the folder: it holds files imgrec did not write"
    files.delete([folder])
    return f"removed {folder}"
