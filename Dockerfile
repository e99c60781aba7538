# imgrec worker image: Beam's Python SDK image with the imgrec package (pipeline/, transforms/, configs/)
# and its dependencies installed at the versions of requirements.lock (what CI tested), so workers
# need no staged sources.
#
#   docker build -t IMAGE .
#   Dataflow: --sdk_container_image=IMAGE
#   Flink / Spark job server: --environment_type=DOCKER --environment_config=IMAGE
#
# The tag must equal the apache-beam version that launches the pipeline (the lock's; 2.78.0),
# and Python must match too (3.11). The base image's ENTRYPOINT, /opt/apache/beam/boot, starts
# the SDK worker and is kept as is.
ARG BEAM_VERSION=2.78.0
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}
ARG BEAM_VERSION

COPY requirements.lock setup.py /opt/imgrec/
COPY pipeline/ /opt/imgrec/pipeline/
COPY transforms/ /opt/imgrec/transforms/
COPY configs/ /opt/imgrec/configs/

# The lock constrains every package imgrec (with the gcp and aws extras) needs to its tested
# version; the check fails the build if that ever replaced the base image's Beam.
RUN pip install --no-cache-dir -c /opt/imgrec/requirements.lock "/opt/imgrec[gcp,aws]" \
    && python -c "import apache_beam, cv2, tensorflow, pipeline.run, transforms.write.write_shards, imgrec.configs; \
assert apache_beam.__version__ == '${BEAM_VERSION}', apache_beam.__version__"
