# imgrec worker image: Beam's Python SDK image with the imgrec package (pipeline/, transforms/, configs/)
# and its dependencies installed, so workers need no staged sources.
#
#   docker build -t IMAGE .
#   Dataflow: --sdk_container_image=IMAGE
#   Flink / Spark job server: --environment_type=DOCKER --environment_config=IMAGE
#
# The tag must equal the apache-beam version that launches the pipeline (the venv's; 2.77.0),
# and Python must match too (3.11). The base image's ENTRYPOINT, /opt/apache/beam/boot, starts
# the SDK worker and is kept as is.
ARG BEAM_VERSION=2.77.0
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}
ARG BEAM_VERSION

COPY setup.py /opt/imgrec/setup.py
COPY pipeline/ /opt/imgrec/pipeline/
COPY transforms/ /opt/imgrec/transforms/
COPY configs/ /opt/imgrec/configs/

# setup.py asks for apache-beam>=2.60,<3, which the base image's Beam satisfies, so pip keeps it;
# the check fails the build if a dependency ever made pip replace it.
RUN pip install --no-cache-dir /opt/imgrec \
    && python -c "import apache_beam, cv2, tensorflow, pipeline.run, transforms.write_shards, imgrec_configs; \
assert apache_beam.__version__ == '${BEAM_VERSION}', apache_beam.__version__"
