"""transforms.specs validation and pipeline.options: YAML + flags → one frozen ConversionSpec, and
every usage problem (unknown flag or key, bad value) → a one-line UsageError naming the fix."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from pipeline.errors import ImgrecError, OutputLocked, RunFailed, UsageError
from pipeline.flags import flag_defaults, help_text
from pipeline.options import (
    FLAGS,
    SECTIONS,
    ImgrecOptions,
    beam_args_from_config,
    build_spec,
    config_path,
    parse_arguments,
    read_config,
)
from tests.helpers import REPO
from transforms.specs import AnnotationSpec, ConversionSpec, FeatureKeys, ImageSpec, InputSpec, OutputSpec, SplitSpec

pytestmark = pytest.mark.unit

IO = ("--input=i", "--output=o")


def spec_from(config: dict, *flags: str) -> ConversionSpec:
    return build_spec(config, ImgrecOptions(list(flags)))


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- specs

@pytest.mark.parametrize("make,message", [
    (lambda: ImageSpec(resize_mode="squash"), "resize_mode must be one of stretch, center_crop, pad"),
    (lambda: ImageSpec(interpolation="bilinear"), "interpolation must be one of"),
    (lambda: ImageSpec(normalize="imagenet"), "normalize must be one of"),
    (lambda: ImageSpec(encoding="gif"), "encoding must be one of raw, jpeg, png"),
    (lambda: ImageSpec(alpha="keep"), "alpha must be one of composite, drop"),
    (lambda: ImageSpec(decoder="pillow"), "decoder must be one of imgrec, imread"),
    (lambda: ImageSpec(reduced_decode="on"), "reduced_decode must be one of auto, off"),
    (lambda: ImageSpec(height=0), "height and width must be positive"),
    (lambda: ImageSpec(min_side=0), "min_side at least 1"),
    (lambda: ImageSpec(max_decoded_bytes=0), "max_decoded_bytes"),
    (lambda: ImageSpec(normalize="unit"), "normalize=unit needs encoding=raw"),
    (lambda: ImageSpec(normalize="mean_std", encoding="raw", mean=(0.5,)), "three means"),
    (lambda: ImageSpec(quality=0, encoding="jpeg", normalize="none"), "quality must be in 1..100"),
    (lambda: ImageSpec(background=(256, 0, 0)), "background must be three values in 0..255"),
    (lambda: ImageSpec(background=(0, 0)), "background must be three values"),
    (lambda: ImageSpec(pad_value=-1), "pad_value must be in 0..255"),
    (lambda: OutputSpec("o", compare_to="latest"), "compare_to only matters with skip_unchanged"),
    (lambda: FeatureKeys(image=""), "image and label are required"),
    (lambda: FeatureKeys(label="image"), "must be distinct"),
    (lambda: SplitSpec(ratios=(0.5, 0.5)), "one ratio per name"),
    (lambda: SplitSpec(names=("a", "a"), ratios=(0.5, 0.5)), "distinct"),
    (lambda: SplitSpec(names=("train", "TRAIN"), ratios=(0.5, 0.5)), "distinct, ignoring case"),  # one file on macOS
    (lambda: SplitSpec(ratios=(0.7, 0.2, 0.2)), "sum to 1"),
    (lambda: SplitSpec(ratios=(1.2, -0.1, -0.1)), ">= 0"),
    (lambda: SplitSpec(method="random"), "split method must be one of hash, stratified"),
    (lambda: SplitSpec(key="name"), "split key must be one of content, path"),
    (lambda: OutputSpec("o", compression="zip"), "compression must be one of none, gzip"),
    (lambda: SplitSpec(names=("../x", "val"), ratios=(0.5, 0.5)), "split names .* got '../x'"),
    (lambda: SplitSpec(names=("a/b", "c"), ratios=(0.5, 0.5)), "split names"),
    (lambda: SplitSpec(ratios=(float("nan"), 0.5, 0.5)), ">= 0"),
    (lambda: ImageSpec(normalize="mean_std", encoding="raw", std=(0.0, 0.1, 0.1)), "std non-zero"),
    (lambda: ImageSpec(mean=(float("inf"), 0.0, 0.0)), "finite"),
    (lambda: ImageSpec(height=100_000, width=100_000), "more than max_decoded_bytes"),
    (lambda: OutputSpec("o", num_shards=-1), r"num_shards must be in 0\.\.100000"),
    (lambda: OutputSpec("o", num_shards=100_001), r"num_shards must be in 0\.\.100000"),
    (lambda: OutputSpec("o", max_error_fraction=1.5), r"max_error_fraction must be in \[0, 1\]"),
    (lambda: InputSpec("i", kind="tsv"), "input kind must be one of folders, glob, csv, jsonl"),
    (lambda: InputSpec("i", max_file_bytes=0), "max_file_bytes must be positive"),
    (lambda: InputSpec("i", manifest_columns=("path",)), "two names"),
    (lambda: InputSpec("i", class_names=("a", "a", "b")), "class_names must name distinct, non-empty classes"),
    (lambda: InputSpec("i", class_names=()), "class_names must name distinct, non-empty classes"),
    (lambda: InputSpec("i", class_names=("a", "", "b")), "class_names must name distinct, non-empty classes"),
    (lambda: InputSpec("m.csv", keep_empty_images=False), "keep_empty_images=false skips COCO and VOC images "
                                                           "without objects; the input is csv"),
    (lambda: ConversionSpec(InputSpec("m.csv"), OutputSpec("o"), annotations=AnnotationSpec(min_visible=0.9)),
     "min_visible is the part of a COCO or VOC box a center crop must leave; the input is csv"),
    (lambda: ConversionSpec(InputSpec("i.json", kind="coco"), OutputSpec("o"), ImageSpec(resize_mode="pad"),
                            annotations=AnnotationSpec(min_visible=0.9)),
     "min_visible is the part of a COCO or VOC box a center crop must leave; resize_mode=pad keeps every box whole"),
])
def test_invalid_specs(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("path,kind", [
    ("data/list.csv", "csv"), ("gs://b/LIST.CSV", "csv"), ("m.jsonl", "jsonl"), ("m.json", "jsonl"),
    ("data/*/*.jpg", "glob"), ("img?.png", "glob"), ("data/[ab]", "glob"), ("data/sample", "folders"),
    ("gs://bucket/images/", "folders"),
])
def test_input_kind_auto(path, kind):
    assert InputSpec(path).resolved_kind == kind
    assert InputSpec(path, kind="folders").resolved_kind == "folders"


@pytest.mark.parametrize("path,root", [
    ("/data/photos", "/data/photos"), ("/data/photos/", "/data/photos"), ("gs://b/in", "gs://b/in"),
    ("/data/*/x*.jpg", "/data"), ("/a/b/img?.png", "/a/b"), ("/a/**/[ab]/*.jpg", "/a"),
    ("/lists/train.csv", "/lists"), ("s3://b/m.jsonl", "s3://b"),
])
def test_the_input_root_names_the_records_source_paths_from(path, root):
    assert InputSpec(path).root() == root


def test_an_existing_folder_with_glob_characters_is_a_folder(tmp_path):
    folder = tmp_path / "photos[2024]"
    folder.mkdir()
    assert InputSpec(str(folder)).resolved_kind == "folders"
    assert InputSpec(str(tmp_path / "other[2024]")).resolved_kind == "glob"


@pytest.mark.parametrize("first_key, kind", [("type", "coco"), ("images", "coco"), ("path", "jsonl")])
def test_a_json_file_is_coco_when_its_first_key_is_one_of_cocos(tmp_path, first_key, kind):
    """Older COCO-style exports begin with "type": "instances"; a JSON manifest's records do not."""
    path = tmp_path / "a.json"
    path.write_text(json.dumps({first_key: "instances", "annotations": []}))
    assert InputSpec(str(path)).resolved_kind == kind


