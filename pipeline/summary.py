"""What the terminal shows: a short header before a run, the summary table after it."""
from __future__ import annotations

from typing import Optional

from pipeline.tables import counted, format_bytes, format_table
from transforms.dataset_format import DatasetMetadata
from transforms.inputs.manifests import excerpt
from transforms.rejections import SkippedFile, is_error_class
from transforms.specs import ConversionSpec

# Beyond this many classes (ImageNet has 1,000) the table shows the spread, not a column each.
MAX_CLASS_COLUMNS = 8
MAX_CLASSES_NAMED = 10  # in the warning about classes without examples


def format_header(spec: ConversionSpec, runner: str, config: Optional[str]) -> str:
    image = spec.image
    pixels = "uint8" if image.normalize == "none" else f"float32 ({image.normalize})"
    size = (f"{image.height}x{image.width} {image.resize_mode} ({image.interpolation})" if image.resizes
            else "original size (resize_mode none)")
    return (f"imgrec: {spec.input.path} -> {spec.output.path}\n  {size}, {image.encoding} {pixels}, runner {runner}"
            + (f", config {config}" if config else ""))


def _class_cells(label_counts: dict, classes: list[str]) -> list[str]:
    counts = [label_counts.get(c, 0) for c in classes]
    cells = counts if len(classes) <= MAX_CLASS_COLUMNS else [sum(1 for n in counts if n), min(counts), max(counts)]
    return [str(n) for n in cells]


def classes_without_examples(metadata: DatasetMetadata) -> list[str]:
    """Classes of the label map that no split holds an example of: a typo'd label on a rejected
    listing still takes an id (and moves the ids of the classes after it)."""
    written = {name for split in metadata.splits.values() for name, n in split.label_counts.items() if n}
    return [name for name in metadata.class_names() if name not in written]


def inputs_line(metadata: DatasetMetadata) -> str:
    """`inputs: 40 = 36 written + 2 skipped + 2 rejected`: skipped files are not images (by name or
    kind) and were never meant to be converted; rejected ones are images that failed."""
    inputs = metadata.inputs
    skipped = inputs.rejected_by_error.get(SkippedFile.__name__, 0)
    empty = inputs.rejected_by_error.get("NoAnnotations", 0)  # COCO/VOC, --no_keep_empty_images
    dropped = inputs.rejected - inputs.errors - skipped - empty  # copies of an image or listing, dropped
    parts = [f"{inputs.written} written", f"{skipped} skipped (not images)"]
    if empty:
        parts.append(f"{empty} without objects skipped")
    if dropped:
        parts.append(f"{dropped} duplicates dropped")
    return f"inputs: {inputs.total} = {' + '.join([*parts, f'{inputs.errors} rejected'])}"


def conflicting_pair(paths: list[str], labels: list[str]) -> list[tuple[str, str]]:
    """The first copy, and the first copy filed under another label: the two that disagree (the
    first two copies may share a label)."""
    other = next(i for i, label in enumerate(labels) if label != labels[0])
    return [(paths[0], labels[0]), (paths[other], labels[other])]


def duplicate_lines(metadata: DatasetMetadata) -> list[str]:
    """Identical images, and plainly the ones filed under different labels (a labelling mistake
    more often than not)."""
    duplicates = metadata.duplicates
    if not duplicates.groups:
        return []
    action = "dropped" if duplicates.dropped else "kept"
    lines = [f"duplicates: {counted(duplicates.groups, 'image')} stored more than once, "
             f"{duplicates.extra_copies} extra copies ({action})"]
    if metadata.config.get("splits", {}).get("key") == "path":
        lines[-1] += "; split by path, so copies can be in different splits"
    if duplicates.label_conflicts:
        first = next((e for e in duplicates.examples if len(set(e["labels"])) > 1), None)
        example = (": " + ", ".join(f"{excerpt(p)} is {excerpt(label)}" for p, label in
                                    conflicting_pair(first["paths"], first["labels"])) if first else "")
        lines.append(f"warning: label conflicts: {counted(duplicates.label_conflicts, 'image')} filed under "
                     f"different labels{example} (all in metadata.json duplicates.examples)")
    return lines


def format_summary(metadata: DatasetMetadata, output: str, elapsed: Optional[float] = None,
                   engine: Optional[str] = None) -> str:
    classes = metadata.class_names()
    class_header = classes if len(classes) <= MAX_CLASS_COLUMNS else ["classes", "min/class", "max/class"]
    header = ["split", "examples", *class_header, "shards", "bytes", "rejected"]
    rows = [[name, s.num_examples, *_class_cells(dict(s.label_counts), classes), s.num_shards,
             format_bytes(s.num_bytes), s.rejected] for name, s in metadata.splits.items()]
    inputs = metadata.inputs
    rows.append(["total", inputs.written, *("" for _ in class_header), "", "", inputs.errors])
    lines = [format_table(header, rows), "", inputs_line(metadata)]
    lines.extend(f"  rejected {error}: {n}" for error, n in sorted(inputs.rejected_by_error.items())
                 if is_error_class(error))
    lines.extend(duplicate_lines(metadata))
    objects = metadata.objects
    if objects is not None:
        why = ", ".join(f"{error}: {n}" for error, n in sorted(objects.dropped.items()))
        lines.append(f"objects: {sum(objects.written.values())} written (the class columns count objects), "
                     f"{sum(objects.dropped.values())} dropped" + (f" ({why})" if why else ""))
    if metadata.reuse:
        lines.append(f"reused: {metadata.reuse.reused} images from {metadata.reuse.source}, "
                     f"converted {metadata.reuse.converted}")
    lines.extend(f"warning: split {name} has no examples" for name, split in metadata.splits.items()
                 if not split.num_examples)
    empty = classes_without_examples(metadata)
    if empty:
        shown = ", ".join(map(excerpt, empty[:MAX_CLASSES_NAMED])) + (", ..." if len(empty) > MAX_CLASSES_NAMED else "")
        why = ("objects but keep their ids (no object of theirs was written: none annotated, or each dropped)"
               if objects is not None else "examples but keep their ids (an empty class folder, a class_names entry "
               "no image has, or a label whose every listing was rejected)")
        lines.append(f"warning: {len(empty):,} of {len(classes):,} classes have no {why}: {shown}")
    resumed = metadata.run.get("resumed_records", 0)
    if resumed:
        lines.append(f"resumed: {counted(resumed, 'record')} taken from what an earlier, unfinished run had written")
    if inputs.rejected or (objects and objects.dropped):
        lines.append(f"dead letters: {', '.join(metadata.error_files)}")
    if elapsed is not None:
        rate = f", {inputs.total / elapsed:,.0f} images/s" if elapsed > 0 else ""
        lines.append(f"time: {elapsed:.1f} s{rate}" + (f" on {engine}" if engine else ""))
    lines.append(f"output: {output} (metadata.json, {counted(len(metadata.shard_files), 'shard')})")
    return "\n".join(lines)
