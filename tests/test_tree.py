"""Pure units: the path tree and its document."""

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esfuse.access import Viewer
from esfuse.errors import TreeError
from esfuse.tree import (
    ROOT,
    DirRecord,
    FileRecord,
    Tree,
    decode,
    decode_columns,
    encode,
    load_columns,
)

FILES = [
    FileRecord("b.md", 3, 30, "d1"),
    FileRecord("a/x.md", 5, 50, "d2"),
    FileRecord("a/sub/y.md", 0, 60, "d3"),
    FileRecord("café/naïve résumé.md", 7, 70, "d4"),
]
DIRS = [DirRecord("", 1), DirRecord("a", 2), DirRecord("empty", 9)]


@pytest.fixture
def tree():
    return Tree(DIRS, FILES)


def names(tree, inode):
    return [name for name, _ in tree.listing(inode)]


def test_listing_is_sorted_and_holds_implicit_and_empty_dirs(tree):
    assert names(tree, ROOT) == [b"a", b"b.md", "café".encode(), b"empty"]
    assert names(tree, tree.resolve("a")) == [b"sub", b"x.md"]
    assert names(tree, tree.resolve("empty")) == []


def test_nodes_carry_size_mtime_digest_and_nlink(tree):
    f = tree.node(tree.resolve("a/x.md"))
    assert (f.is_dir, f.size, f.mtime_ns, f.digest, f.nlink) == (False, 5, 50, "d2", 1)
    a = tree.node(tree.resolve("a"))
    assert (a.is_dir, a.mtime_ns, a.nlink) == (True, 2, 3)
    assert tree.node(ROOT).nlink == 2 + 3
    assert tree.node(ROOT).mtime_ns == 1


def test_lookup_resolve_and_path_agree(tree):
    for f in FILES:
        inode = tree.resolve(f.path)
        assert inode is not None and tree.path(inode) == f.path
    assert tree.lookup(ROOT, b"missing") is None
    assert tree.lookup(tree.resolve("b.md"), b"x") is None  # a file has no children
    assert tree.resolve("a/x.md/y") is None
    assert tree.parent(tree.resolve("a/sub")) == tree.resolve("a")


def test_counts(tree):
    assert tree.file_count == 4
    assert tree.total_size == 15
    assert tree.dir_count == 5  # root, a, a/sub, café, empty
    assert tree.inode_count == 9


def test_unknown_inode_is_a_key_error(tree):
    with pytest.raises(KeyError):
        tree.node(999)
    with pytest.raises(KeyError):
        tree.node(0)


def test_document_round_trip(tree):
    again = Tree(*decode(encode(tree.dirs(), tree.files())))
    assert list(again.files()) == list(tree.files())
    assert list(again.dirs()) == list(tree.dirs())


@pytest.mark.parametrize("path", ["", "/abs", "a//b", "a/./b", "../up", "a/..", "nul\0x"])
def test_paths_that_could_escape_are_refused(path):
    with pytest.raises(TreeError):
        Tree([], [FileRecord(path, 1, 1, "d")])


def test_duplicates_and_file_dir_clashes_are_refused():
    with pytest.raises(TreeError, match="duplicate"):
        Tree([], [FileRecord("x", 1, 1, "d"), FileRecord("x", 1, 1, "d")])
    with pytest.raises(TreeError, match="both a file and a directory"):
        Tree([], [FileRecord("x", 1, 1, "d"), FileRecord("x/y", 1, 1, "d")])
    with pytest.raises(TreeError, match="duplicate"):
        Tree([], [FileRecord("x/y", 1, 1, "d"), FileRecord("x", 1, 1, "d")])


def v3(**changes) -> dict:
    """A valid one-file document (a/x.md), with some fields replaced."""
    doc = {
        "format": 3,
        "table": [[True, []]],
        "root": [1, 0],
        "names": ["a", "x.md"],
        "parents": [1, 2],
        "mtimes": [1, 1],
        "sizes": [0, 5],
        "digests": [None, "d"],
        "access": [0, 0],
        "urls": {},
    }
    return {**doc, **changes}


def doc(payload) -> bytes:
    return gzip.compress(json.dumps(payload).encode())


