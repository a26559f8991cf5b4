# Minimal image for the extender (the manifests issue makes this multi-stage, pinned, non-root).
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY extender ./extender
COPY gpu_sharing ./gpu_sharing
COPY raybridge ./raybridge
RUN pip install --no-cache-dir . && useradd --uid 10001 tessera
USER 10001
ENTRYPOINT ["tessera"]
CMD ["simulate", "--plot", "none"]
