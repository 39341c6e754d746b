# One image for the app and the Ray nodes. Targets:
#   cpu (default): torch from the index in TORCH_INDEX_URL (set it to a CPU wheel index to keep the image small)
#   gpu:           the same plus flash-attn, the `.[gpu]` extra (needs a CUDA build of torch; flash-attn's
#                  installer fetches a prebuilt wheel matching torch/CUDA/Python or compiles with nvcc)
# The settings are the ATTNBOARD_* variables of README.md; docker-compose.yml sets them.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS cpu
ARG TORCH_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 RAY_USAGE_STATS_ENABLED=0 \
    PYTHONPATH=/srv/attnboard
# PYTHONPATH: the app (and every Ray worker process) imports app/ and worker/ from this source tree, where
# migrations/ sits beside app/ as app.db expects; the installed copy provides the dependencies and the CLI.
RUN apt-get update && apt-get install -y --no-install-recommends curl procps && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/attnboard
COPY pyproject.toml README.md ./
COPY app ./app
COPY worker ./worker
COPY migrations ./migrations
COPY alembic.ini ./
RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0; fi \
 && pip install .
RUN useradd --create-home --uid 1000 attnboard && mkdir -p /data /models && chown attnboard /data /models
USER attnboard
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --retries=5 CMD curl -fsS http://127.0.0.1:8000/api/health || exit 1
CMD ["attnboard", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM cpu AS gpu
USER root
RUN pip install ninja packaging && pip install --no-build-isolation ".[gpu]"
USER attnboard
