"""Pure units: the chunk cache and range reads, with a loader that counts its calls."""

import pytest
import trio

from esfuse.cache import ChunkCache, ContentCache
from esfuse.errors import StoreError

DATA = bytes(range(256)) * 40  # 10,240 bytes
CHUNK = 1000


def chunks_of(data: bytes) -> dict:
    return {("d", n): data[n * CHUNK : (n + 1) * CHUNK] for n in range(-(-len(data) // CHUNK))}


class Loader:
    def __init__(self, chunks: dict, delay: float = 0.0, fail: bool = False):
        self.chunks, self.delay, self.fail = chunks, delay, fail
        self.calls: list[list] = []

    async def __call__(self, keys):
        self.calls.append(list(keys))
        await trio.sleep(self.delay)
        if self.fail:
            raise StoreError("backend down")
        return {k: self.chunks[k] for k in keys}


@pytest.mark.parametrize(
    "offset, length",
    [
        (0, 10),
        (0, 10_240),
        (990, 20),
        (999, 1),
        (1000, 1000),
        (5, 9000),
        (10_230, 100),
        (10_240, 5),
        (20_000, 5),
    ],
)
def test_ranges_are_exact(offset, length):
    cache = ContentCache(Loader(chunks_of(DATA)), CHUNK, 1 << 20)
    got = trio.run(cache.read, "d", len(DATA), offset, length)
    assert got == DATA[offset : offset + length]


def test_one_request_per_read_and_hits_afterwards():
    loader = Loader(chunks_of(DATA))
    cache = ContentCache(loader, CHUNK, 1 << 20)
    trio.run(cache.read, "d", len(DATA), 500, 2000)
    assert loader.calls == [[("d", 0), ("d", 1), ("d", 2)]]
    trio.run(cache.read, "d", len(DATA), 0, 3000)
    assert len(loader.calls) == 1
    assert cache.chunks.hits == 3 and cache.chunks.misses == 3


def test_concurrent_first_reads_make_one_request():
    loader = Loader(chunks_of(DATA), delay=0.05)
    cache = ContentCache(loader, CHUNK, 1 << 20)
    results = []

    async def main():
        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(lambda: _read(results))

    async def _read(out):
        out.append(await cache.read("d", len(DATA), 0, 1500))

    trio.run(main)
    assert results == [DATA[:1500]] * 10
    assert loader.calls == [[("d", 0), ("d", 1)]]


def test_cache_is_bounded_in_bytes():
    loader = Loader(chunks_of(DATA))
    cache = ContentCache(loader, CHUNK, 3 * CHUNK)
    trio.run(cache.read, "d", len(DATA), 0, len(DATA))
    assert cache.chunks.current_bytes <= 3 * CHUNK
    trio.run(cache.read, "d", len(DATA), 0, 10)  # evicted: loaded again
    assert len(loader.calls) == 2


def test_chunk_larger_than_cache_is_served_not_kept():
    cache = ContentCache(Loader(chunks_of(DATA)), CHUNK, 10)
    assert trio.run(cache.read, "d", len(DATA), 0, 1500) == DATA[:1500]
    assert cache.chunks.current_bytes == 0


def test_failure_reaches_every_waiter_and_is_not_cached():
    loader = Loader(chunks_of(DATA), delay=0.05, fail=True)
    cache = ContentCache(loader, CHUNK, 1 << 20)
    errors = []

    async def read():
        try:
            await cache.read("d", len(DATA), 0, 100)
        except StoreError as e:
            errors.append(str(e))

    async def main():
        async with trio.open_nursery() as n:
            for _ in range(3):
                n.start_soon(read)

    trio.run(main)
    assert len(errors) == 3 and len(loader.calls) == 1
    loader.fail = False
    assert trio.run(cache.read, "d", len(DATA), 0, 100) == DATA[:100]


def test_wrong_chunk_length_is_an_error():
    bad = chunks_of(DATA)
    bad[("d", 1)] = b"short"
    cache = ContentCache(Loader(bad), CHUNK, 1 << 20)
    with pytest.raises(StoreError, match="expected 1000"):
        trio.run(cache.read, "d", len(DATA), 0, 2000)


def test_chunk_cache_returns_in_request_order():
    loader = Loader({("a", 0): b"A", ("b", 0): b"B"})
    cache = ChunkCache(loader, 100)
    assert trio.run(cache.get_many, [("b", 0), ("a", 0), ("b", 0)]) == [b"B", b"A", b"B"]
    assert loader.calls == [[("b", 0), ("a", 0)]]


def many_files(count: int, size: int) -> dict:
    return {(f"f{i}", 0): bytes([i % 256]) * size for i in range(count)}


def test_prefetch_batches_files_and_readers_join_it(monkeypatch):
    import esfuse.cache

    monkeypatch.setattr(esfuse.cache, "PREFETCH_BATCH_KEYS", 4)
    chunks = many_files(10, 100)
    loader = Loader(chunks, delay=0.02)
    cache = ContentCache(loader, CHUNK, 1 << 20)
    got = []

    async def main():
        async with trio.open_nursery() as n:
            cache.prefetch(n, [(f"f{i}", 100) for i in range(10)])
            # Reserved synchronously: this read waits for its batch, asks nothing itself.
            got.append(await cache.read("f9", 100, 0, 100))

    trio.run(main)
    assert got == [chunks[("f9", 0)]]
    assert sorted(len(c) for c in loader.calls) == [2, 4, 4]
    assert trio.run(cache.read, "f3", 100, 0, 100) == chunks[("f3", 0)]
    assert len(loader.calls) == 3


def prefetch(cache, files):
    async def main():
        async with trio.open_nursery() as n:
            cache.prefetch(n, files)

    trio.run(main)


def test_prefetch_spends_at_most_half_the_cache_and_skips_cached():
    loader = Loader(many_files(10, 100))
    cache = ContentCache(loader, CHUNK, 1000)
    trio.run(cache.read, "f0", 100, 0, 100)
    prefetch(cache, [(f"f{i}", 100) for i in range(10)])
    # Half the cache is 500 bytes: five more files (f0, cached already, costs nothing).
    assert loader.calls[1] == [("f1", 0), ("f2", 0), ("f3", 0), ("f4", 0), ("f5", 0)]
    prefetch(cache, [(f"f{i}", 100) for i in range(3)])
    assert len(loader.calls) == 2  # everything asked for is cached: no request


def test_local_contents_are_read_in_place_never_fetched_or_cached():
    local = {"kept": memoryview(b"kept on disk\n")}
    loader = Loader(many_files(2, 100))
    cache = ContentCache(loader, CHUNK, 1000, lambda digest, size: local.get(digest))
    assert cache.cached("kept", 13, 5, 2) == b"on"
    assert cache.cached("kept", 13, 13, 10) == b""  # at the end
    prefetch(cache, [("kept", 13), ("f1", 100)])
    assert loader.calls == [[("f1", 0)]]
    assert cache.chunks.current_bytes == 100


def test_a_failed_prefetch_reaches_its_readers_but_not_the_prefetcher():
    loader = Loader(many_files(3, 10), delay=0.02, fail=True)
    cache = ContentCache(loader, CHUNK, 1 << 20)
    errors = []

    async def main():
        async with trio.open_nursery() as n:
            cache.prefetch(n, [(f"f{i}", 10) for i in range(3)])
            try:
                await cache.read("f1", 10, 0, 10)
            except StoreError as e:
                errors.append(e)

    trio.run(main)
    assert len(errors) == 1 and len(loader.calls) == 1


def test_preload_loads_everything_in_order_without_holding_up_reads(monkeypatch):
    import esfuse.cache

    monkeypatch.setattr(esfuse.cache, "PREFETCH_BATCH_KEYS", 4)
    chunks = many_files(20, 100)
    loader = Loader(chunks, delay=0.05)
    cache = ContentCache(loader, CHUNK, 1 << 20)
    got, heard = [], []

    async def main():
        async with trio.open_nursery() as n:
            assert cache.can_preload(2000)
            n.start_soon(
                cache.preload, [(f"f{i}", 100) for i in range(20)], lambda: heard.append(1)
            )
            await trio.sleep(0.01)
            # Three batches are in flight; f19's is not claimed yet: the read asks alone.
            started = trio.current_time()
            got.append(await cache.read("f19", 100, 0, 100))
            got.append(trio.current_time() - started)

    trio.run(main)
    assert got[0] == chunks[("f19", 0)] and got[1] < 0.09
    assert loader.calls[:4] == [
        [(f"f{i}", 0) for i in range(0, 4)],
        [(f"f{i}", 0) for i in range(4, 8)],
        [(f"f{i}", 0) for i in range(8, 12)],
        [("f19", 0)],
    ]
    assert sorted(k for c in loader.calls for k in c) == sorted(chunks)  # each chunk once
    # Told of each of its batches once cached; f19's request was the read's.
    assert len(heard) == len(loader.calls) - 1
    before = len(loader.calls)
    for i in range(20):
        assert trio.run(cache.read, f"f{i}", 100, 0, 100) == chunks[(f"f{i}", 0)]
    assert len(loader.calls) == before


def test_preload_declines_what_does_not_fit_half_the_cache():
    cache = ContentCache(Loader(many_files(10, 100)), CHUNK, 1999)
    assert not cache.can_preload(1000)
    assert cache.can_preload(999)