def test_the_input_kind_is_found_once_and_travels_with_the_spec(tmp_path):
    """A worker on another host, where the driver's local folder is not, converts what the
    driver found: a Pascal VOC folder stays VOC."""
    import pickle

    (tmp_path / "voc" / "Annotations").mkdir(parents=True)
    (tmp_path / "voc" / "JPEGImages").mkdir()
    spec = InputSpec(str(tmp_path / "voc"))
    assert spec.resolved_kind == "voc"
    shutil.rmtree(tmp_path / "voc")
    assert spec.resolved_kind == "voc"
    assert pickle.loads(pickle.dumps(spec)).resolved_kind == "voc"


def test_pixel_settings_leave_out_the_acceptance_limits():
    settings = ImageSpec().pixel_settings()
    assert not {"min_side", "max_pixels", "max_decoded_bytes"} & set(settings)
    assert {"height", "width", "resize_mode", "interpolation", "normalize", "encoding", "decoder"} <= set(settings)
    assert ImageSpec(min_side=9, max_pixels=10**6).pixel_settings() == settings
    assert ImageSpec(interpolation="cubic").pixel_settings() != settings


# ----------------------------------------------------------------------------- flags and YAML

def test_every_flag_sets_a_spec_field():
    for flag in FLAGS:
        fields = {f.name for f in dataclasses.fields(SECTIONS[flag.section])}
        assert flag.field in fields, flag
    assert len({flag.name for flag in FLAGS}) == len(FLAGS)


