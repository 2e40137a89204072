"""The store and ingest against the real Elasticsearch node (no mount)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import trio

from esfuse import store as layout
from esfuse.access import EVERYTHING, Viewer
from esfuse.cache import ContentCache
from esfuse.errors import StoreError, TreeError
from esfuse.store import Connection, Store, connect
from esfuse.treecache import TreeCache
from tests.conftest import ESFUSE, Docs, esfuse, run

pytestmark = pytest.mark.es


def source_files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


async def with_store_async(docs: Docs, work):
    client = connect(Connection(url=docs.url))
    try:
        return await work(Store(client, docs.name, docs.url))
    finally:
        await client.close()


def with_store(docs: Docs, work):
    return trio.run(with_store_async, docs, work)


def test_the_published_tree_matches_the_source(docs):
    _, tree = with_store(docs, lambda s: s.load_tree(EVERYTHING))
    src = source_files(docs.src)
    records = {f.path: f for f in tree.files()}
    assert set(records) == set(src)
    for path, f in records.items():
        st = src[path].stat()
        assert (f.size, f.mtime_ns) == (st.st_size, st.st_mtime_ns), path
        assert f.digest == hashlib.sha256(src[path].read_bytes()).hexdigest(), path
    assert tree.resolve("empty-dir") is not None and tree.listing(tree.resolve("empty-dir")) == []


def test_every_file_reads_back_byte_exact(docs):
    async def read_all(s: Store):
        pointer, tree = await s.load_tree(EVERYTHING)
        content = ContentCache(s.fetch_chunks, pointer.chunk_size, 64 << 20)
        return {f.path: await content.read(f.digest, f.size, 0, f.size) for f in tree.files()}

    got = with_store(docs, read_all)
    for path, p in source_files(docs.src).items():
        assert got[path] == p.read_bytes(), path


def test_elasticsearch_holds_chunks_texts_and_the_pointer(docs, es):
    src = source_files(docs.src)
    digests = {hashlib.sha256(p.read_bytes()).hexdigest(): p.stat().st_size for p in src.values()}
    expected_chunks = sum(layout.chunk_count(size, layout.CHUNK_SIZE) for size in digests.values())
    assert docs.count("chunks") == expected_chunks
    assert docs.count("files") == len(src)
    big = es.get(
        index=f"{docs.name}-chunks",
        id=f"{hashlib.sha256(src['large/big.txt'].read_bytes()).hexdigest()}-4",
    )
    assert len(big["_source"]["data"]) > 0
    pointer = es.get(index=f"{docs.name}-meta", id="current")["_source"]
    assert pointer["version"] == 1 and pointer["files"] == len(src)
    # The whole text is searchable by any substring, yet not stored in _source.
    hit = es.search(
        index=f"{docs.name}-files", query={"match_phrase": {"text": "ccess_tok"}}, size=50
    )["hits"]["hits"]
    paths = {h["_source"]["path"] for h in hit}
    assert {"guide/quickstart.mdx", "assets/nul.bin", "large/big.txt"} <= paths
    assert all("text" not in h["_source"] for h in hit)


def test_a_match_across_a_chunk_boundary_is_searchable(docs, es):
    data = (docs.src / "large" / "big.txt").read_bytes()
    across = data[layout.CHUNK_SIZE - 6 : layout.CHUNK_SIZE + 6].decode()
    hit = es.search(index=f"{docs.name}-files", query={"match_phrase": {"text": across}})
    assert [h["_source"]["path"] for h in hit["hits"]["hits"]] == ["large/big.txt"]


@pytest.fixture
def small(es_url, es, tmp_path):
    src = tmp_path / "src"
    for rel, text in {"a.md": "alpha\n", "b/b.md": "beta\n", "c.md": "gamma\n"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    d = Docs(es_url, es, src, prefix="small")
    yield d
    d.drop()


def test_reingest_is_incremental_and_collects_garbage(small):
    first = small.ingest()
    assert first.returncode == 0, first.stderr
    assert "3 files" in first.stdout and "3 added" in first.stdout and "version 1" in first.stdout
    again = small.ingest()
    assert "3 unchanged" in again.stdout and "0.0 MB uploaded" in again.stdout

    (small.src / "a.md").write_text("alpha, changed\n")
    (small.src / "c.md").unlink()
    (small.src / "new dir").mkdir()
    (small.src / "new dir" / "d.md").write_text("delta\n")
    third = small.ingest()
    assert third.returncode == 0, third.stderr
    for part in ("1 added", "1 changed", "1 removed", "1 unchanged", "version 3"):
        assert part in third.stdout, third.stdout
    _, tree = with_store(small, lambda s: s.load_tree(EVERYTHING))
    assert sorted(f.path for f in tree.files()) == ["a.md", "b/b.md", "new dir/d.md"]
    # The replaced tree stays readable (old contents kept one version), then goes.
    assert small.count("files") == 5  # a(old), a(new), b, c(old), d
    fourth = small.ingest()
    assert "3 unchanged" in fourth.stdout
    assert small.count("files") == 3 and small.count("chunks") == 3
    assert {
        h["_id"] for h in small.es.search(index=f"{small.name}-meta", size=100)["hits"]["hits"]
    } == {"current", "tree-3-0", "tree-4-0"}


@pytest.mark.parametrize("others", [0, layout.MGET_MAX], ids=["by mget", "by search"])
def test_chunks_read_by_either_request_and_a_bad_one_is_a_store_error(small, es, others):
    assert small.ingest().returncode == 0
    good = (hashlib.sha256(b"alpha\n").hexdigest(), 0)
    bad, lost = ("0" * 64, 0), ("1" * 64, 0)
    es.index(
        index=f"{small.name}-chunks",
        id=layout.chunk_id(bad),
        document={"data": "not base64!", "public": True},
        refresh=True,
    )
    # Past MGET_MAX keys the chunks come by a search; the extra keys are all `good`.
    padding = [good] * others

    async def fetch(keys):
        return await with_store_async(small, lambda s: s.fetch_chunks(keys))

    assert trio.run(fetch, [good, *padding]) == {good: b"alpha\n"}
    for key, reason in ((bad, "is corrupt"), (lost, "is missing")):
        with pytest.raises(StoreError, match=f"content chunk {layout.chunk_id(key)} {reason}"):
            trio.run(fetch, [good, key, *padding])


def test_checksum_catches_a_change_that_kept_size_and_mtime(small):
    assert small.ingest().returncode == 0
    path = small.src / "a.md"
    st = path.stat()
    path.write_text("ALPHA\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "3 unchanged" in small.ingest().stdout
    assert "1 changed" in small.ingest("--checksum").stdout


def one_line_error(done, *needles):
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("esfuse: "), done.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unreachable_cluster_is_one_line(small):
    done = esfuse(
        "ingest", small.src, "--es", "http://127.0.0.1:1", "--index", small.name, "--timeout", "2"
    )
    one_line_error(done, "cannot reach Elasticsearch", "127.0.0.1:1")


def test_missing_directory_is_one_line(small, tmp_path):
    one_line_error(small.ingest(src=tmp_path / "nope"), "does not exist")


def test_bad_index_name_is_a_usage_error(small):
    done = esfuse("ingest", small.src, "--index", "Bad Name")
    assert done.returncode == 2 and "invalid index name" in done.stderr


def test_unreadable_file_fails_without_touching_the_published_tree(small, tmp_path):
    assert small.ingest().returncode == 0
    before = small.es.get(index=f"{small.name}-meta", id="current")["_source"]
    src = tmp_path / "unreadable"
    shutil.copytree(small.src, src)
    (src / "secret.md").write_text("x\n")
    (src / "secret.md").chmod(0)
    # Root reads anything; without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH it cannot.
    done = run(
        "setpriv",
        "--bounding-set",
        "-dac_override,-dac_read_search",
        *ESFUSE,
        "ingest",
        src,
        "--es",
        small.url,
        "--index",
        small.name,
        text=True,
    )
    one_line_error(done, "cannot read", "secret.md")
    assert small.es.get(index=f"{small.name}-meta", id="current")["_source"] == before
    assert small.es.count(index=f"{small.name}-meta", q="_id:ingest-lock")["count"] == 0


def test_a_held_lock_refuses_a_second_ingest(small):
    assert small.ingest().returncode == 0
    small.es.create(
        index=f"{small.name}-meta",
        id="ingest-lock",
        refresh=True,
        document={"owner": "elsewhere pid 1", "since": 0},
    )
    one_line_error(small.ingest(), "holds the lock", "--break-lock")
    assert small.ingest("--break-lock").returncode == 0


def test_a_damaged_published_tree_is_replaced_by_the_next_ingest(small):
    assert small.ingest().returncode == 0
    small.es.index(
        index=f"{small.name}-meta", id="tree-1-0", document={"data": "AAAA"}, refresh=True
    )
    done = small.ingest()
    assert done.returncode == 0, done.stderr
    assert "cannot be used" in done.stderr and "3 added" in done.stdout
    _, tree = with_store(small, lambda s: s.load_tree(EVERYTHING))
    assert tree.file_count == 3


def test_a_cached_tree_spares_the_download_and_a_damaged_one_is_a_miss(small, es, tmp_path):
    assert small.ingest().returncode == 0
    cache = TreeCache(tmp_path / "trees")
    _, first = with_store(small, lambda s: s.load_tree(EVERYTHING, cache))
    (entry,) = (tmp_path / "trees").iterdir()
    # With the document gone from Elasticsearch, only the cache can give the tree.
    meta = f"{small.name}-meta"
    pointer = es.get(index=meta, id="current")["_source"]
    parts = [f"tree-{pointer['version']}-{n}" for n in range(pointer["parts"])]
    saved = {part: es.get(index=meta, id=part)["_source"] for part in parts}
    for part in saved:
        es.delete(index=meta, id=part, refresh=True)
    _, again = with_store(small, lambda s: s.load_tree(EVERYTHING, cache))
    assert list(again.files()) == list(first.files())
    _, public = with_store(small, lambda s: s.load_tree(Viewer(), cache))
    assert [f.path for f in public.files()] == ["a.md", "b/b.md", "c.md"]
    with pytest.raises(TreeError):
        with_store(small, lambda s: s.load_tree(EVERYTHING))
    # A damaged entry is fetched again, and replaced.
    for part, source in saved.items():
        es.index(index=meta, id=part, document=source, refresh=True)
    entry.write_bytes(b"garbage")
    _, fetched = with_store(small, lambda s: s.load_tree(EVERYTHING, cache))
    assert list(fetched.files()) == list(first.files())
    assert TreeCache(tmp_path / "trees").get(small.name, entry.name.split(".")[1]) is not None
