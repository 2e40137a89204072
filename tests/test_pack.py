"""Pure units: packs of contents on local disk, and reading through them first."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from esfuse.pack import TAG, Keeper, Packs
from esfuse.tree import FileRecord, Tree
from tests.test_cache import Loader

CONTENTS = [b"alpha\n", b"", "ünïcode ✓\n".encode(), bytes(range(256)) * 20]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def packs(tmp_path: Path) -> Packs:
    packs = Packs(tmp_path / "packs")
    packs.write("docs", [(digest(c), c) for c in CONTENTS])
    return packs


def pack_file(packs: Packs) -> Path:
    (path,) = packs.directory.iterdir()
    return path


def test_a_pack_gives_back_what_was_written(packs):
    pack = packs.open("docs")
    assert pack is not None and len(pack) == len(CONTENTS)
    try:
        for content in CONTENTS:
            assert pack.get(digest(content)) == content
        assert pack.get(digest(b"never written")) is None
        view = pack.get(digest(CONTENTS[0]))
        with pytest.raises(BufferError):
            pack.close()  # a view of it is still held: the pack stays open
        assert pack.get(digest(CONTENTS[2])) == CONTENTS[2]
        assert view is not None
        view.release()
    finally:
        pack.close()
    assert packs.open("other") is None
    assert pack_file(packs).parent.stat().st_mode & 0o077 == 0  # only its owner reads it


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"not a pack at all",
        lambda data: data[: len(TAG) + 3],  # cut inside the checksum
        lambda data: data[: len(TAG) + 32] + b"\x09" + data[len(TAG) + 33 :],  # the count
        lambda data: data[:-1],  # one byte short of its index
        lambda data: data + b"x",  # one byte past it
        lambda data: b"esfuse-pack-0\n" + data[len(TAG) :],  # another layout
        lambda data: data.replace(b"alpha\n", b"alpHa\n"),  # one content damaged
        lambda data: data[:-40] + bytes(40),  # the index intact, the end zeroed
    ],
    ids=["garbage", "cut", "count", "short", "long", "old-tag", "content", "zeroed"],
)
def test_an_unreadable_pack_is_no_pack(packs, damage, caplog):
    path = pack_file(packs)
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.WARNING):
        assert packs.open("docs") is None
    assert "ignoring the pack" in caplog.text


def test_the_keeper_gives_one_chunk_contents_only(packs):
    keeper = Keeper(packs, "docs", chunk_size=len(CONTENTS[3]) - 1)
    trio.run(keeper.open)
    assert keeper.pack is not None
    assert keeper.get(digest(b"alpha\n"), 6) == b"alpha\n"
    assert keeper.get(digest(CONTENTS[3]), len(CONTENTS[3])) is None  # two chunks here
    assert keeper.get(digest(b""), 0) is None
    assert keeper.get(digest(b"never written"), 13) is None


def test_lacking_walks_the_tree_only_for_what_the_pack_does_not_serve(packs, monkeypatch):
    keeper = Keeper(packs, "docs", chunk_size=len(CONTENTS[3]) - 1)
    records = [FileRecord(f"held-{n}", len(c), 1, digest(c)) for n, c in enumerate(CONTENTS)]
    tree = Tree([], [*records[:3], FileRecord("empty-too", 0, 1, digest(b"nowhere"))])
    assert list(keeper.lacking(tree)) == list(tree.contents())  # no pack open yet
    trio.run(keeper.open)

    def walk() -> None:
        raise AssertionError("walked the tree with nothing to load")

    monkeypatch.setattr(tree, "contents", walk)
    assert list(keeper.lacking(tree)) == []  # empty files need no load
    external = FileRecord("x", 1, 1, "e", url="file:///x")
    more = Tree([], [*records, FileRecord("new", 3, 1, digest(b"new")), external])
    # The pack holds CONTENTS[3], but it is two chunks here, which the pack never serves.
    assert list(keeper.lacking(more)) == [
        (digest(CONTENTS[3]), len(CONTENTS[3])),
        (digest(b"new"), 3),
    ]


def test_a_pack_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING):
        Packs(tmp_path / "file" / "packs").write("docs", [(digest(b"a"), b"a")])
    assert "cannot keep the contents" in caplog.text


def test_the_loader_asks_the_backend_only_for_what_the_pack_lacks(packs):
    kept, missing, second_chunk = digest(CONTENTS[0]), digest(b"missing"), (digest(CONTENTS[3]), 1)
    backend = Loader({(missing, 0): b"missing", second_chunk: b"tail"})
    keeper = Keeper(packs, "docs", chunk_size=1 << 20)
    load = keeper.loader(backend)

    async def main() -> tuple[dict, dict]:
        before = await load([(kept, 0)])  # no pack open yet: all from the backend
        await keeper.open()
        return before, await load([(kept, 0), (missing, 0), second_chunk])

    backend.chunks[(kept, 0)] = b"alpha\n"
    before, after = trio.run(main)
    assert before == {(kept, 0): b"alpha\n"}
    assert after == {(kept, 0): b"alpha\n", (missing, 0): b"missing", second_chunk: b"tail"}
    # Only one-chunk contents come from the pack: a later chunk goes to the backend.
    assert backend.calls == [[(kept, 0)], [(missing, 0), second_chunk]]
    assert keeper.fetched == 3


def test_a_read_waits_for_the_pack_being_opened(packs):
    backend = Loader({})
    keeper = Keeper(packs, "docs", chunk_size=1 << 20)
    load = keeper.loader(backend)

    async def main() -> dict:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.open)
            await trio.testing.wait_all_tasks_blocked()  # the open is under way
            return await load([(digest(b"alpha\n"), 0)])

    assert trio.run(main) == {(digest(b"alpha\n"), 0): b"alpha\n"}
    assert backend.calls == []