def test_the_input_is_one_absolute_path_however_it_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spellings = ("photos", "./photos/", f"{tmp_path}//photos/.", "file://photos")
    assert {spec_from({}, f"--input={path}", "--output=o").input.path for path in spellings} == {
        str(tmp_path / "photos")}
    assert spec_from({}, "--input=gs://b/photos/", "--output=o").input.path == "gs://b/photos/"


def test_build_spec_merges_config_and_flags():
    config = {"input": {"path": "from/yaml"}, "output": {"path": "out", "num_shards": 3},
              "image": {"height": 32, "width": 16, "mean": [0.1, 0.2, 0.3]},
              "splits": {"names": ["a", "b"], "ratios": [0.5, 0.5]}}
    spec = spec_from(config, "--input=from/flag", "--height=8", "--class_names=cat, dog,",
                     "--target_shard_mb=0.5", "--overwrite", "--manifest_columns=file,class")
    assert spec.input.path == os.path.join(os.getcwd(), "from/flag") and spec.output.path == "out"
    assert (spec.image.height, spec.image.width, spec.output.num_shards) == (8, 16, 3)
    assert spec.input.class_names == ("cat", "dog")
    assert spec.input.manifest_columns == ("file", "class")
    assert spec.image.mean == (0.1, 0.2, 0.3)
    assert spec.splits.names == ("a", "b") and spec.splits.ratios == (0.5, 0.5)
    assert spec.output.target_shard_bytes == 2**19 and spec.output.overwrite is True
    assert spec_from(config).output.overwrite is False  # an absent store_true flag does not override


@pytest.mark.parametrize("config, flags, label, label_text", [
    ({}, ("--multi_label",), "image/class/label", "image/class/text"),  # the OD API's image-level class keys
    ({"features": {"label": "tags", "label_text": "tags/text"}}, ("--multi_label",), "tags", "tags/text"),
    ({"features": {"label": "label"}}, ("--multi_label",), "label", "label/text"),  # the keys before #41
    ({}, (), "label", "label/text"),
])
def test_a_manifests_feature_keys_follow_multi_label_unless_the_config_names_them(config, flags, label, label_text):
    features = spec_from({**config, "input": {"path": "tags.csv"}, "output": {"path": "o"}}, *flags).features
    assert (features.image, features.label, features.label_text) == ("image", label, label_text)


@pytest.mark.parametrize("switch", ["overwrite", "skip_unchanged", "drop_duplicates", "allow_empty"])
def test_a_switch_a_config_turns_on_can_be_turned_off_for_one_run(switch):
    config = {"input": {"path": "in"}, "output": {"path": "out", switch: True}}
    assert getattr(spec_from(config).output, switch) is True
    assert getattr(spec_from(config, f"--no_{switch}").output, switch) is False
    assert getattr(spec_from({**config, "output": {"path": "out"}}, f"--{switch}").output, switch) is True


