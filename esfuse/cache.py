"""File contents in memory: a byte-bounded chunk cache with single-flight loading.

The mount reads through `ContentCache.read`. Chunks live in an LRU bounded by
their total size in bytes; a chunk that several tasks want at once is fetched
by the first of them only, and the others wait for that result. The loader is
injected, so this module knows nothing of Elasticsearch or FUSE.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import cachetools
import trio

from esfuse.errors import StoreError

log = logging.getLogger(__name__)

Key = tuple[str, int]
PREFETCH_BATCH_BYTES = 4 << 20
PREFETCH_BATCH_KEYS = 256
# Batches in flight at once: Elasticsearch answers one while we decode another.
PREFETCH_PARALLEL = 3
Loader = Callable[[Sequence[Key]], Awaitable[dict[Key, bytes]]]


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    value: bytes | None = None
    error: BaseException | None = None


class ChunkCache:
    """LRU of chunks keyed by (digest, index), holding at most `max_bytes` of data."""

    def __init__(self, loader: Loader, max_bytes: int) -> None:
        self._loader = loader
        self._lru: cachetools.LRUCache[Key, bytes] = cachetools.LRUCache(max_bytes, getsizeof=len)
        self._pending: dict[Key, _Pending] = {}
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        return int(self._lru.maxsize)

    @property
    def current_bytes(self) -> int:
        return int(self._lru.currsize)

    def holds(self, key: Key) -> bool:
        return key in self._lru or key in self._pending

    async def get_many(self, keys: Sequence[Key]) -> list[bytes]:
        """The chunks for `keys`, in order; missing ones come from one loader call."""
        found: dict[Key, bytes] = {}
        theirs: dict[Key, _Pending] = {}
        for key in keys:
            value = self._lru.get(key)
            if value is not None:
                found[key] = value
            elif key in self._pending:
                theirs[key] = self._pending[key]
        self.hits += len(found)
        mine = self._claim(k for k in keys if k not in found and k not in theirs)
        if mine:
            await self._load(mine)
        for key, pending in {**mine, **theirs}.items():
            await pending.done.wait()
            if pending.error is not None:
                raise StoreError(f"reading content failed: {pending.error}")
            assert pending.value is not None
            found[key] = pending.value
        return [found[key] for key in keys]

    def reserve(self, batches: Iterable[Sequence[Key]]) -> list[dict[Key, _Pending]]:
        """Mark what is neither cached nor on its way as coming, batch by batch.

        Synchronous, so that a read that follows cannot slip in and fetch the
        same chunk again; `fill` then loads the reserved batches.
        """
        return [
            mine
            for batch in batches
            if (mine := self._claim(k for k in batch if k not in self._lru))
        ]

    async def fill(self, reserved: list[dict[Key, _Pending]]) -> None:
        """Load reserved batches, a few at a time; a failed batch fails its readers only."""
        limiter = trio.CapacityLimiter(PREFETCH_PARALLEL)

        async def one(mine: dict[Key, _Pending]) -> None:
            async with limiter:
                try:
                    await self._load(mine)
                except Exception as e:
                    log.warning("read-ahead of %d chunks failed: %s", len(mine), e)

        async with trio.open_nursery() as nursery:
            for mine in reserved:
                nursery.start_soon(one, mine)

    def _claim(self, keys: Iterable[Key]) -> dict[Key, _Pending]:
        mine: dict[Key, _Pending] = {}
        for key in keys:
            if key not in self._pending:
                mine[key] = self._pending[key] = _Pending()
        self.misses += len(mine)
        return mine

    def _release(self, mine: dict[Key, _Pending], error: BaseException) -> None:
        for key, pending in mine.items():
            pending.error = error
            del self._pending[key]
            pending.done.set()

    async def _load(self, mine: dict[Key, _Pending]) -> None:
        try:
            loaded = await self._loader(list(mine))
            values = [loaded[key] for key in mine]
        except BaseException as e:
            # Waiters must wake up even if we were cancelled; they re-raise our error.
            self._release(mine, e)
            raise
        for (key, pending), value in zip(mine.items(), values, strict=True):
            pending.value = value
            self._remember(key, value)
            del self._pending[key]
            pending.done.set()

    def _remember(self, key: Key, value: bytes) -> None:
        try:
            self._lru[key] = value
        except ValueError:
            log.debug("chunk %s-%d larger than the cache, not kept", *key)


class ContentCache:
    """Byte ranges of files, assembled from cached chunks of `chunk_size` bytes."""

    def __init__(self, loader: Loader, chunk_size: int, max_bytes: int) -> None:
        self.chunk_size = chunk_size
        self.chunks = ChunkCache(loader, max_bytes)

    def holds(self, digest: str, offset: int) -> bool:
        """Whether the chunk at `offset` is cached or on its way."""
        return self.chunks.holds((digest, offset // self.chunk_size))

    async def read(self, digest: str, size: int, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` of a file of `size` bytes with content `digest`."""
        end = min(size, offset + length)
        if offset >= end:
            return b""
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        chunks = await self.chunks.get_many([(digest, n) for n in range(first, last + 1)])
        for n, chunk in zip(range(first, last + 1), chunks, strict=False):
            expected = min(self.chunk_size, size - n * self.chunk_size)
            if len(chunk) != expected:
                raise StoreError(
                    f"content chunk {digest}-{n} has {len(chunk)} bytes, expected {expected}"
                )
        data = b"".join(chunks)
        start = offset - first * self.chunk_size
        return data[start : start + end - offset]

    def prefetch(self, nursery: trio.Nursery, files: Iterable[tuple[str, int]]) -> None:
        """Start loading whole files (digest, size) ahead of their reads, in few requests.

        The chunks are reserved before this returns, so reads issued afterwards
        wait for these requests instead of making their own. At most half the
        cache is spent on one read-ahead, so it cannot evict itself before it is
        read; batches stay near PREFETCH_BATCH_BYTES.
        """
        budget = self.chunks.max_bytes // 2
        batches: list[list[Key]] = [[]]
        batch_bytes = 0
        for digest, size in files:
            if size > budget:
                break
            budget -= size
            for n in range(-(-size // self.chunk_size)):
                if batch_bytes >= PREFETCH_BATCH_BYTES or len(batches[-1]) >= PREFETCH_BATCH_KEYS:
                    batches.append([])
                    batch_bytes = 0
                batches[-1].append((digest, n))
                batch_bytes += min(self.chunk_size, size - n * self.chunk_size)
        reserved = self.chunks.reserve(batches)
        if reserved:
            nursery.start_soon(self.chunks.fill, reserved)
