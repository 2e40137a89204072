"""Everything that knows how a docs index is laid out in Elasticsearch.

One docs index NAME is three Elasticsearch indices:

- ``NAME-chunks``: file contents, content-addressed. Document ``<sha256>-<n>``
  holds bytes ``n*chunk_size`` to ``(n+1)*chunk_size`` of every file with that
  digest, base64 in a ``binary`` field (stored, not indexed). Content
  addressing makes publication safe: a new version of a file is new documents,
  so readers of the old tree keep reading the old bytes.
- ``NAME-files``: one document per (path, digest) with the file's *whole* text
  under a trigram analyzer, so a coarse search never loses a match at a chunk
  boundary. The text is indexed but kept out of ``_source``.
- ``NAME-meta``: the compressed tree document in parts (``tree-<v>-<n>``) and
  the pointer ``current`` naming the published version; writing the pointer is
  the atomic step of a publication.

Every failure of the cluster surfaces as a `StoreError` with a one-line reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import elasticsearch
from elasticsearch import AsyncElasticsearch

from esfuse import tree as treedoc
from esfuse.access import EVERYTHING, Viewer
from esfuse.errors import StoreError, TreeError
from esfuse.treecache import TreeCache

log = logging.getLogger(__name__)

CHUNK_SIZE = 1 << 20
TREE_PART_SIZE = 4 << 20
# The whole text of a file goes into one indexed field; past this size it is not
# indexed (and the grep planner must treat the file as a candidate for everything).
TEXT_LIMIT = 16 << 20
SEARCH_PAGE = 10_000
# Content chunks come by mget up to this many, else by a search. mget gets each
# document on its own, fastest for a few (one: 1.6 ms against 2.5); a search
# fetches its hits in index order, which decompresses each block of stored
# documents once: all of tldr (37,929 chunks) in batches of 256 took 1.46 s
# against 1.65 by mget, and in batches of 1,024 0.78 s against 1.36. A search
# is also the only one of the two that can filter by who may see a document.
MGET_MAX = 32
# The first page of a search that stops when it counts more hits than it wants:
# small, because a search that stops throws its page away, and most selective
# ones end within it.
FIRST_PAGE = 100
POINTER_ID = "current"
LOCK_ID = "ingest-lock"

ChunkKey = tuple[str, int]

# Who may read a document: public, or any of these groups (see esfuse.access).
_ACCESS = {"public": {"type": "boolean"}, "groups": {"type": "keyword"}}
_INDEX_SETTINGS = {"number_of_shards": 1, "auto_expand_replicas": "0-1"}

MAPPINGS: dict[str, dict[str, Any]] = {
    "chunks": {
        "settings": _INDEX_SETTINGS,
        "mappings": {"dynamic": "strict", "properties": {"data": {"type": "binary"}, **_ACCESS}},
    },
    "files": {
        "settings": {
            **_INDEX_SETTINGS,
            "analysis": {
                "tokenizer": {
                    "trigram": {"type": "ngram", "min_gram": 3, "max_gram": 3, "token_chars": []}
                },
                "analyzer": {
                    "trigram": {"type": "custom", "tokenizer": "trigram", "filter": ["lowercase"]}
                },
            },
        },
        "mappings": {
            "dynamic": "strict",
            "_source": {"excludes": ["text"]},
            "properties": {
                "path": {"type": "keyword"},
                "digest": {"type": "keyword"},
                "size": {"type": "long"},
                "indexed": {"type": "boolean"},
                **_ACCESS,
                "text": {"type": "text", "analyzer": "trigram", "norms": False},
            },
        },
    },
    "meta": {
        "settings": _INDEX_SETTINGS,
        # Tree parts and the pointer are only ever read by id.
        "mappings": {"dynamic": False, "properties": {}},
    },
}


@dataclass(frozen=True, slots=True)
class Pointer:
    """The published tree version and what a reader needs to load and use it."""

    version: int
    parts: int
    sha256: str
    chunk_size: int
    files: int
    bytes: int
    published: float


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def chunk_id(key: ChunkKey) -> str:
    return f"{key[0]}-{key[1]}"


def file_doc_id(path: str, digest: str) -> str:
    return hashlib.sha1(f"{path}\0{digest}".encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Connection:
    """How to reach the cluster: URL or Elastic Cloud id, credentials, TLS trust."""

    url: str = "http://127.0.0.1:9200"
    timeout: float = 10.0
    api_key: str | None = None
    ca_certs: str | None = None
    cloud_id: str | None = None

    @property
    def where(self) -> str:
        return f"cloud id {self.cloud_id.split(':')[0]}" if self.cloud_id else self.url


def connect(conn: Connection) -> AsyncElasticsearch:
    """An async client for trio: httpx speaks trio natively, aiohttp does not.

    Nothing is sent yet; a URL, cloud id or CA path the client cannot take is a
    StoreError here."""
    try:
        return AsyncElasticsearch(
            None if conn.cloud_id else conn.url,
            cloud_id=conn.cloud_id,
            api_key=conn.api_key,
            ca_certs=conn.ca_certs,
            node_class="httpxasync",
            # httpx asks for gzip by default; compressing base64 content on a nearby
            # cluster costs more CPU than it saves (a profile of a cold `grep -r`
            # spent 15% of the daemon's time in GZipDecoder.decode).
            headers={"accept-encoding": "identity"},
            request_timeout=conn.timeout,
            max_retries=2,
            retry_on_timeout=True,
        )
    except ValueError as e:
        raise StoreError(f"cannot use Elasticsearch at {conn.where}: {e}") from None


@contextmanager
def backend(what: str, url: str = "") -> Iterator[None]:
    """Turn any client failure into a StoreError saying what we were doing."""
    try:
        yield
    except elasticsearch.ApiError as e:
        raise StoreError(f"{what}: Elasticsearch answered {e.meta.status}: {_reason(e)}") from None
    except elasticsearch.TransportError as e:
        where = f" at {url}" if url else ""
        raise StoreError(f"{what}: cannot reach Elasticsearch{where} ({e.message})") from None


def _reason(e: elasticsearch.ApiError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error")
    if isinstance(err, dict):
        return f"{err.get('type')}: {err.get('reason')}"
    return str(err or e.message)


class Store:
    """Reads and writes one docs index."""

    def __init__(
        self, client: AsyncElasticsearch, name: str, url: str = "", viewer: Viewer = EVERYTHING
    ) -> None:
        self.client = client
        self.name = name
        self.url = url
        # Every read for a mount carries this filter, so that Elasticsearch itself
        # withholds what the mount may not see (the tree is pruned as well).
        self.viewer = viewer
        # Reads made for a mount, by kind, and their latest durations: for `status`.
        self.requests: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=1024)

    def index(self, kind: str) -> str:
        return f"{self.name}-{kind}"

    def _backend(self, what: str) -> Any:
        return backend(what, self.url)

    @contextmanager
    def _read(self, kind: str, what: str) -> Iterator[None]:
        """A counted, timed read for the mount, failing as a StoreError."""
        self.requests[kind] += 1
        started = time.monotonic()
        try:
            with self._backend(what):
                yield
        finally:
            self.latencies.append(time.monotonic() - started)

    def latency_ms(self) -> dict[str, float]:
        """Percentiles of the recent reads' durations, in milliseconds."""
        ordered = sorted(self.latencies)
        if not ordered:
            return {}
        return {
            f"p{q}": round(1000 * ordered[min(len(ordered) - 1, len(ordered) * q // 100)], 2)
            for q in (50, 90, 99)
        }

    # -- reading ---------------------------------------------------------------

    async def ping(self) -> None:
        with self._backend("connecting"):
            await self.client.info()

    async def pointer(self) -> Pointer | None:
        """The published pointer, or None when nothing was ever published."""
        with self._backend(f"reading the tree pointer of {self.name!r}"):
            try:
                resp = await self.client.get(index=self.index("meta"), id=POINTER_ID)
            except elasticsearch.NotFoundError:
                return None
        src = resp["_source"]
        try:
            return Pointer(**{k: src[k] for k in Pointer.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise StoreError(f"tree pointer of {self.name!r} is corrupt: {e}") from None

    async def current(self) -> Pointer:
        """The published pointer; a StoreError when nothing was ever published."""
        pointer = await self.pointer()
        if pointer is None:
            raise StoreError(
                f"index {self.name!r} has no published tree (run `esfuse ingest` first)"
            )
        return pointer

    async def tree_document(self, pointer: Pointer | None = None) -> tuple[Pointer, bytes]:
        """The published tree document, checked against its pointer's checksum."""
        if pointer is None:
            pointer = await self.current()
        ids = [f"tree-{pointer.version}-{n}" for n in range(pointer.parts)]
        with self._backend(f"reading tree version {pointer.version}"):
            resp = await self.client.mget(index=self.index("meta"), ids=ids)
        try:
            blob = b"".join(_decoded(doc, "data", "tree part") for doc in resp["docs"])
        except StoreError as e:
            raise TreeError(str(e)) from None  # a damaged tree, not a failing cluster
        if hashlib.sha256(blob).hexdigest() != pointer.sha256:
            raise TreeError(f"tree version {pointer.version} of {self.name!r} fails its checksum")
        return pointer, blob

    async def load_tree(
        self, viewer: Viewer, cache: TreeCache | None = None
    ) -> tuple[Pointer, treedoc.Tree]:
        """The published tree, as much of it as `viewer` may see; from `cache` if it
        holds this version, else fetched (and then kept there)."""
        pointer = await self.current()
        columns = cache.get(self.name, pointer.sha256) if cache else None
        if columns is not None:
            try:
                return pointer, treedoc.load_columns(columns, viewer)
            except TreeError as e:
                log.warning("the cached tree of %r is damaged (%s); fetching it", self.name, e)
        _, blob = await self.tree_document(pointer)
        columns = treedoc.decode_columns(blob)
        tree = treedoc.load_columns(columns, viewer)
        if cache:
            cache.put(self.name, pointer.sha256, columns)
        return pointer, tree

    async def fetch_chunks(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, bytes]:
        """Content chunks by key, in one request, filtered to what the viewer may see."""
        ids = [chunk_id(k) for k in keys]
        visible = self.viewer.es_filter()
        with self._read("content", "reading content"):
            if visible is None and len(ids) <= MGET_MAX:
                docs = (await self.client.mget(index=self.index("chunks"), ids=ids))["docs"]
            else:
                filters = [{"ids": {"values": ids}}] + ([] if visible is None else [visible])
                resp = await self.client.search(
                    index=self.index("chunks"),
                    size=len(ids),
                    track_total_hits=False,
                    query={"bool": {"filter": filters}},
                    source_includes=["data"],
                )
                found = {h["_id"]: {**h, "found": True} for h in resp["hits"]["hits"]}
                docs = [found.get(i, {"_id": i, "_index": self.index("chunks")}) for i in ids]
        return {
            k: _decoded(doc, "data", "content chunk") for k, doc in zip(keys, docs, strict=True)
        }

    async def scan_ids(self, kind: str) -> AsyncIterator[str]:
        """Every document id of one index, via a point in time so the walk is consistent."""
        index = self.index(kind)
        with self._backend(f"listing {index}"):
            pit = (await self.client.open_point_in_time(index=index, keep_alive="2m"))["id"]
        try:
            after: list[Any] | None = None
            while True:
                with self._backend(f"listing {index}"):
                    resp = await self.client.search(
                        pit={"id": pit, "keep_alive": "2m"},
                        sort=["_shard_doc"],
                        size=10_000,
                        source=False,
                        search_after=after,
                        track_total_hits=False,
                    )
                hits = resp["hits"]["hits"]
                for hit in hits:
                    yield hit["_id"]
                if not hits:
                    return
                after = hits[-1]["sort"]
        finally:
            with self._backend(f"listing {index}"):
                await self.client.close_point_in_time(id=pit)

    async def search_files(
        self, query: dict[str, Any], scopes: list[str], limit: int | None = None
    ) -> set[tuple[str, str]] | None:
        """(path, digest) of every file document under `scopes` that matches `query`;
        None if more than `limit` do (counted by the first request, so no more follow).

        A scope is a path relative to the root ("" for all of it); a directory
        scope is a prefix filter, so the request stays small whatever it covers.
        """
        where = [{"term": {"path": s}} for s in scopes if s] + [
            {"prefix": {"path": s + "/"}} for s in scopes if s
        ]
        scope = {"bool": {"should": where, "minimum_should_match": 1}} if all(scopes) else None
        visible = self.viewer.es_filter()
        filters = [query] + [f for f in (scope, visible) if f is not None]
        body = {"bool": {"filter": filters}}
        found: set[tuple[str, str]] = set()
        after: list[Any] | None = None
        # The first page counts the hits, only as far as the limit.
        count_to = None if limit is None else limit + 1
        while True:
            size = SEARCH_PAGE if count_to is None else FIRST_PAGE
            with self._read("search", "searching"):
                resp = await self.client.search(
                    index=self.index("files"),
                    query=body,
                    size=size,
                    sort=["_doc"],
                    # No stored field at all, not even _id: with only _source off,
                    # loading the ids took 2/3 of a 7,000-hit search (140 -> 45 ms).
                    stored_fields="_none_",
                    docvalue_fields=["path", "digest"],
                    filter_path=["hits.total", "hits.hits.fields", "hits.hits.sort"],
                    search_after=after,
                    track_total_hits=False if count_to is None else count_to,
                )
            # filter_path leaves out what is empty: no hits, no "hits".
            page = resp.get("hits", {})
            if count_to is not None and page["total"]["value"] >= count_to:
                return None
            count_to = None
            hits = page.get("hits", [])
            found.update((h["fields"]["path"][0], h["fields"]["digest"][0]) for h in hits)
            if len(hits) < size:
                return found
            after = hits[-1]["sort"]

    # -- writing ---------------------------------------------------------------

    async def ensure_indices(self) -> None:
        for kind, body in MAPPINGS.items():
            index = self.index(kind)
            with self._backend(f"creating {index}"):
                if not await self.client.indices.exists(index=index):
                    try:
                        await self.client.indices.create(index=index, **body)
                        continue
                    except elasticsearch.BadRequestError as e:
                        # Lost a race with another creator: fine if it exists now.
                        if "resource_already_exists" not in str(e):
                            raise
                # Fields added since the index was made (adding fields is always allowed).
                await self.client.indices.put_mapping(
                    index=index, properties=body["mappings"]["properties"]
                )

    async def bulk(self, operations: list[dict[str, Any]]) -> None:
        if not operations:
            return
        with self._backend("writing"):
            resp = await self.client.bulk(operations=operations)
        if resp["errors"]:
            for item in resp["items"]:
                result = next(iter(item.values()))
                if result.get("error") and result.get("status") != 404:
                    raise StoreError(
                        f"writing {result['_index']}/{result['_id']}: "
                        f"{result['error'].get('reason')}"
                    )

    async def refresh(self, kind: str) -> None:
        with self._backend(f"refreshing {self.index(kind)}"):
            await self.client.indices.refresh(index=self.index(kind))

    async def publish(
        self, blob: bytes, previous: Pointer | None, files: int, size: int
    ) -> Pointer:
        """Store a tree document, then point `current` at it: readers switch atomically."""
        version = (previous.version if previous else 0) + 1
        step = TREE_PART_SIZE
        parts = [blob[i : i + step] for i in range(0, len(blob), step)] or [b""]
        meta = self.index("meta")
        for n, part in enumerate(parts):
            await self.bulk(
                [
                    {"index": {"_index": meta, "_id": f"tree-{version}-{n}"}},
                    {"data": base64.b64encode(part).decode("ascii")},
                ]
            )
        pointer = Pointer(
            version=version,
            parts=len(parts),
            sha256=hashlib.sha256(blob).hexdigest(),
            chunk_size=CHUNK_SIZE,
            files=files,
            bytes=size,
            published=time.time(),
        )
        with self._backend("publishing the tree"):
            await self.client.index(
                index=meta, id=POINTER_ID, document=_asdict(pointer), refresh=True
            )
        return pointer

    async def drop_tree(self, pointer: Pointer) -> None:
        meta = self.index("meta")
        await self.bulk(
            [
                {"delete": {"_index": meta, "_id": f"tree-{pointer.version}-{n}"}}
                for n in range(pointer.parts)
            ]
        )

    @asynccontextmanager
    async def ingest_lock(self, owner: str) -> AsyncIterator[None]:
        """One ingest at a time per index: another's garbage collection would delete our uploads."""
        meta = self.index("meta")
        with self._backend("taking the ingest lock"):
            try:
                await self.client.create(
                    index=meta,
                    id=LOCK_ID,
                    refresh=True,
                    document={"owner": owner, "since": time.time()},
                )
            except elasticsearch.ConflictError:
                held = (await self.client.get(index=meta, id=LOCK_ID))["_source"]
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("since", 0)))
                raise StoreError(
                    f"another ingest into {self.name!r} holds the lock ({held.get('owner')}, "
                    f"since {since}); if it died, rerun with --break-lock"
                ) from None
        try:
            yield
        finally:
            with self._backend("releasing the ingest lock"):
                await self.client.delete(index=meta, id=LOCK_ID, refresh=True)

    async def break_lock(self) -> None:
        with self._backend("breaking the ingest lock"), suppress(elasticsearch.NotFoundError):
            await self.client.delete(index=self.index("meta"), id=LOCK_ID, refresh=True)


def _asdict(pointer: Pointer) -> dict[str, Any]:
    return {k: getattr(pointer, k) for k in Pointer.__dataclass_fields__}


def _decoded(doc: dict[str, Any], field: str, what: str) -> bytes:
    if not doc.get("found"):
        raise StoreError(f"{what} {doc.get('_id')} is missing from {doc.get('_index')}")
    try:
        # binascii, not base64.b64decode: its validation is a regex over the whole
        # text, which took as long as the decoding itself (py-spy, preloading tldr).
        return binascii.a2b_base64(doc["_source"][field], strict_mode=True)
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{what} {doc.get('_id')} is corrupt: {e}") from None


def check_name(name: str) -> str:
    """A docs index name that makes valid Elasticsearch index names with our suffixes."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,200}", name):
        raise StoreError(
            f"invalid index name {name!r}: use lower-case letters, digits, '.', '_' "
            f"and '-', starting with a letter or digit"
        )
    return name
