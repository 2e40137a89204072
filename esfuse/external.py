"""External files: listed at ingest, their bytes fetched from elsewhere on first read.

A manifest (``esfuse ingest --manifest FILE.json``) lists files whose bytes live
outside Elasticsearch, like OpenAPI specs kept in object storage::

    [{"path": "api/openapi.json", "url": "https://example.com/openapi.json",
      "size": 48213, "mtime": 1700000000}]

They appear in the tree with their declared size and mtime; the daemon fetches
them (http, https, file) on the first read and caches them like any content.
A fetch that fails, or returns another size than declared, is an error (EIO for
the reader) rather than bytes that disagree with `st_size`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import trio

from esfuse.access import Rules
from esfuse.cache import Loader
from esfuse.errors import EsfuseError, StoreError
from esfuse.tree import FileRecord, Tree
from esfuse.userfiles import read_json

log = logging.getLogger(__name__)

PREFIX = "ext-"
SCHEMES = ("http", "https", "file")


def external_digest(url: str, size: int, mtime_ns: int) -> str:
    """A stand-in digest: changes when the declared file changes, so its inode does too."""
    return PREFIX + hashlib.sha256(f"{url}\0{size}\0{mtime_ns}".encode()).hexdigest()


def is_external(digest: str) -> bool:
    return digest.startswith(PREFIX)


def _mtime_ns(value: object, where: str) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value * 1_000_000_000)
    if isinstance(value, str):
        try:
            return int(datetime.fromisoformat(value).timestamp() * 1_000_000_000)
        except ValueError:
            pass
    raise EsfuseError(f"{where}: 'mtime' must be seconds since the epoch or an ISO 8601 date")


def load_manifest(path: Path, rules: Rules) -> list[FileRecord]:
    entries = read_json(path, "manifest")
    if not isinstance(entries, list):
        raise EsfuseError(f"manifest {path} must be a JSON list of entries")
    records = []
    for n, entry in enumerate(entries):
        where = f"{path}: entry {n + 1}"
        if not isinstance(entry, dict):
            raise EsfuseError(f"{where} must be an object")
        rel, url, size = entry.get("path"), entry.get("url"), entry.get("size")
        if not isinstance(rel, str) or not rel.strip("/"):
            raise EsfuseError(f"{where}: 'path' must be a relative path")
        if not isinstance(url, str) or urlparse(url).scheme not in SCHEMES:
            scheme = urlparse(url).scheme if isinstance(url, str) else None
            hint = " (s3 needs an esfuse built with S3 support)" if scheme == "s3" else ""
            raise EsfuseError(f"{where}: 'url' must be http, https or file{hint}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise EsfuseError(f"{where}: 'size' must be a byte count")
        mtime = _mtime_ns(entry.get("mtime", 0), where)
        rel = rel.strip("/")
        records.append(
            FileRecord(
                rel, size, mtime, external_digest(url, size, mtime), rules.access_of(rel), url
            )
        )
    return records


class Fetcher:
    """Gets external bytes; knows the URLs of every tree it has been shown."""

    def __init__(self, tree: Tree, timeout: float) -> None:
        self.timeout = timeout
        # Made at the first http(s) fetch: an httpx client loads the CA bundle, 26 ms of
        # every mount-ready, and most trees have no external files.
        self._client: httpx.AsyncClient | None = None
        self.known = dict(tree.externals)

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()

    def swap(self, tree: Tree) -> None:
        # Old URLs stay: handles opened on the replaced tree may still read them.
        self.known.update(tree.externals)

    async def fetch(self, digest: str) -> bytes:
        if digest not in self.known:
            raise StoreError(f"no URL known for external content {digest}")
        url, size = self.known[digest]
        try:
            data = await self._get(url)
        except (OSError, httpx.HTTPError) as e:
            raise StoreError(f"fetching {url}: {e}") from None
        if len(data) != size:
            raise StoreError(f"fetching {url}: got {len(data)} bytes, the manifest says {size}")
        return data

    async def _get(self, url: str) -> bytes:
        parsed = urlparse(url)
        if parsed.scheme == "file":
            return await trio.Path(unquote(parsed.path)).read_bytes()
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        response = await self._client.get(url, follow_redirects=True)
        response.raise_for_status()
        return response.content


def split_loader(fetch_chunks: Loader, fetcher: Fetcher, chunk_size: int) -> Loader:
    """A chunk loader that sends external digests to `fetcher`, the rest to Elasticsearch."""

    async def load(keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], bytes]:
        inside = [k for k in keys if not is_external(k[0])]
        found = await fetch_chunks(inside) if inside else {}
        for digest in dict.fromkeys(k[0] for k in keys if is_external(k[0])):
            data = await fetcher.fetch(digest)
            for key in keys:
                if key[0] == digest:
                    found[key] = data[key[1] * chunk_size : (key[1] + 1) * chunk_size]
        return found

    return load
