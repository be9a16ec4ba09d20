# Parley gateway image. CPU by default; a CUDA variant by build argument:
#
#   docker build -t parley:cpu .
#   docker build -t parley:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#
# The engine weights ship in the repository (engine/), so COPY engine bakes them in:
# nothing is downloaded at run time.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# libopus for gateway/opus.py; g++ for the int8 kernel (built below); python3.11 only where the base image lacks it (the CUDA images).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libopus0 ca-certificates g++ \
    && if ! command -v python3.11 >/dev/null; then \
         apt-get install -y --no-install-recommends python3.11 python3.11-venv; fi \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN useradd --create-home --uid 10001 parley
WORKDIR /app
RUN pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0
COPY pyproject.toml README.md LICENSE ./
COPY gateway gateway
COPY engine engine
COPY web web
COPY static static
RUN pip install -e .
# Parley's int8 CPU kernel, compiled into the image (engine/cpu_kernels.py)
ENV PARLEY_KERNEL_DIR=/opt/parley-kernels
RUN python -m engine.cpu_kernels
USER parley
ENV PARLEY_HOST=0.0.0.0 PARLEY_PORT=8080
EXPOSE 8080
# SIGTERM drains (see README, "Running it for real"); the orchestrator's grace period must
# exceed PARLEY_DRAIN_TIMEOUT_S.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PARLEY_PORT\"]}/livez', timeout=2)"
CMD ["parley", "serve"]