def test_no_skip_unchanged_also_drops_the_configs_compare_to():
    """compare_to alone is a usage error: --no_skip_unchanged under `compare_to: latest` was refused."""
    config = {"input": {"path": "in"}, "output": {"path": "out/{date}", "skip_unchanged": True, "compare_to": "latest"}}
    output = spec_from(config, "--no_skip_unchanged").output
    assert (output.skip_unchanged, output.compare_to) == (False, None)
    with pytest.raises(UsageError, match="compare_to only matters with skip_unchanged"):
        spec_from(config, "--no_skip_unchanged", "--compare_to=latest")


def test_split_flags_are_comma_separated_tuples():
    spec = spec_from({}, *IO, "--split_names=tr,te", "--split_ratios=0.75,0.25")
    assert spec.splits.names == ("tr", "te") and spec.splits.ratios == (0.75, 0.25)


@pytest.mark.parametrize("section,field,value,expected", [
    ("splits", "salt", 2024, "2024"),
    ("input", "class_names", [0, 1], ("0", "1")),
    ("input", "class_names", "cat, dog", ("cat", "dog")),
    ("image", "mean", [1, 0, 0], (1.0, 0.0, 0.0)),
    ("output", "max_error_fraction", 1, 1.0),
    ("output", "compare_to", None, None),
])
def test_yaml_values_get_the_field_type(section, field, value, expected):
    typed = getattr(getattr(spec_from({section: {field: value}}, *IO), section), field)
    assert typed == expected and type(typed) is type(expected)
    if isinstance(expected, tuple):
        assert all(type(t) is type(e) for t, e in zip(typed, expected))


@pytest.mark.parametrize("config,flags,message", [
    ({}, ["--output=o"], "--input"),
    ({"input": {"path": "i"}}, [], "--output"),
    ({"image": {"colour": "red"}}, IO, "unknown image setting 'colour'"),
    ({"image": {"hieght": 3}}, IO, "unknown image setting 'hieght'; did you mean height?"),
    ({"output": {"num_shard": 3}}, IO, "did you mean num_shards?"),
    ({}, [*IO, "--resize_mode=squash"], "resize_mode must be one of"),
    ({"output": {"overwrite": "maybe"}}, IO, "output.overwrite must be true or false, got 'maybe'"),
    ({"output": {"num_shards": "many"}}, IO, "output.num_shards must be int, got 'many'"),
    ({"image": {"height": None}}, IO, "image.height must not be empty"),
    ({"image": {"mean": 0.5}}, IO, "image.mean must be a list"),
    ({}, [*IO, "--split_ratios=0.5,0.2,0.1"], "sum to 1"),
    ({"image": {"height": 1.5}}, IO, "image.height must be a whole number, got 1.5"),
    ({"image": {"height": True}}, IO, "image.height must be a number, got True"),
    ({"output": {"max_error_fraction": float("nan")}}, IO, "must be a finite number"),
    ({}, [*IO, "--split_ratios=nan,0.5,0.5"], "splits.ratios must be a finite number"),
    ({"input": {"class_names": [["a", "b"]]}}, IO, "input.class_names must be str, got a list"),
    ({"splits": {"salt": {"x": 1}}}, IO, "splits.salt must be str, got a dict"),
    ({"splits": {"salt": True}}, IO, "splits.salt must be text, got true"),  # never the text "True"
    ({"input": {"path": ["m.csv"]}}, ["--output=o"], "input.path must be str, got a list"),  # never "['m.csv']"
    ({"output": {"path": True}}, ["--input=i"], "output.path must be text, got true"),
    ({"splits": {"salt": 1.50}}, IO, "splits.salt must be text, got the number 1.5; quote it"),  # not "1.5"
    ({"output": {"shuffle_seed": "1:00"}}, IO, "output.shuffle_seed must be int, got '1:00'"),
    # a list written as one string, as on the command line: an empty entry moved every later id
    ({"input": {"class_names": "bird,,dog,cat"}}, IO, "input.class_names: an empty entry in 'bird,,dog,cat'"),
    ({"splits": {"names": "train,,val"}}, IO, "splits.names: an empty entry"),
])
def test_build_spec_usage_errors(config, flags, message):
    with pytest.raises(UsageError, match=message):
        spec_from(config, *flags)