def test_the_valid_example_is_valid():
    tree = load_columns(decode_columns(doc(v3())), Viewer())
    assert [f.path for f in tree.files()] == ["a/x.md"]


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"not gzip", "corrupt"),
        (gzip.compress(b"{not json"), "corrupt"),
        (gzip.compress(b"x" * 10)[:-4], "corrupt"),
        (doc([1, 2]), "format"),
        (doc({"format": 99}), "format 99"),
        (doc({"format": 2, "dirs": [], "files": []}), "format 2"),
        (doc({k: v for k, v in v3().items() if k != "sizes"}), "corrupt"),
        (doc(v3(sizes=[0, "big"])), "corrupt"),
        (doc(v3(sizes=[0, True])), "corrupt"),
        (doc(v3(sizes=[0])), "corrupt"),
        (doc(v3(digests=[None, 7])), "corrupt"),
        (doc(v3(access=[0, 7])), "corrupt"),
        (doc(v3(root=[1, 3])), "corrupt"),
        (doc(v3(table=[["yes", []]])), "corrupt"),
        (doc(v3(urls={"0": "http://x/"})), "corrupt"),
        (doc(v3(urls={"x": "http://x/"})), "corrupt"),
        (doc(v3(names=["a", ".."])), "invalid"),
        (doc(v3(names=["a", "b/c"])), "invalid"),
        (doc(v3(parents=[1, 3])), "does not follow|before its parent"),
        (doc(v3(parents=[2, 1])), "does not follow|before its parent"),
        (doc(v3(names=["a", "a"], parents=[1, 1])), "duplicate"),
        (doc(v3(sizes=[0, -1])), "negative"),
    ],
)
@pytest.mark.parametrize("viewer", [Viewer(), Viewer(frozenset({"x"}))])
def test_broken_documents_are_tree_errors(blob, message, viewer):
    with pytest.raises(TreeError, match=message):
        Tree(*decode(blob))
    with pytest.raises(TreeError, match=message):
        load_columns(decode_columns(blob), viewer)


def test_the_fast_path_and_the_record_path_build_the_same_tree():
    blob = encode(DIRS, FILES)
    fast, slow = Tree.from_columns(decode_columns(blob)), Tree(*decode(blob))
    assert list(fast.files()) == list(slow.files()) and list(fast.dirs()) == list(slow.dirs())
    for path in ("", "a", "a/sub", "a/x.md", "café", "empty"):
        one, other = fast.node(fast.resolve(path)), slow.node(slow.resolve(path))
        assert (one.nlink, one.size, one.mtime_ns) == (other.nlink, other.size, other.mtime_ns)
    assert (fast.total_size, fast.file_count, fast.inode_count, fast.dir_count) == (
        slow.total_size, slow.file_count, slow.inode_count, slow.dir_count,
    )  # fmt: skip


name = st.text(
    st.characters(blacklist_characters="/\0", blacklist_categories=["Cs"]), min_size=1, max_size=8
).filter(lambda s: s not in (".", ".."))


@given(st.lists(st.lists(name, min_size=1, max_size=4), max_size=30))
def test_any_consistent_set_of_paths_round_trips(paths):
    files, seen = [], set()
    for parts in paths:
        path = "/".join(parts)
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts))}
        if path in seen or prefixes & seen or any(p.startswith(path + "/") for p in seen):
            continue
        seen.add(path)
        files.append(FileRecord(path, len(path), 1, "d"))
    tree = Tree([], files)
    assert sorted(f.path for f in decode(encode(tree.dirs(), tree.files()))[1]) == sorted(seen)
    for f in files:
        assert tree.path(tree.resolve(f.path)) == f.path


def test_unindexed_lists_large_and_external_files_only(tree):
    assert sorted(tree.path(i) for i in tree.unindexed(4)) == ["a/x.md", "café/naïve résumé.md"]
    assert tree.unindexed(100) == []
    ext = Tree([], [FileRecord("x.json", 1, 1, "ext-1", url="file:///x"), *FILES])
    assert [ext.path(i) for i in ext.unindexed(100)] == ["x.json"]


def test_contents_come_once_each_in_traversal_order_without_externals():
    files = [
        *FILES,
        FileRecord("a/copy.md", 5, 1, "d2"),  # same content as a/x.md
        FileRecord("z.json", 4, 1, "ext", url="https://example.com/z.json"),
    ]
    tree = Tree(DIRS, files)
    # grep -r meets a/copy.md, a/sub/y.md, a/x.md, b.md, café/…, then z.json.
    assert list(tree.contents()) == [("d2", 5), ("d3", 0), ("d1", 3), ("d4", 7)]
    assert tree.content_sizes() == dict(tree.contents())
