# Parley gateway, CPU build. (A CUDA variant arrives with the engine runtime.)
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends libopus0 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 parley
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY gateway gateway
COPY engine engine
COPY web web
COPY static static
# PIP_EXTRA_ARGS: point pip at a CPU-only torch wheel index to keep the image small.
ARG PIP_EXTRA_ARGS=""
RUN pip install --no-cache-dir $PIP_EXTRA_ARGS torch==2.13.0 \
    && pip install --no-cache-dir -e .
USER parley
ENV PARLEY_HOST=0.0.0.0 PARLEY_PORT=8080
EXPOSE 8080
EXPOSE 40000-40100/udp
CMD ["parley", "serve"]
