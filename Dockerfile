# esfuse daemon image: mounts one docs index at /mnt/docs in the foreground.
#   docker build -t esfuse .
#   docker run --rm --device /dev/fuse --cap-add SYS_ADMIN \
#     --security-opt apparmor:unconfined \
#     -e ESFUSE_ES=http://es:9200 -e ESFUSE_INDEX=docs esfuse
# The packages are the ones scripts/setup installs for the same purpose.

FROM python:3.11.10-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libfuse3-dev=3.14.0-4 pkg-config=1.8.1-1 gcc=4:12.2.0-3 patch=2.7.6-7+deb12u1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 builder \
    && install -d -o builder /opt/esfuse
USER 1000
WORKDIR /home/builder/src
COPY --chown=builder pyproject.toml README.md ./
COPY --chown=builder esfuse ./esfuse
COPY --chown=builder scripts/build-pyfuse3 ./scripts/
COPY --chown=builder scripts/pyfuse3.d ./scripts/pyfuse3.d
# pip 25.2 writes launchers that do not import `re` (see scripts/setup).
RUN python -m venv /opt/esfuse \
    && /opt/esfuse/bin/pip install --no-cache-dir pip==25.3 \
    && /opt/esfuse/bin/pip install --no-cache-dir \
        "$(ESFUSE_WHEELS=/tmp/wheels scripts/build-pyfuse3 /opt/esfuse/bin/python)" \
    && /opt/esfuse/bin/pip install --no-cache-dir .

FROM python:3.11.10-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3=3.14.0-4 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /mnt/docs
COPY --from=build /opt/esfuse /opt/esfuse
ENV PATH=/opt/esfuse/bin:$PATH
# Mounting needs CAP_SYS_ADMIN and /dev/fuse: the daemon runs as root in its container.
ENTRYPOINT ["esfuse", "mount", "--foreground", "/mnt/docs"]
