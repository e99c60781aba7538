"""Command-line options and YAML configs, merged into one frozen `ConversionSpec`.

A YAML file gives defaults (its `beam:` section holds Beam pipeline options); flags given on the
command line override it. Each flag is declared once, with the config field it sets.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Callable, Optional, Sequence

import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from transforms.specs import (ConversionSpec, FeatureKeys, ImageSpec, InputSpec, OutputSpec,
                              SplitSpec)

SECTIONS = {"input": InputSpec, "output": OutputSpec, "image": ImageSpec, "features": FeatureKeys,
            "splits": SplitSpec}


def _csv_of(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    return lambda text: tuple(kind(part.strip()) for part in text.split(",") if part.strip())


def _mebibytes(text: str) -> int:
    return int(float(text) * 2**20)


@dataclasses.dataclass(frozen=True)
class Flag:
    name: str
    section: str
    field: str
    type: Optional[Callable[[str], Any]]
    help: str


FLAGS = (
    Flag("input", "input", "path", str, "Class-folder root, glob, or CSV/JSONL manifest (any Beam filesystem)."),
    Flag("input_kind", "input", "kind", str, "auto | folders | glob | csv | jsonl."),
    Flag("class_names", "input", "class_names", _csv_of(str), "Fixed label map, comma-separated; other labels are rejected."),
    Flag("output", "output", "path", str, "Output folder for shards, dead letters and metadata.json."),
    Flag("num_shards", "output", "num_shards", int, "Shards per split; 0 picks them from --target_shard_mb."),
    Flag("target_shard_mb", "output", "target_shard_bytes", _mebibytes, "Target shard size in MiB when num_shards is 0."),
    Flag("compression", "output", "compression", str, "none | gzip."),
    Flag("shuffle_seed", "output", "shuffle_seed", int, "Seed of the record order inside and across shards."),
    Flag("overwrite", "output", "overwrite", None, "Replace a finished dataset in --output."),
    Flag("skip_unchanged", "output", "skip_unchanged", None,
         "With a finished dataset in --output: keep it if inputs and config are unchanged, else replace it."),
    Flag("max_error_fraction", "output", "max_error_fraction", float, "Fail when more inputs than this are rejected."),
    Flag("drop_duplicates", "output", "drop_duplicates", None, "Write one copy of identical images."),
    Flag("height", "image", "height", int, "Output height in pixels."),
    Flag("width", "image", "width", int, "Output width in pixels."),
    Flag("resize_mode", "image", "resize_mode", str, "stretch | center_crop | pad."),
    Flag("interpolation", "image", "interpolation", str, "nearest | linear | area | cubic | lanczos."),
    Flag("normalize", "image", "normalize", str, "none (uint8) | unit (float32 0..1) | mean_std."),
    Flag("encoding", "image", "encoding", str, "raw | jpeg | png."),
    Flag("quality", "image", "quality", int, "JPEG quality 1..100."),
    Flag("alpha", "image", "alpha", str, "composite (over background) | drop."),
    Flag("min_side", "image", "min_side", int, "Reject images whose short side is smaller."),
    Flag("max_pixels", "image", "max_pixels", int, "Reject images declaring more pixels (decompression bombs)."),
    Flag("split_method", "splits", "method", str, "hash | stratified."),
    Flag("split_key", "splits", "key", str, "content | path: what the split hash is computed from."),
    Flag("split_names", "splits", "names", _csv_of(str), "Split names, comma-separated."),
    Flag("split_ratios", "splits", "ratios", _csv_of(float), "Split ratios, comma-separated, summing to 1."),
    Flag("split_salt", "splits", "salt", str, "Salt of the split hash; change it to re-draw splits."),
)


class ImgrecOptions(PipelineOptions):
    """imgrec's options; every other flag is passed to Beam."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", default=None, help="YAML config file with defaults (see configs/).")
        for flag in FLAGS:
            if flag.type is None:
                parser.add_argument(f"--{flag.name}", action="store_true", default=None, help=flag.help)
            else:
                parser.add_argument(f"--{flag.name}", type=flag.type, default=None, help=flag.help)


def read_config(path: Optional[str]) -> dict:
    if not path:
        return {}
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle) or {}
    unknown = set(config) - set(SECTIONS) - {"beam"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; expected beam, {', '.join(SECTIONS)}")
    return config


def beam_args_from_config(config: dict) -> list[str]:
    """The YAML `beam:` section as flags, to be placed before the command line's own."""
    args = []
    for key, value in (config.get("beam") or {}).items():
        if isinstance(value, bool):
            args.append(f"--{key}" if value else f"--no_{key}")
        else:
            args.append(f"--{key}={value}")
    return args


def build_spec(config: dict, options: ImgrecOptions) -> ConversionSpec:
    """YAML sections, then flags that were given, → validated frozen specs."""
    values = {section: dict(config.get(section) or {}) for section in SECTIONS}
    given = options.get_all_options(retain_unknown_options=False)
    for flag in FLAGS:
        if given.get(flag.name) is not None:
            values[flag.section][flag.field] = given[flag.name]
    for section, flag in (("input", "--input"), ("output", "--output")):
        if not values[section].get("path"):
            raise ValueError(f"{flag} (or {section}.path in the config) is required")
    specs = {}
    for section, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(values[section]) - set(fields)
        if unknown:
            raise ValueError(f"unknown {section} settings {sorted(unknown)}; expected {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        specs[section] = cls(**{k: coerce(v, hints[k], f"{section}.{k}") for k, v in values[section].items()})
    return ConversionSpec(**specs)


def coerce(value: Any, hint: Any, name: str) -> Any:
    """A YAML value as the field's declared type, so `salt: 2024` is the string "2024"."""
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise ValueError(f"{name} must not be empty")
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(coerce(v, item, name) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    try:
        return hint(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be {hint.__name__}, got {value!r}") from exc


def parse_config_flag(argv: Sequence[str]) -> Optional[str]:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", default=None)
    known, _ = parser.parse_known_args(argv)
    return known.config
