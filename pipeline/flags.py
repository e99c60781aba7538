"""imgrec's command-line flags: one table, the parsers of their values, and `--help`.

Beam-free, so `imgrec run --help` answers without importing Beam (a second or more). Each flag
is declared once, with the config field it sets (pipeline/options.py reads them into the specs)
and the help group it shows in; `--help` shows the everyday flags by group, `--help-all` every
flag. Every flag not here is a Beam pipeline option.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import math
import os
import pathlib
from typing import Any, Callable, Optional

from transforms.specs import AnnotationSpec, FeatureKeys, ImageSpec, InputSpec, OutputSpec, SplitSpec

SECTIONS = {"input": InputSpec, "output": OutputSpec, "image": ImageSpec, "features": FeatureKeys,
            "splits": SplitSpec, "annotations": AnnotationSpec}
CONFIG_PACKAGE = "imgrec.configs"  # configs/ as installed, so --config=seed works anywhere
MAX_CONVERT_PROCESSES = 64  # at least; or 4 per core on bigger machines


def shipped_configs() -> dict[str, str]:
    """{name: path} of the configs shipped with imgrec (`--config=seed`): the installed package's,
    else (a source checkout not installed) the repository's configs/ folder."""
    try:
        folder = importlib.resources.files(CONFIG_PACKAGE)
    except ModuleNotFoundError:
        folder = pathlib.Path(__file__).resolve().parents[1] / "configs"
    return {entry.name[:-len(".yaml")]: str(entry) for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def comma_separated(text: str) -> list[str]:
    """`a, b` → [a, b], for flags and config strings alike: `` is none and a trailing comma is
    allowed, but an empty entry (`cat,,dog`) is a ValueError, as it is in a config's list:
    dropping it would move every later entry (a class's id)."""
    parts = [part.strip() for part in text.split(",")] if text.strip() else []
    if parts and not parts[-1]:
        parts.pop()
    if "" in parts:
        raise ValueError(f"an empty entry in {text!r}")
    return parts


def _csv_of(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    """A comma-separated flag's parser (`comma_separated`), each entry made a `kind`."""
    def parse(text: str) -> tuple:
        try:
            parts = comma_separated(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        try:
            return tuple(kind(part) for part in parts)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def mebibytes(text: str) -> int:
    try:
        return int(float(text) * 2**20)
    except OverflowError:  # inf: like nan, a bad value (argparse reports ValueErrors), not a crash
        raise ValueError(f"{text} MiB is not a finite size") from None


def processes(text: str) -> int:
    """Each converter process holds a decoder and its buffers: far more of them than cores only
    takes memory (999 took 16 GB and kept starting processes)."""
    count = 0 if text == "auto" else int(text)
    limit = max(MAX_CONVERT_PROCESSES, 4 * (os.cpu_count() or 1))
    if not 0 <= count <= limit:
        raise argparse.ArgumentTypeError(f"must be auto or a number up to {limit}, got {text}")
    return count


def seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    section: str
    field: str
    type: Optional[Callable[[str], Any]]  # None: a switch (with a --no_ twin)
    help: str
    everyday: bool = True  # shown by --help; the others by --help-all


FLAGS = (
    Flag("input", "input", "path", str, "Class-folder root, glob, or CSV/JSONL manifest (any Beam filesystem)."),
    Flag("input_kind", "input", "kind", str, "auto | folders | glob | csv | jsonl | coco | voc."),
    Flag("class_names", "input", "class_names", _csv_of(str),
         "Fixed label map, comma-separated; other labels are rejected."),
    Flag("max_file_bytes", "input", "max_file_bytes", int, "Reject larger files without reading them.", False),
    Flag("source_paths", "input", "source_paths", str,
         "relative (below the input folder) | absolute: what records' source_path holds.", False),
    Flag("manifest_columns", "input", "manifest_columns", _csv_of(str),
         "PATH_COLUMN,LABEL_COLUMN: manifest column (CSV header) or key (JSONL) names.", False),
    Flag("images_root", "input", "images_root", str,
         "COCO: the folder file_names resolve against (default: the annotation file's folder)."),
    Flag("keep_empty_images", "input", "keep_empty_images", None,
         "COCO/VOC: write images without objects (on by default; --no_keep_empty_images skips them, counted)."),
    Flag("multi_label", "input", "multi_label", None,
         "CSV/JSONL: a list of labels per image (`a.jpg,cat|dog`; JSONL a list); records hold label lists.", False),
    Flag("output", "output", "path", str, "Output folder ({date} and {timestamp} expand, UTC)."),
    Flag("num_shards", "output", "num_shards", int, "Shards per split; 0 picks them from --target_shard_mb."),
    Flag("target_shard_mb", "output", "target_shard_bytes", mebibytes,
         "Target shard size in MiB when num_shards is 0.", False),
    Flag("compression", "output", "compression", str, "none | gzip.", False),
    Flag("shuffle_seed", "output", "shuffle_seed", int, "Seed of the record order inside and across shards.", False),
    Flag("overwrite", "output", "overwrite", None,
         "Replace a finished dataset in --output (files imgrec did not write stay)."),
    Flag("skip_unchanged", "output", "skip_unchanged", None,
         "Keep the dataset if inputs and config are unchanged (see --compare_to), else replace it."),
    Flag("compare_to", "output", "compare_to", str,
         "Dataset --skip_unchanged compares with: a path, or 'latest' (newest sibling of a dated output)."),
    Flag("reuse_from", "output", "reuse_from", str,
         "Incremental run: take unchanged images from this dataset (a path, or 'latest')."),
    Flag("keep_last", "output", "keep_last", int,
         "A dated output ({date}, {timestamp}): after a successful run keep only the newest N datasets (0: all)."),
    Flag("max_error_fraction", "output", "max_error_fraction", float,
         "Fail when a larger fraction of the images are errors."),
    Flag("drop_duplicates", "output", "drop_duplicates", None, "Write one copy of identical images.", False),
    Flag("allow_empty", "output", "allow_empty", None, "Publish a dataset even when no image was written.", False),
    Flag("height", "image", "height", int, "Output height in pixels."),
    Flag("width", "image", "width", int, "Output width in pixels."),
    Flag("resize_mode", "image", "resize_mode", str, "center_crop | pad | stretch | none (keep each image's size)."),
    Flag("interpolation", "image", "interpolation", str, "area | linear | cubic | lanczos | nearest.", False),
    Flag("normalize", "image", "normalize", str, "none (uint8) | unit (float32 0..1) | mean_std (raw only)."),
    Flag("encoding", "image", "encoding", str, "jpeg | png | raw."),
    Flag("quality", "image", "quality", int, "JPEG quality 1..100.", False),
    Flag("alpha", "image", "alpha", str, "composite (over background) | drop.", False),
    Flag("decoder", "image", "decoder", str, "imgrec (exact alpha, 16-bit, EXIF handling) | imread (as cv2.imread).",
         False),
    Flag("reduced_decode", "image", "reduced_decode", str, "auto (JPEG DCT scaling where invisible) | off.", False),
    Flag("min_side", "image", "min_side", int, "Reject images whose short side is smaller.", False),
    Flag("max_pixels", "image", "max_pixels", int, "Reject images declaring more pixels (decompression bombs).",
         False),
    Flag("max_decoded_bytes", "image", "max_decoded_bytes", int, "Reject images whose decode needs more memory.",
         False),
    Flag("split_method", "splits", "method", str, "hash | stratified (single-label inputs)."),
    Flag("split_key", "splits", "key", str, "content | path: what the split hash is computed from.", False),
    Flag("split_names", "splits", "names", _csv_of(str), "Split names, comma-separated (letters, digits, _ and -)."),
    Flag("split_ratios", "splits", "ratios", _csv_of(float), "Split ratios, comma-separated, summing to 1."),
    Flag("split_salt", "splits", "salt", str, "Salt of the split hash; change it to re-draw splits.", False),
    Flag("masks", "annotations", "masks", None, "COCO: an instance mask (PNG) per object, from polygons or RLE."),
    Flag("min_visible", "annotations", "min_visible", float,
         "center_crop: drop a box left with less than this fraction of its area (counted).", False),
)


def flag_defaults() -> dict[str, str]:
    """Each flag's default as --help shows it (as the flag would be written), from the spec
    dataclasses; flags without one, and switches (off by default), are left out."""
    defaults = {}
    for flag in FLAGS:
        default = {f.name: f for f in dataclasses.fields(SECTIONS[flag.section])}[flag.field].default
        if default is dataclasses.MISSING or default is None or default is False or default == "":
            continue
        if flag.type is mebibytes:
            defaults[flag.name] = f"{default / 2**20:g}"
        elif isinstance(default, (tuple, list)):
            defaults[flag.name] = ",".join(map(str, default))
        else:
            defaults[flag.name] = str(default)
    return defaults


def _metavar(flag: Flag) -> str:
    if flag.field in ("path", "compare_to", "reuse_from"):
        return "PATH"
    if flag.type in (int, float, mebibytes):
        return "N"
    return "LIST" if flag.type is not str else "VALUE"


def add_imgrec_flags(parser: argparse.ArgumentParser, everyday_only: bool = False,
                     groups: Optional[dict[str, Any]] = None) -> None:
    """imgrec's flags on `parser` (into `groups`' argument groups by section, when given)."""
    defaults = flag_defaults()
    groups = groups or {}
    runner = groups.get("runner", parser)
    runner.add_argument(
        "--config", default=None, metavar="CONFIG",
        help=f"YAML config: a file, or a shipped one by name ({', '.join(sorted(shipped_configs()))}).")
    for flag in FLAGS:
        if everyday_only and not flag.everyday:
            continue
        target = groups.get(flag.section, parser)
        shown = f" (default: {defaults[flag.name]})" if flag.name in defaults else ""
        if flag.type is None:
            target.add_argument(f"--{flag.name}", action="store_true", default=None, help=flag.help + shown)
            # A config's `overwrite: true` is the default of every run using it: one run can say otherwise.
            target.add_argument(f"--no_{flag.name}", dest=flag.name, action="store_false", default=None,
                                help=f"Turns --{flag.name} off where a config turns it on." if not everyday_only
                                else argparse.SUPPRESS)
        else:
            target.add_argument(f"--{flag.name}", type=flag.type, default=None, help=flag.help + shown,
                                metavar=_metavar(flag))
    if not everyday_only:
        runner.add_argument("--convert_processes", type=processes, default=None,
                            metavar="N", help="Processes converting images inside each worker: auto (every "
                            "core when the runner runs the job in one process, else 1) or a number.")
    runner.add_argument("--progress_interval", type=seconds, default=None, metavar="SECONDS",
                        help="Seconds between progress lines (default: 5 on a terminal, 30 otherwise; 0: off).")


HELP_GROUPS = {"input": "what to convert", "output": "where and how the dataset is written",
               "image": "pixels", "splits": "train/val/test", "annotations": "COCO and VOC objects",
               "runner": "how it runs"}
EPILOG = ("Every other flag is a Beam pipeline option and passes straight to Beam: --runner (DirectRunner, "
          "PrismRunner, FlinkRunner, SparkRunner, DataflowRunner, PortableRunner), --job_endpoint, "
          "--environment_type, --project, --region, --temp_location, --s3_endpoint_url, ... A config's beam: "
          "section holds the same options. -v: INFO logging (the effective config, Beam's own lines). "
          "Exit codes: 0 dataset published or kept, 1 run failed, 2 usage error, 3 output locked by another run, "
          "130 interrupted.")


def help_text(all_flags: bool) -> str:
    """`imgrec run --help` (everyday flags by group) or `--help-all` (every imgrec flag)."""
    parser = argparse.ArgumentParser(
        prog="imgrec run", usage="imgrec run [--config=CONFIG] --input=PATH --output=PATH [flags]",
        description="Convert image files + labels into sharded TFRecords of tf.train.Example.",
        epilog=EPILOG + ("" if all_flags else " `imgrec run --help-all` lists every flag; docs/configuration.md "
                                               "explains them."),
        add_help=False, formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=28))
    groups = {section: parser.add_argument_group(f"{section} ({title})")
              for section, title in HELP_GROUPS.items()}
    add_imgrec_flags(parser, everyday_only=not all_flags, groups=groups)
    groups["runner"].add_argument("-v", "--verbose", action="store_true", help="INFO logging, Beam's included.")
    groups["runner"].add_argument("-h", "--help", action="store_true", help="This help; --help-all: every flag.")
    return parser.format_help()
