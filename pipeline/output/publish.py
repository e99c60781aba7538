"""Worker side, the pipeline's last step: check the run, then move its dataset into the output.

Staging lives inside the output (`OUTPUT/.imgrec-staging/run-<id>/`), so publishing is a rename
on the same filesystem, even when the output is a mount point. The order makes every crash
safe:

1. the lock must still be this run's, with its driver alive when it runs on this host
   (pipeline/output/lock.py `check_publisher`), the output must hold the dataset the driver saw, and
   no file the new dataset adds may exist unless imgrec wrote it;
2. the new metadata.json is written into the staging folder, then a journal lists the files
   about to be removed and added (a later run treats them as imgrec's own, even if a crash left
   no metadata.json to say so);
3. the old metadata.json goes first (the old dataset stops being "finished"), then the old
   dataset's other files that the new one does not replace; nothing else is ever removed;
4. the staged files move in, metadata.json last; every write came before the first removal,
   so a full disk fails the run with the old dataset intact;
5. the staging folder (parts, journal) is removed.

Publishing is part of the job, not of the launcher, so a Dataflow job publishes even when the
process that submitted it (an Airflow task, say) stopped watching.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

from apache_beam.io.filesystems import FileSystems

from pipeline import interrupts
from pipeline.errors import RunFailed
from pipeline.output.lock import check_publisher
from transforms import files
from transforms.dataset_format import (
    INDEX_DIR,
    METADATA_FILE,
    DatasetMetadata,
    is_dataset_metadata,
    join,
    run_id_of,
    staging_dir,
)

JOURNAL_FILE = "publishing.json"  # in the staging folder while files move into the output


def read_json(path: str) -> dict:
    return json.loads(files.read_bytes(path).decode("utf-8"))


def publish(output: str, run_dir: str, metadata: DatasetMetadata, previous_run_id: Optional[str],
            previous_files: Sequence[str]) -> None:
    """Moves the staged dataset (`metadata` lists its files) from `run_dir` into `output`,
    replacing only `previous_files` (what the dataset there consisted of)."""
    check_publisher(output, metadata.run["run_id"])
    metadata_path = join(output, METADATA_FILE)
    current = read_json(metadata_path) if files.exists(metadata_path) else None
    if run_id_of(current) != previous_run_id or (current is not None and not is_dataset_metadata(current)):
        raise RunFailed(f"the dataset in {output} changed while this run converted (now run "
                        f"{run_id_of(current)}); nothing was published")
    new = [f for f in metadata.owned_files() if f != METADATA_FILE]
    replaced, ours = set(new), set(previous_files)
    old = [f for f in previous_files if f != METADATA_FILE and f not in replaced]
    foreign = [f for f in new if f not in ours and files.exists(join(output, f))]
    if foreign:
        raise RunFailed(f"{output} holds {', '.join(foreign[:5])}, which imgrec did not write and would have to "
                        "replace; nothing was published: move them away and run again")
    staged_metadata = join(run_dir, METADATA_FILE)
    with interrupts.publishing():
        # Everything that writes bytes (and so can fail on a full disk) comes before the first
        # removal; what follows are removals and renames on the output's filesystem.
        files.write_atomically(staged_metadata, metadata.dumps().encode("utf-8"))
        index_dir = join(output, INDEX_DIR)
        if not files.exists(index_dir):
            FileSystems.mkdirs(index_dir)
        files.write_atomically(journal_path(output),
                               json.dumps({"old": list(previous_files), "new": new}).encode("utf-8"))
        if current is not None:
            files.delete([metadata_path])
        files.delete([join(output, f) for f in old if files.exists(join(output, f))])
        files.rename_all([join(run_dir, f) for f in new], [join(output, f) for f in new])
        files.rename(staged_metadata, metadata_path)
        discard_staging(output)


def journal_path(output: str) -> str:
    return join(staging_dir(output), JOURNAL_FILE)


def interrupted_outcome(output: str, run_id: str) -> Optional[str]:
    """What an interrupted run left in `output`, read from the output itself (the signal may have
    come before, during or after a publish in another process), as an error message; None when
    it is this run's complete dataset. A publish cut short after its metadata.json had only its
    staging left to remove: that is done here."""
    metadata_path = join(output, METADATA_FILE)
    try:
        current = read_json(metadata_path) if files.exists(metadata_path) else None
    except (OSError, ValueError):
        current = None
    if run_id_of(current) == run_id:
        discard_staging(output)
        return None
    if current is None and files.exists(journal_path(output)):
        return (f"interrupted while publishing: {output} holds no finished dataset until a run publishes "
                "one; run the same command again (it resumes from the finished parts)")
    return "interrupted; nothing was published" + (f" ({output} still holds the dataset it held)" if current else "")


def discard_staging(output: str) -> None:
    if files.present(staging_dir(output)):
        files.delete([staging_dir(output)])
