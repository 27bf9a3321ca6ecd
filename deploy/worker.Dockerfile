# The GPU work pool's image (issue 47): CUDA runtime, quantgate[gpu] from the offline wheelhouse.
# Build (the wheelhouse first, from a GPU lock: scripts/wheelhouse.sh lock/build, see flows/README.md):
#   docker build -f deploy/worker.Dockerfile --build-arg WHEELHOUSE=wheelhouse -t quantgate-worker .
# Evaluation data, checkpoints and caches are mounted, not baked: /data (suites' data sets),
# /models (source checkpoints), /cache (QUANTGATE cache), each a volume of the work pool.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
FROM ${CUDA_IMAGE}
ARG WHEELHOUSE=wheelhouse
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      software-properties-common && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.11 python3.11-venv && \
    rm -rf /var/lib/apt/lists/*
COPY scripts/wheelhouse.sh /opt/quantgate/scripts/wheelhouse.sh
COPY ${WHEELHOUSE} /opt/wheelhouse
# no index reached: only the wheelhouse, whose wheels the lock's hashes chose
RUN cd /opt/quantgate && PYTHON=3.11 scripts/wheelhouse.sh install /opt/wheelhouse /opt/venv gpu && rm -rf /opt/wheelhouse
ENV PATH=/opt/venv/bin:$PATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/cache/hf
VOLUME ["/data", "/models", "/cache"]
WORKDIR /work
ENTRYPOINT []
CMD ["quantgate", "--help"]
