# esfuse daemon image. Run with FUSE access, e.g.
#   docker run --device /dev/fuse --cap-add SYS_ADMIN -e ESFUSE_ES=http://es:9200 esfuse
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3 libfuse3-dev pkg-config gcc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY esfuse ./esfuse
RUN pip install --no-cache-dir . && mkdir -p /mnt/docs
ENTRYPOINT ["esfuse", "mount", "--foreground", "/mnt/docs"]
