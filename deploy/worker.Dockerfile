# The GPU work pool's image (issue 47): a PyTorch CUDA image, quantgate[gpu] from the offline wheelhouse.
# The base image brings Python, CUDA and its torch build; the wheelhouse brings only what it lacks
# (requirements/worker-gpu.lock, resolved over the base's `pip freeze` in requirements/worker-gpu-base.txt:
# scripts/wheelhouse.sh lock with BASE, then build; see flows/README.md). Build:
#   docker build -f deploy/worker.Dockerfile --build-arg WHEELHOUSE=wheelhouse -t quantgate-worker .
# Evaluation data, checkpoints and caches are mounted, not baked: /data (suites' data sets),
# /models (source checkpoints), /cache (QUANTGATE cache), each a volume of the work pool.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}
ARG WHEELHOUSE=wheelhouse
COPY scripts/wheelhouse.sh /opt/quantgate/scripts/wheelhouse.sh
COPY ${WHEELHOUSE} /opt/wheelhouse
# no index reached: only the wheelhouse, whose wheels the lock's hashes chose, into the image's own
# Python ("-"), where its torch stays
RUN cd /opt/wheelhouse && sha256sum --quiet -c SHA256SUMS && cd /opt/quantgate && \
    scripts/wheelhouse.sh install /opt/wheelhouse - gpu && rm -rf /opt/wheelhouse
ENV HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/cache/hf QUANTGATE_DATA=/data QUANTGATE_CACHE=/cache
VOLUME ["/data", "/models", "/cache"]
WORKDIR /work
ENTRYPOINT []
CMD ["quantgate", "--help"]
