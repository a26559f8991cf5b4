# syntax=docker/dockerfile:1
# One image, entrypoint `tessera` (serve, agent, bridge, inspect, simulate; tessera-launch beside it).
#
#   docker build -t ghcr.io/tessera-sched/tessera:0.1.0 .                  # extender, agent, bridge: no ray/torch
#   docker build --target ray -t ghcr.io/tessera-sched/tessera:0.1.0-ray . # Ray pods: tessera[ray]
#
# With no registry (the tests' real nodes): scripts/image-build.sh [--target ray] builds either target from Debian packages.
#
# Multi-stage: the build stages hold pip's caches and the source; the final stages get only the
# virtual environment. Dependencies are pinned by docker/constraints*.txt (every package, from a
# clean install of this version); the base image by its full tag (pin its digest where your
# registry policy asks for it: `docker buildx imagetools inspect python:3.11.7-slim-bookworm`).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tessera
ENV PATH=/opt/tessera/bin:$PATH
WORKDIR /src
COPY docker/constraints.txt docker/constraints-ray.txt docker/
COPY setup.cfg pyproject.toml README.md ./
COPY extender ./extender
COPY gpu_sharing ./gpu_sharing
COPY raybridge ./raybridge
COPY tessera_contract ./tessera_contract
# the nvml extra: the agent's NVML backend. Not the plot extra (matplotlib): `tessera simulate` here prints its
# tables and skips the PNG
RUN pip install --constraint docker/constraints.txt '.[nvml]'

FROM build AS build-ray
RUN pip install --constraint docker/constraints.txt --constraint docker/constraints-ray.txt '.[ray]' 'ray[default]==2.60.0'

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 tessera \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tessera
ENV PATH=/opt/tessera/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /tmp

# tessera[ray]: the Ray head/worker pods and each job's driver (KubeRay replaces the entrypoint with `ray start`).
# Ports: a Ray job driver's metrics (9600); Ray's own are Ray's.
FROM runtime AS ray
COPY --from=build-ray /opt/tessera /opt/tessera
USER 10001:10001
EXPOSE 9600
ENTRYPOINT ["tessera"]
CMD ["--help"]

# The default target: extender, node agent, device plugin and the Ray bridge, without ray and torch (the bridge
# talks to Kubernetes only, and holds pods: create/delete: the fewer libraries beside that token the better).
# Ports: the verbs (8888), the admin port (8889), the probes (8890), the agent's report and metrics (9400), the
# device plugin's metrics (9401), the bridge's (9500).
FROM runtime AS tessera
COPY --from=build /opt/tessera /opt/tessera
USER 10001:10001
EXPOSE 8888 8889 8890 9400 9401 9500
ENTRYPOINT ["tessera"]
CMD ["--help"]