def test_read_config(tmp_path):
    assert read_config(write_config(tmp_path, "beam: {runner: DirectRunner}\nimage: {height: 3}\n")) == {
        "beam": {"runner": "DirectRunner"}, "image": {"height": 3}}
    # YAML 1.2 booleans: YAML 1.1 read `off` (a reduced_decode value) as False
    assert read_config(write_config(tmp_path, "image: {reduced_decode: off}\noutput: {overwrite: true}\n")) == {
        "image": {"reduced_decode": "off"}, "output": {"overwrite": True}}
    # and numbers: YAML 1.1 read 0123 as octal 83 and 1:30 as 90, silently other splits
    numbers = "splits: {salt: 0123}\nimage: {height: 64, mean: [0.5, .5, 1e-1]}\n"
    assert read_config(write_config(tmp_path, numbers)) == {
        "splits": {"salt": "0123"}, "image": {"height": 64, "mean": [0.5, 0.5, 0.1]}}
    assert read_config(write_config(tmp_path, "splits: {salt: 1:30}\n")) == {"splits": {"salt": "1:30"}}
    assert read_config(write_config(tmp_path, "")) == {}
    merged = "image: &base {height: 8, width: 8}\noutput:\n  <<: *base\n  num_shards: 2\n"  # a merge is no repeat
    assert read_config(write_config(tmp_path, merged))["output"] == {"height": 8, "width": 8, "num_shards": 2}
    chained = "image:\n  <<: &d\n    <<: {height: 1}\n    height: 2\noutput: {<<: *d}\n"  # nor one merged again
    assert read_config(write_config(tmp_path, chained)) == {"image": {"height": 2}, "output": {"height": 2}}
    assert read_config(None) == {}


@pytest.mark.parametrize("text,message", [
    ("input: {path: x}\nimages: {height: 3}\n", "unknown section 'images'; did you mean image?"),
    ("image: [1, 2]\n", "section 'image' must be a mapping"),
    ("[1, 2]\n", "must be a mapping of sections"),
    ("image: {height: 3\n", "is not valid YAML"),
    # YAML 1.2 forbids a key given twice; PyYAML kept the last (the first image: section was lost)
    ("image: {height: 8}\ninput: {path: x}\nimage: {width: 9}\n",
     r"the key 'image' is given twice \(first on line 1\) \(line 3, column 1\)"),
    ("image:\n  height: 8\n  height: 16\n",
     r"the key 'height' is given twice \(first on line 2\) \(line 3, column 3\)"),
    # what is wrong and where, not PyYAML's context line ("while parsing a flow mapping")
    ("image: {height: 3\n", r"expected ',' or '}', but got '<stream end>' \(line 2, column 1\)"),
    ("? [a, b]\n: 1\n", r"found unhashable key \(line 1, column 3\)"),
])
def test_read_config_refusals(tmp_path, text, message):
    with pytest.raises(UsageError, match=message):
        read_config(write_config(tmp_path, text))


@pytest.mark.timeout(20)
def test_a_yaml_alias_bomb_in_a_valid_setting_is_refused_without_expanding_it():
    with pytest.raises(UsageError, match="must be str, got a list"):
        spec_from({"input": {"class_names": [yaml_bomb(9)]}}, *IO)


def yaml_bomb(levels: int) -> list:
    """Nested lists sharing references, as YAML aliases load: 9**levels leaves, a few objects."""
    value: list = ["x"] * 9
    for _ in range(levels):
        value = [value] * 9
    return value


@pytest.mark.timeout(20)
def test_a_yaml_alias_bomb_in_the_beam_section_is_refused_without_expanding_it():
    with pytest.raises(UsageError, match="beam.experiments must be a value or a list of values, got a list"):
        beam_args_from_config({"beam": {"experiments": yaml_bomb(9)}})


@pytest.mark.timeout(20)
def test_a_config_that_is_a_fifo_is_a_usage_error_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "config.yaml")
    with pytest.raises(UsageError, match="config .*config.yaml is a FIFO, not a file"):
        read_config(str(tmp_path / "config.yaml"))


def test_a_missing_config_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read config .*nothing.yaml"):
        read_config(str(tmp_path / "nothing.yaml"))


