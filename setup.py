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
    packages=[*find_packages(include=["pipeline", "pipeline.*", "transforms", "transforms.*"]), "imgrec_configs"],
    # configs/ ships as the imgrec_configs package, so `--config=local` names configs/local.yaml anywhere.
    package_dir={"imgrec_configs": "configs"},
    package_data={"imgrec_configs": ["*.yaml"]},
    entry_points={"console_scripts": ["imgrec = pipeline.cli:entry_point"]},
    install_requires=[
        "apache-beam>=2.60,<3",
        "crc32c>=2.4",  # TFRecord checksums (transforms/tfrecord.py)
        "tensorflow-cpu>=2.16,<3",
        # imdecodeWithMetadata (EXIF orientation without a second decode) needs OpenCV 5.
        "opencv-python-headless>=5.0,<6",
        "numpy>=1.26,<3",
        "pillow>=10",  # reads image headers without decoding (transforms/image_header.py)
        "pyyaml>=6,<7",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-timeout>=2.3", "psutil>=5.9", "scikit-image>=0.22", "tifffile>=2023.1",
                 "tensorflow-datasets>=4.9", "ruff>=0.6", "moto[server]>=5"],
        "gcp": ["apache-beam[gcp]>=2.60,<3"],
        "aws": ["apache-beam[aws]>=2.60,<3"],
        "tfds": ["tensorflow-datasets>=4.9"],
    },
)
