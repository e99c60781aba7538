"""The table printed after a run: per split examples, classes, shards, bytes; rejections."""
from __future__ import annotations


def _size(num_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


# Beyond this many classes (ImageNet has 1,000) the table shows the spread, not a column each.
MAX_CLASS_COLUMNS = 8


def _class_cells(label_counts: dict, classes: list[str]) -> list[str]:
    if len(classes) <= MAX_CLASS_COLUMNS:
        return [str(label_counts.get(c, 0)) for c in classes]
    counts = [label_counts.get(c, 0) for c in classes]
    return [str(sum(1 for n in counts if n)), str(min(counts)), str(max(counts))]


def format_summary(metadata: dict, output: str) -> str:
    splits = metadata["splits"]
    classes = list(metadata["label_map"])
    class_header = classes if len(classes) <= MAX_CLASS_COLUMNS else ["classes", "min/class", "max/class"]
    header = ["split", "examples", *class_header, "shards", "bytes", "rejected"]
    rows = [[name, str(s["num_examples"]), *_class_cells(s["label_counts"], classes),
             str(s["num_shards"]), _size(s["num_bytes"]), str(s["rejected"])]
            for name, s in splits.items()]
    inputs = metadata["inputs"]
    rows.append(["total", str(inputs["written"]), *("" for _ in class_header), "", "", str(inputs["rejected"])])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"inputs: {inputs['total']} = {inputs['written']} written + {inputs['rejected']} rejected")
    for error, n in inputs["rejected_by_error"].items():
        lines.append(f"  rejected {error}: {n}")
    duplicates = metadata["duplicates"]
    if duplicates["groups"]:
        action = "dropped" if duplicates["dropped"] else "kept"
        lines.append(f"duplicates: {duplicates['groups']} groups, {duplicates['extra_copies']} extra copies ({action})")
    if inputs["rejected"]:
        lines.append(f"dead letters: {', '.join(metadata['error_files'])}")
    lines.append(f"output: {output} (metadata.json, {sum(s['num_shards'] for s in splits.values())} shards)")
    return "\n".join(lines)