@pytest.mark.parametrize("name", ["sede", "seed.yaml", "SEED"])
def test_a_misspelled_config_name_suggests_the_closest_and_lists_the_shipped_ones(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where no seed.yaml is
    with pytest.raises(UsageError, match=rf"--config={name}: no such file, nor a shipped config; did you mean seed\? "
                                         r"\(shipped: .*imagenet.*seed"):
        read_config(name)


@pytest.mark.parametrize("name", ["seed", "imagenet"])
def test_shipped_configs_by_name_and_path(name):
    assert config_path(name) == str(REPO / "configs" / f"{name}.yaml")
    assert read_config(name) == read_config(str(REPO / "configs" / f"{name}.yaml"))


@pytest.mark.parametrize("name", ["seed", "imagenet"])
def test_shipped_configs_name_no_input_or_output(name):
    """A shipped config is a set of settings; the data it converts is the user's --input/--output."""
    config = read_config(name)
    assert "path" not in config.get("input", {}) and "path" not in config.get("output", {})


def test_repo_configs_build():
    seed = spec_from(read_config("seed"), *IO)
    assert (seed.image.decoder, seed.image.alpha, seed.image.normalize, seed.image.encoding) == (
        "imread", "drop", "unit", "raw")
    assert (seed.features.image, seed.features.label, seed.features.label_text) == ("train/image", "train/label", "")
    imagenet = parse_arguments(["--config=imagenet", *IO])
    assert imagenet.spec.image.encoding == "jpeg" and imagenet.spec.output.drop_duplicates is True
    assert imagenet.config_file == "imagenet"


def test_beam_args_from_config():
    config = {"beam": {"runner": "DirectRunner", "direct_num_workers": 2, "save_main_session": True,
                       "use_public_ips": False}}
    assert beam_args_from_config(config) == ["--runner=DirectRunner", "--direct_num_workers=2",
                                             "--save_main_session", "--no_use_public_ips"]
    assert beam_args_from_config({}) == [] and beam_args_from_config({"beam": None}) == []
    assert beam_args_from_config({"beam": {"experiments": ["a", "b"]}}) == ["--experiments=a", "--experiments=b"]


def test_parse_arguments_passes_beam_flags_through(tmp_path):
    config = write_config(tmp_path, "beam: {runner: DirectRunner, direct_num_workers: 3}\noutput: {num_shards: 2}\n")
    parsed = parse_arguments([f"--config={config}", *IO, "--direct_num_workers=2", "--convert_processes=auto"])
    options = parsed.options.get_all_options()
    assert options["runner"] == "DirectRunner"
    assert options["direct_num_workers"] == 2  # the command line overrides the config's beam: section
    assert parsed.spec.output.num_shards == 2 and parsed.config_file == config


@pytest.mark.parametrize("argv,message", [
    ([*IO, "--num_shard=4"], "unknown option --num_shard on the command line; did you mean --num_shards?"),
    ([*IO, "--max_eror_fraction=1"], "did you mean --max_error_fraction?"),
    ([*IO, "--direct_runing_mode=in_memory"], "did you mean --direct_running_mode?"),
    ([*IO, "-x"], "unknown option -x"),
    ([*IO, "stray"], "unknown option stray"),
    ([*IO, "--num_shards=abc"], "argument --num_shards: invalid int value: 'abc'"),
    ([*IO, "--direct_num_workers=two"], "argument --direct_num_workers: invalid int value"),
    ([*IO, "--overwrite=yes"], "argument --overwrite"),
    ([*IO, "--compression=zip"], "compression must be one of none, gzip"),
    ([*IO, "--max_error_fraction=2"], r"max_error_fraction must be in \[0, 1\]"),
    ([*IO, "--input_kind=tsv"], "input kind must be one of"),
    ([*IO, "--config"], "argument --config: expected one argument"),
    # an empty entry was dropped, moving every later class's id (dog became 1, not 2)
    ([*IO, "--class_names=cat,,dog"], "argument --class_names: an empty entry in 'cat,,dog'"),
    ([*IO, "--split_names=,train,val"], "argument --split_names: an empty entry"),
    ([*IO, "--split_ratios=0.8,x"], "argument --split_ratios: '0.8,x' is not a comma-separated list of float"),
])
def test_parse_arguments_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_arguments(argv)


def test_a_typo_in_the_configs_beam_section_is_a_usage_error(tmp_path):
    config = write_config(tmp_path, "beam: {direct_num_wokers: 2}\n")
    with pytest.raises(UsageError, match=r"--direct_num_wokers on the config's beam: section .*"
                                         r"did you mean --direct_num_workers\?"):
        parse_arguments([f"--config={config}", *IO])


# ----------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv,message", [
    (["--output=o"], "--input (or input.path in the config) is required"),
    ([*IO, "--num_shard=4"], "did you mean --num_shards?"),
    ([*IO, "--resize_mode=squash"], "resize_mode must be one of"),
    (["--input=/nonexistent/imgrec-input", "--output=o"], "no such folder"),
    (["--input=/nonexistent/list.csv", "--output=o"], "no such manifest"),
    ([f"--input={__file__}", "--output=o"], "not a folder (a manifest ends in .csv, .jsonl or .json, or give "
                                            "--input_kind=csv or jsonl)"),
    ([f"--input={__file__}/IN", "--output=o"], f"--input={__file__}/IN: no such folder"),
    (["--input=/nonexistent/cats/*.jpg", "--output=o"],
     "--input=/nonexistent/cats/*.jpg: no such folder /nonexistent/cats"),
    (["--input=/nonexistent/a.jpg", "--input_kind=glob", "--output=o"], "--input=/nonexistent/a.jpg: no such file"),
    ([*IO, "--runner=DaskRunner"], "--runner=DaskRunner is not supported"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    from pipeline.run import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imgrec: error: ") and message in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_help_groups_everyday_flags_with_defaults_and_help_all_lists_every_flag():
    everyday, every = help_text(all_flags=False), help_text(all_flags=True)
    assert all(f"--{flag.name} " in every for flag in FLAGS)
    assert {f"--{flag.name} " in everyday for flag in FLAGS} == {True, False}
    text = " ".join(everyday.split())
    assert text.startswith("usage: imgrec run") and "3 output locked" in text and "passes straight to Beam" in text
    for shown in ("input (", "output (", "image (", "splits (", "runner (", "--config CONFIG", "(default: 224)",
                  "(default: 0)", "(default: train,val,test)", "(default: 0.7,0.2,0.1)"):
        assert shown in text, shown
    assert max(len(group.splitlines()) for group in everyday.split("\n\n")) <= 24  # a screen per group


def test_the_configuration_reference_lists_every_flag_with_its_default():
    """docs/configuration.md's table is written by hand: a new flag or a changed default must reach it."""
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip()
            for line in (REPO / "docs" / "configuration.md").read_text().splitlines() if line.startswith("| `--")}
    defaults = flag_defaults()
    for flag in FLAGS:
        assert f"`--{flag.name}`" in rows, flag.name
        if flag.name in defaults:
            assert rows[f"`--{flag.name}`"] == f"`{defaults[flag.name]}`", flag.name



def test_the_configuration_reference_names_every_no_twin_and_every_config_key():
    """configuration.md named four of the seven --no_ twins, gave no word of `input: extensions`,
    and did not say that `output: target_shard_bytes` (the key of --target_shard_mb) is in bytes."""
    text = (REPO / "docs" / "configuration.md").read_text()
    for flag in FLAGS:
        if flag.type is None:
            assert f"`--no_{flag.name}`" in text, flag.name
    for section in (InputSpec, OutputSpec, ImageSpec, SplitSpec, AnnotationSpec):
        name = {InputSpec: "input", OutputSpec: "output", ImageSpec: "image", SplitSpec: "splits",
                AnnotationSpec: "annotations"}[section]
        for field in dataclasses.fields(section):
            assert f"`{name}: {field.name}`" in text, (name, field.name)
    row = next(line for line in text.splitlines() if line.startswith("| `--target_shard_mb`"))
    assert "`output: target_shard_bytes`" in row and "bytes" in row.split("|")[4], row

def test_exit_codes():
    assert (UsageError.exit_code, RunFailed.exit_code, OutputLocked.exit_code, ImgrecError.exit_code) == (2, 1, 3, 1)
    assert all(issubclass(cls, ImgrecError) for cls in (UsageError, RunFailed, OutputLocked))
