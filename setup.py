"""imgrec: image datasets to sharded TFRecords with Apache Beam."""
import pathlib
import re

from setuptools import find_packages, setup

# The version lives in pipeline/__init__.py (metadata.json records it); read it, don't repeat it.
VERSION = re.search(r'__version__ = "([^"]+)"',
                    (pathlib.Path(__file__).parent / "pipeline" / "__init__.py").read_text()).group(1)

setup(
    name="imgrec",
    version=VERSION,
    description="Apache Beam pipeline that turns image files + labels into sharded TFRecords.",
    python_requires=">=3.10",
    packages=[*find_packages(include=["imgrec", "pipeline", "pipeline.*", "transforms", "transforms.*"]),
              "imgrec.configs"],
    # configs/ ships as imgrec.configs, so `--config=seed` names configs/seed.yaml anywhere.
    package_dir={"imgrec.configs": "configs"},
    package_data={"imgrec.configs": ["*.yaml"]},
    entry_points={"console_scripts": ["imgrec = pipeline.cli:entry_point"]},
    # Lower bounds: the oldest releases `make test-oldest` passed on (OpenCV 5 needs numpy 2, which
    # rules out older Beam and TensorFlow). Upper bounds: the next major version, not the newest
    # tested one (requirements.lock pins that): `make test-newest` runs the newest releases inside
    # these ranges at every landing, so a release that breaks imgrec is caught and named.
    install_requires=[
        "apache-beam>=2.61,<3",
        "crc32c>=2.4",  # TFRecord checksums (transforms/write/tfrecord.py)
        "tensorflow-cpu>=2.18,<3",
        # 5.0: the oldest release `make test-oldest` passed on (imgrec is not tested on OpenCV 4).
        "opencv-python-headless>=5.0,<6",
        "numpy>=2.0,<3",
        "pillow>=10",  # reads image headers without decoding (transforms/images/image_header.py)
        "pyyaml>=6,<7",
        "ijson>=3.2,<4",  # COCO annotation files streamed, one element at a time (transforms/inputs/coco.py)
        "defusedxml>=0.7,<1",  # Pascal VOC XML without DTDs or entities (transforms/inputs/voc.py)
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "psutil>=5.9", "scikit-image>=0.22",
                 "tifffile>=2023.1", "tensorflow-datasets>=4.9.6", "ruff>=0.6", "moto[server]>=5",
                 "pycocotools>=2.0.8"],  # the reference reader of COCO annotations in tests
        # Beam stages --setup_file with `python -m build --no-isolation` (setuptools from this venv).
        "gcp": ["apache-beam[gcp]>=2.61,<3", "build>=1", "setuptools>=68"],
        "aws": ["apache-beam[aws]>=2.61,<3"],
        "tfds": ["tensorflow-datasets>=4.9.6"],
    },
)
