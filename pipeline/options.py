"""Command-line options and YAML configs, merged into one frozen `ConversionSpec`.

A YAML file gives defaults (its `beam:` section holds Beam pipeline options); flags given on the
command line override it. Each flag is declared once, with the config field it sets. Anything
unknown (a typo'd flag, config key or Beam option) is a usage error naming the closest valid
one: a scheduled job must not run with defaults because of a typo.
"""
from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import difflib
import math
import os
import re
import stat
import typing
from typing import Any, Iterable, Optional, Sequence

import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.errors import CommandLineParser, UsageError
from pipeline.flags import FLAGS, SECTIONS, add_imgrec_flags, comma_separated, shipped_configs
from transforms import files
from transforms.specs import ConversionSpec, FeatureKeys


class ImgrecOptions(PipelineOptions):
    """imgrec's options (pipeline/flags.py); every other flag is passed to Beam."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_imgrec_flags(parser)


# --------------------------------------------------------------------------------------------
# Validation: one line, exit code 2, the closest valid name


def _closest(name: str, valid: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def check_flags(flags: Sequence[str], source: str = "command line") -> None:
    """Unknown flags and invalid values are usage errors, not warnings. Beam hands its parser,
    holding every option of every PipelineOptions class, to `add_extra_args_fn`; the flags are
    checked with it there."""

    def check(parser: argparse.ArgumentParser) -> None:
        parser.exit_on_error = False  # a bad value raises, instead of printing usage and exiting
        try:
            known, unknown = parser.parse_known_args(list(flags))
        except argparse.ArgumentError as exc:
            raise UsageError(str(exc)) from None
        if unknown:
            name = unknown[0].split("=", 1)[0]
            raise UsageError(f"unknown option {name} on the {source}{_closest(name, [f'--{k}' for k in vars(known)])}")

    PipelineOptions([]).get_all_options(add_extra_args_fn=check)


class ConfigLoader(yaml.SafeLoader):
    """YAML 1.2's booleans and numbers: YAML 1.1 also read `off` as false (`reduced_decode: off`),
    `0123` as octal 83, `1:30` as 90 and `1_000` as 1000, changing what a setting says. Other
    spellings stay text, which `coerce` converts to a number or refuses with a message. A key
    given twice in one mapping is refused, as YAML 1.2 says (PyYAML keeps the last one silently)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._checked_mappings: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Each mapping's own keys are checked once, before a merge (`<<: *defaults`) adds the
        keys it may override: PyYAML flattens a merged mapping in place."""
        if id(node) not in self._checked_mappings:
            self._checked_mappings.add(id(node))
            first_lines: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, collections.abc.Hashable):  # refused by the construction itself
                    continue
                if key in first_lines:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (first on line {first_lines[key]})",
                        key_node.start_mark)
                first_lines[key] = key_node.start_mark.line + 1
        super().flatten_mapping(node)


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"),
                                   list("-+0123456789"))
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def config_path(name: str) -> str:
    """A config file path, or the name of a shipped config (`seed` → configs/seed.yaml); a name
    that is neither is a usage error listing the shipped ones."""
    if os.path.exists(name) or os.sep in name:
        return name
    shipped = shipped_configs()
    if name in shipped:
        return shipped[name]
    guess = _closest(re.sub(r"\.ya?ml$", "", name).lower(), shipped)  # seed.yaml and SEED mean seed
    if name.endswith((".yaml", ".yml")) and not guess:
        return name  # a file read_config says it cannot read
    raise UsageError(f"--config={name}: no such file, nor a shipped config{guess} (shipped: "
                     f"{', '.join(sorted(shipped))})")


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and on which line; PyYAML's first line is often only the context
    ("while parsing a flow mapping")."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark or exc.context_mark
        return exc.problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else "")
    return str(exc).splitlines()[0]


def read_config(path: Optional[str]) -> dict:
    if not path:
        return {}
    path = config_path(path)
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # a FIFO would block the open() forever
            raise UsageError(f"config {path} is {files.file_kind(mode)}, not a file")
        with open(path, encoding="utf-8") as handle:
            config = yaml.load(handle, Loader=ConfigLoader) or {}
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"config {path} is not valid YAML: {yaml_problem(exc)}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(config, dict):
        raise UsageError(f"config {path} must be a mapping of sections")
    for section in config:
        if section not in SECTIONS and section != "beam":
            raise UsageError(f"{path}: unknown section {section!r}{_closest(str(section), ['beam', *SECTIONS])}")
        if config[section] is not None and not isinstance(config[section], dict):
            raise UsageError(f"{path}: section {section!r} must be a mapping")
    return config


def beam_args_from_config(config: dict) -> list[str]:
    """The YAML `beam:` section as flags, to be placed before the command line's own; a list
    repeats its flag (`experiments: [a, b]`)."""
    args = []
    for key, value in (config.get("beam") or {}).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool):
                args.append(f"--{key}" if item else f"--no_{key}")
            elif isinstance(item, (str, int, float)):
                args.append(f"--{key}={item}")
            else:  # never str() a list or mapping: a YAML alias bomb expands there
                raise UsageError(f"beam.{key} must be a value or a list of values, got a {type(item).__name__}")
    return args


# Settings that name a file or folder: a file:// URL there is taken as the local path.
PATH_FIELDS = (("input", "path"), ("input", "images_root"), ("output", "path"), ("output", "compare_to"),
               ("output", "reuse_from"))


def build_spec(config: dict, options: ImgrecOptions) -> ConversionSpec:
    """YAML sections, then flags that were given, → validated frozen specs."""
    values = {section: dict(config.get(section) or {}) for section in SECTIONS}
    given = options.get_all_options(retain_unknown_options=False)
    for flag in FLAGS:
        if given.get(flag.name) is not None:
            values[flag.section][flag.field] = given[flag.name]
    if given.get("skip_unchanged") is False and given.get("compare_to") is None:
        values["output"].pop("compare_to", None)  # --no_skip_unchanged: the config's compare_to goes with it
    for section in ("input", "output"):
        if not values[section].get("path"):
            raise UsageError(f"--{section} (or {section}.path in the config) is required")
    for section, field in PATH_FIELDS:
        path = values[section].get(field)
        if isinstance(path, str):  # anything else is refused by `coerce`
            path = files.beam_path(path)
            # The same input folder spelled two ways gives the same records.
            values[section][field] = files.absolute(path) if section == "input" else path
    specs = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)  # the dataclass's fields: it declares no other annotations
        for key in values[section]:
            if key not in hints:
                raise UsageError(f"unknown {section} setting {key!r}{_closest(str(key), hints)}")
        try:
            specs[section] = cls(**{k: coerce(v, hints[k], f"{section}.{k}") for k, v in values[section].items()})
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    try:
        if not values["features"] or specs["input"].detection and specs["features"] == FeatureKeys():
            # the config names no keys (a detection record's cannot be renamed): the input kind's defaults
            specs["features"] = specs["input"].default_features()
        if specs["input"].detection and "resize_mode" not in values["image"]:  # each image keeps its size
            specs["image"] = dataclasses.replace(specs["image"], resize_mode="none")
        return ConversionSpec(**specs)
    except ValueError as exc:  # settings of two sections that do not go together
        raise UsageError(str(exc)) from None


def coerce(value: Any, hint: Any, name: str) -> Any:
    """A YAML value as the field's declared type, so `salt: 2024` is the string "2024"."""
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise ValueError(f"{name} must not be empty")
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if typing.get_origin(hint) is tuple:
        if isinstance(value, str):
            try:
                value = comma_separated(value)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be a list, got a {type(value).__name__}")
        item = typing.get_args(hint)[0]
        return tuple(coerce(v, item, name) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    if hint in (int, float) and isinstance(value, bool):  # YAML's `true` is not the number 1
        raise ValueError(f"{name} must be a number, got {value!r}")
    if hint is str and isinstance(value, bool):  # nor the text "True"
        raise ValueError(f"{name} must be text, got {str(value).lower()}")
    if hint is str and isinstance(value, float):  # `1.50` would become the text "1.5"
        raise ValueError(f"{name} must be text, got the number {value!r}; quote it")
    if hint is int and isinstance(value, float) and not value.is_integer():  # 1.5 must not become 1
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, (list, tuple, dict)):  # never str() it: a YAML alias bomb expands there
        raise ValueError(f"{name} must be {hint.__name__}, got a {type(value).__name__}")
    try:
        converted = hint(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be {hint.__name__}, got {value!r}") from exc
    if hint is float and not math.isfinite(converted):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return converted


@dataclasses.dataclass(frozen=True)
class ParsedArguments:
    spec: ConversionSpec
    options: PipelineOptions
    config_file: Optional[str]


def parse_arguments(argv: Sequence[str]) -> ParsedArguments:
    """argv → validated spec and Beam options; every problem is a UsageError."""
    parser = CommandLineParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--config", default=None)
    config_file = parser.parse_known_args(argv)[0].config
    config = read_config(config_file)
    beam_flags = beam_args_from_config(config)
    check_flags(beam_flags, f"config's beam: section ({config_file})")
    check_flags(argv)
    options = PipelineOptions(beam_flags + list(argv))
    return ParsedArguments(build_spec(config, options.view_as(ImgrecOptions)), options, config_file)
