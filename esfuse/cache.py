"""File contents in memory: a byte-bounded chunk cache with single-flight loading.

The mount reads through `ContentCache.read`. Chunks live in an LRU bounded by
their total size in bytes; a chunk that several tasks want at once is fetched
by the first of them only, and the others wait for that result. The loader is
injected, so this module knows nothing of Elasticsearch or FUSE.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import cachetools
import trio

from esfuse.errors import StoreError

log = logging.getLogger(__name__)

Key = tuple[str, int]
PREFETCH_BATCH_BYTES = 4 << 20
PREFETCH_BATCH_KEYS = 1024
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

    def peek(self, keys: Sequence[Key], count: bool = True) -> list[bytes] | None:
        """The chunks for `keys` if all are cached, else None; never loads."""
        found = []
        for key in keys:
            value = self._lru.get(key)
            if value is None:
                return None
            found.append(value)
        if count:
            self.hits += len(found)
        return found

    def holds(self, key: Key) -> bool:
        """Whether `key` is cached or on its way."""
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

    def reserve(self, batch: Iterable[Key]) -> dict[Key, _Pending]:
        """Mark what of `batch` is neither cached nor on its way as coming, for `fill`.

        Synchronous, so that a read that follows cannot slip in and fetch the
        same chunk again.
        """
        return self._claim(k for k in batch if k not in self._lru)

    async def fill(
        self,
        claims: Iterable[Callable[[], dict[Key, _Pending]]],
        loaded: Callable[[], None] | None = None,
    ) -> None:
        """Load batches a few at a time; a failed batch fails its readers only.

        Each claim gives the keys of one batch when its turn comes: keys
        reserved earlier, or reserved only then, so that a read meanwhile
        fetches its own chunk instead of waiting for the batch's turn.
        `loaded` is called each time a batch is cached.
        """
        pending = iter(claims)

        async def worker() -> None:
            # The workers share one iterator, so batches are claimed in order
            # (trio starts tasks in no set order).
            for claim in pending:
                mine = claim()
                try:
                    if mine:
                        await self._load(mine)
                except Exception as e:
                    log.warning("loading %d chunks ahead failed: %s", len(mine), e)
                    continue
                if mine and loaded is not None:
                    loaded()

        async with trio.open_nursery() as nursery:
            for _ in range(PREFETCH_PARALLEL):
                nursery.start_soon(worker)

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
    """Byte ranges of files, assembled from cached chunks of `chunk_size` bytes.

    `local(digest, size)` gives a whole content kept on local disk and mapped
    into memory (see pack), if it is: that is read from there as it is, neither
    cached here nor fetched ahead (until the pack is open, the loader reads it
    from there, into the cache). Through the loader, a read of a tldr page
    from the pack took 26 us (a copy, a trip through the scheduler, a place in
    the cache), and 0.8 us so; a `grep -r` at mount makes thousands of them,
    wherever it gets ahead of the hand-over to the kernel.
    """

    def __init__(
        self,
        loader: Loader,
        chunk_size: int,
        max_bytes: int,
        local: Callable[[str, int], memoryview | None] = lambda digest, size: None,
    ) -> None:
        self.chunk_size = chunk_size
        self.chunks = ChunkCache(loader, max_bytes)
        self.local = local

    def holds(self, digest: str, offset: int) -> bool:
        """Whether the chunk at `offset` is cached or on its way."""
        return self.chunks.holds((digest, offset // self.chunk_size))

    async def read(self, digest: str, size: int, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` of a file of `size` bytes with content `digest`."""
        keys, end = self._span(digest, size, offset, length)
        chunks = await self.chunks.get_many(keys)
        return self._assemble(keys, chunks, size, offset, end)

    def cached(
        self, digest: str, size: int, offset: int, length: int, count: bool = True
    ) -> bytes | memoryview | None:
        """What `read` would give, if every chunk of it is cached, or a view of it
        if it is local; else None.

        No await: the kernel's reads of a cached file cost one dictionary
        lookup each instead of a trip through the scheduler. A hit counts only
        if `count`: a look by the daemon itself is not a read.
        """
        whole = self.local(digest, size)
        if whole is not None:
            return whole[offset : offset + length]
        keys, end = self._span(digest, size, offset, length)
        chunks = self.chunks.peek(keys, count)
        return None if chunks is None else self._assemble(keys, chunks, size, offset, end)

    def _span(self, digest: str, size: int, offset: int, length: int) -> tuple[list[Key], int]:
        """The chunk keys holding `length` bytes at `offset`, and where the range ends."""
        end = min(size, offset + length)
        if offset >= end:
            return [], end
        first, last = offset // self.chunk_size, (end - 1) // self.chunk_size
        return [(digest, n) for n in range(first, last + 1)], end

    def _assemble(
        self, keys: list[Key], chunks: list[bytes], size: int, offset: int, end: int
    ) -> bytes:
        if not keys:
            return b""
        for (digest, n), chunk in zip(keys, chunks, strict=True):
            expected = min(self.chunk_size, size - n * self.chunk_size)
            if len(chunk) != expected:
                raise StoreError(
                    f"content chunk {digest}-{n} has {len(chunk)} bytes, expected {expected}"
                )
        start = offset - keys[0][1] * self.chunk_size
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if start == 0 and end - offset == len(data):
            return data  # a whole small file: no copy
        return data[start : start + end - offset]

    def prefetch(self, nursery: trio.Nursery, files: Iterable[tuple[str, int]]) -> None:
        """Start loading whole files (digest, size) ahead of their reads, in few requests.

        The chunks are reserved before this returns, so reads issued afterwards
        wait for these requests instead of making their own. At most half the
        cache is spent on one read-ahead, so it cannot evict itself before it is
        read; batches stay near PREFETCH_BATCH_BYTES.
        """
        # What is cached or on its way is left out before batching, which would cost
        # more: an unselective esgrep over a preloaded tldr prefetches 38,405 files.
        wanted = [
            (d, size)
            for d, size in files
            if not self.chunks.holds((d, 0)) and self.local(d, size) is None
        ]
        reserved = [self.chunks.reserve(batch) for batch in self._batches(wanted)]
        claims = [mine.copy for mine in reserved if mine]  # already claimed: hand them over
        if claims:
            nursery.start_soon(self.chunks.fill, claims)

    def can_preload(self, size: int) -> bool:
        """Whether contents of `size` bytes in all fit in half the cache."""
        return size <= self.chunks.max_bytes // 2

    async def preload(
        self,
        files: Iterable[tuple[str, int]],
        loaded: Callable[[], None] | None = None,
    ) -> None:
        """Load all of `files` (which `can_preload`), in order; `loaded` after each batch.

        Unlike `prefetch`, batches are claimed only when their turn comes, so a
        read of a file the preload has not reached yet is not held up by it; and
        `files` is walked only then, a batch at a time, so the walk does not hold
        up the requests of a mount that has just become ready.
        """
        batches = self._batches(files)
        await self.chunks.fill((functools.partial(self.chunks.reserve, b) for b in batches), loaded)

    def _batches(self, files: Iterable[tuple[str, int]]) -> Iterator[list[Key]]:
        """The chunk keys of `files`, in batches for one request each, up to half the cache."""
        budget = self.chunks.max_bytes // 2
        batch: list[Key] = []
        batch_bytes = 0
        for digest, size in files:
            if size > budget:
                break
            budget -= size
            for n in range(-(-size // self.chunk_size)):
                if batch_bytes >= PREFETCH_BATCH_BYTES or len(batch) >= PREFETCH_BATCH_KEYS:
                    yield batch
                    batch, batch_bytes = [], 0
                batch.append((digest, n))
                batch_bytes += min(self.chunk_size, size - n * self.chunk_size)
        if batch:
            yield batch
