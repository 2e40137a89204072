"""The path tree: every directory and file of a published docs index, in memory.

A mount loads the tree once and answers `lookup`, `getattr`, `readdir` and
`statfs` from it alone, so listing and stat never wait on Elasticsearch. The
tree is also the unit of publication: `encode`/`decode` turn it into the
compressed document that ingest stores last, once all contents are in place.

Inodes are positions in flat per-field lists (inode 1 is the root), because a
million small objects cost several times the memory of a few long lists.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from esfuse.access import PUBLIC, Access, Viewer
from esfuse.errors import TreeError

log = logging.getLogger(__name__)

FORMAT = 3
ROOT = 1


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A regular file: where it is, how big, when it changed, what it holds, who sees it."""

    path: str
    size: int
    mtime_ns: int
    digest: str
    access: Access = PUBLIC
    url: str | None = None  # content outside Elasticsearch, fetched on first read


@dataclass(frozen=True, slots=True)
class DirRecord:
    """A directory; the root is the one with path ``""``."""

    path: str
    mtime_ns: int
    access: Access = PUBLIC


class Node(NamedTuple):
    """What `getattr` needs to know about one inode.

    A named tuple: made in half the time of a frozen dataclass (1.4 us against
    2.7). What a directory listing needs per entry comes from `Tree.stat`.
    """

    inode: int
    is_dir: bool
    size: int
    mtime_ns: int
    nlink: int
    digest: str | None


def _checked(name: str) -> str:
    """A directory entry's name, if it is one that cannot escape the tree."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise TreeError(f"invalid name in tree: {name!r}")
    return name


def split_path(path: str) -> list[str]:
    """The components of a relative path, refusing anything that could escape the tree."""
    if path == "":
        return []
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", "..") or "\0" in part:
            raise TreeError(f"invalid path in tree: {path!r}")
    return parts


class Tree:
    """An immutable directory tree with integer inodes.

    Built with `previous`, a tree keeps the inode of every path whose kind, and
    for a file whose content, is unchanged, and gives everything else a number
    the previous tree never used. So an inode's content never changes: the
    kernel's page cache stays right, and a file opened before a refresh keeps
    reading the version it opened, as after a rename over it on a disk.
    """

    def __init__(
        self, dirs: Iterable[DirRecord], files: Iterable[FileRecord], previous: Tree | None = None
    ) -> None:
        size = len(previous._names) if previous is not None else 1
        self._names: list[bytes | None] = [None] * size
        self._parents: list[int] = [ROOT] * size
        self._mtimes: list[int] = [0] * size
        self._sizes: list[int] = [0] * size
        self._digests: list[str | None] = [None] * size
        self._subdirs: list[int] = [0] * size
        self._names[0] = b""
        self._children: dict[int, dict[bytes, int]] = {ROOT: {}}
        self._listings: dict[int, list[tuple[bytes, int]]] = {}
        self._dir_index: dict[str, int] = {"": ROOT}
        self._previous = previous
        self._inherited_dirs = {ROOT}
        self.total_size = 0
        self.file_count = 0
        self.inode_count = 1
        self.externals: dict[str, tuple[str, int]] = {}  # digest -> (URL, size)
        for d in dirs:
            self._mtimes[self._ensure_dir(d.path) - 1] = d.mtime_ns
        for f in files:
            self._add_file(f)
        for inode, children in self._children.items():
            self._children[inode] = dict(sorted(children.items()))
        # Only needed while building; keeping them would keep every old tree alive.
        del self._dir_index, self._previous, self._inherited_dirs

    @classmethod
    def from_columns(cls, columns: Columns) -> Tree:
        """The tree of a whole decoded document, numbered as the document numbers it.

        One pass, with no paths built: the document already lists each
        directory's entries in order, after their parent.
        """
        tree = cls.__new__(cls)
        count = len(columns.names)
        # Whole-column checks and conversions run in C: a million entries cost
        # several seconds one Python step at a time.
        joined = "\0".join(columns.names)
        if (
            "/" in joined
            or joined.count("\0") != max(count - 1, 0)
            or any(bad in columns.names for bad in ("", ".", ".."))
        ):
            raise TreeError("invalid name in tree: empty, '.', '..', or holding '/' or NUL")
        names: list[bytes | None] = [b""]
        if count:
            names += joined.encode("utf-8", "surrogateescape").split(b"\0")
        if columns.sizes and min(columns.sizes) < 0:
            raise TreeError("negative size in tree")
        children: dict[int, dict[bytes, int]] = {ROOT: {}}
        subdirs = [0] * (count + 1)
        for inode, encoded, parent, digest in zip(
            range(2, count + 2), names[1:], columns.parents, columns.digests, strict=True
        ):
            siblings = children.get(parent)
            if siblings is None:
                raise TreeError(f"entry {encoded!r} does not follow a directory it is in")
            siblings[encoded] = inode  # type: ignore[index]
            if digest is None:
                children[inode] = {}
                subdirs[parent - 1] += 1
        # Each directory's entries in order, none twice (a duplicate would have
        # replaced the first): sorting a sorted list is one pass.
        placed = 0
        for entries in children.values():
            keys = list(entries)
            if keys != sorted(keys):
                raise TreeError("entries out of order in tree")
            placed += len(keys)
        if placed != count:
            raise TreeError("duplicate entry in tree")
        total = sum(columns.sizes)
        files = count - (len(children) - 1)
        tree._names = names
        tree._parents = [ROOT, *columns.parents]
        tree._mtimes = [columns.root_mtime_ns, *columns.mtimes]
        tree._sizes = [0, *columns.sizes]
        tree._digests = [None, *columns.digests]
        tree._subdirs = subdirs
        tree._children = children
        tree._listings = {}
        tree.total_size, tree.file_count, tree.inode_count = total, files, count + 1
        tree.externals = {
            columns.digests[i]: (url, columns.sizes[i])  # type: ignore[misc]
            for i, url in columns.urls.items()
        }
        return tree

    @property
    def slots(self) -> int:
        """One more than the largest inode number this tree uses."""
        return len(self._names) + 1

    @property
    def dir_count(self) -> int:
        return len(self._children)

    def _inherited(self, parent: int, name: bytes, digest: str | None, size: int) -> int | None:
        """The previous tree's inode for this entry, if it may be kept."""
        previous = self._previous
        if previous is None or parent not in self._inherited_dirs:
            return None
        old = previous.lookup(parent, name)
        if old is None:
            return None
        if digest is None:
            return old if previous.is_dir(old) else None
        node = previous.node(old)
        return old if (node.digest, node.size) == (digest, size) else None

    def _new_inode(
        self, parent: int, name: str, mtime_ns: int, size: int, digest: str | None
    ) -> int:
        children = self._children[parent]
        encoded = name.encode("utf-8", "surrogateescape")
        if encoded in children:
            raise TreeError(f"duplicate entry in tree: {self.path(parent)}/{name}")
        inode = self._inherited(parent, encoded, digest, size)
        if inode is None:
            for column in (
                self._names,
                self._parents,
                self._mtimes,
                self._sizes,
                self._digests,
                self._subdirs,
            ):
                column.append(column[0] if column is not self._names else None)  # type: ignore[arg-type]
            inode = len(self._names)
        elif digest is None:
            self._inherited_dirs.add(inode)
        i = inode - 1
        self._names[i] = encoded
        self._parents[i] = parent
        self._mtimes[i] = mtime_ns
        self._sizes[i] = size
        self._digests[i] = digest
        self._subdirs[i] = 0
        children[encoded] = inode
        self.inode_count += 1
        return inode

    def _ensure_dir(self, path: str) -> int:
        known = self._dir_index.get(path)
        if known is not None:
            return known
        parts = split_path(path)
        parent = self._ensure_dir("/".join(parts[:-1]))
        if parts[-1].encode("utf-8", "surrogateescape") in self._children[parent]:
            raise TreeError(f"tree has both a file and a directory at {path!r}")
        inode = self._new_inode(parent, parts[-1], 0, 0, None)
        self._children[inode] = {}
        self._subdirs[parent - 1] += 1
        self._dir_index[path] = inode
        return inode

    def _add_file(self, f: FileRecord) -> None:
        parts = split_path(f.path)
        if not parts:
            raise TreeError("a file record has an empty path")
        if f.size < 0:
            raise TreeError(f"negative size for {f.path!r}")
        parent = self._ensure_dir("/".join(parts[:-1]))
        self._new_inode(parent, parts[-1], f.mtime_ns, f.size, f.digest)
        if f.url is not None:
            self.externals[f.digest] = (f.url, f.size)
        self.total_size += f.size
        self.file_count += 1

    # -- queries -------------------------------------------------------------

    def _check(self, inode: int) -> int:
        if not 1 <= inode <= len(self._names) or self._names[inode - 1] is None:
            raise KeyError(inode)
        return inode - 1

    def is_dir(self, inode: int) -> bool:
        return inode in self._children

    def node(self, inode: int) -> Node:
        return Node(inode, *self.stat(inode), self._digests[inode - 1])

    def stat(self, inode: int) -> tuple[bool, int, int, int]:
        """(is_dir, size, mtime_ns, nlink), without a Node: a first `ls -l` of a
        directory asks for one per entry, and this takes 0.7 us against 2.0."""
        i = self._check(inode)
        if inode in self._children:
            return True, self._sizes[i], self._mtimes[i], 2 + self._subdirs[i]
        return False, self._sizes[i], self._mtimes[i], 1

    def parent(self, inode: int) -> int:
        return self._parents[self._check(inode)]

    def lookup(self, parent: int, name: bytes) -> int | None:
        """The inode of `name` in directory `parent`, or None."""
        children = self._children.get(parent)
        return None if children is None else children.get(name)

    def listing(self, inode: int) -> list[tuple[bytes, int]]:
        """A directory's entries, sorted by name; stable, so offsets into it are too."""
        listing = self._listings.get(inode)
        if listing is None:
            listing = self._listings[inode] = list(self._children[inode].items())
        return listing

    def unindexed(self, size: int) -> list[int]:
        """Inodes of files the text index cannot answer for: larger than `size` bytes
        (directories have size 0), or external."""
        if not self.externals and max(self._sizes) <= size:
            return []  # the usual case, found in C: a pass in Python took 0.3 s at 1M files
        return [
            i + 1
            for i, (s, d) in enumerate(zip(self._sizes, self._digests, strict=True))
            if s > size or d in self.externals
        ]

    def resolve(self, path: str) -> int | None:
        """The inode at a relative path, or None."""
        inode: int | None = ROOT
        for part in path.strip("/").split("/") if path.strip("/") else []:
            inode = self.lookup(inode, part.encode("utf-8", "surrogateescape"))
            if inode is None:
                return None
        return inode

    def _name(self, i: int) -> bytes:
        name = self._names[i]
        assert name is not None
        return name

    def path(self, inode: int) -> str:
        parts: list[str] = []
        while inode != ROOT:
            i = self._check(inode)
            parts.append(self._name(i).decode("utf-8", "surrogateescape"))
            inode = self._parents[i]
        return "/".join(reversed(parts))

    def files(self) -> Iterator[FileRecord]:
        """Every file, depth first in name order."""
        return (record for _, record in self.files_under(ROOT))

    def files_under(self, inode: int) -> Iterator[tuple[int, FileRecord]]:
        """(inode, record) of every file at or below `inode`, depth first in name order."""
        if inode not in self._children:
            yield inode, self._record(inode, self.path(inode))
            return
        base = self.path(inode)
        for child, path in self._walk(inode, base + "/" if base else ""):
            if child not in self._children:
                yield child, self._record(child, path)

    def file_inodes(self, top: int = ROOT) -> Iterator[int]:
        """The files at or below `top`, in the order a depth-first traversal by name
        meets them (the order of `grep -r`); no paths are built."""
        stack = [top]
        while stack:
            inode = stack.pop()
            if inode in self._children:
                # Pushed in reverse, so that pops come in name order.
                stack.extend(child for _, child in reversed(self.listing(inode)))
            else:
                yield inode

    def pages(self, page_size: int) -> int:
        """How many pages of `page_size` bytes the files fill, each file its own."""
        return sum(-(-size // page_size) for size in self._sizes)

    def content(self, inode: int) -> tuple[str | None, int]:
        """(digest, size) of an inode (no digest for a directory), without a Node."""
        i = self._check(inode)
        return self._digests[i], self._sizes[i]

    def contents_of(self, inodes: Iterable[int]) -> Iterator[tuple[str, int]]:
        """(digest, size) of the files among `inodes`, in their order."""
        for inode in inodes:
            digest, size = self.content(inode)
            if digest is not None:
                yield digest, size

    def contents(self) -> Iterator[tuple[str, int]]:
        """(digest, size) of each content held in Elasticsearch, once, in traversal order."""
        seen: set[str] = set()
        for digest, size in self.contents_of(self.file_inodes()):
            if digest not in seen and digest not in self.externals:
                seen.add(digest)
                yield digest, size

    def content_sizes(self) -> dict[str, int]:
        """The size of each content held in Elasticsearch, by digest, in no order:
        a pass over columns, where `contents` walks the tree."""
        sizes = {d: s for d, s in zip(self._digests, self._sizes, strict=True) if d is not None}
        for digest in self.externals:
            sizes.pop(digest, None)
        return sizes

    def _record(self, inode: int, path: str) -> FileRecord:
        i = self._check(inode)
        digest = self._digests[i] or ""
        url = self.externals[digest][0] if digest in self.externals else None
        return FileRecord(path, self._sizes[i], self._mtimes[i], digest, PUBLIC, url)

    def dirs(self) -> Iterator[DirRecord]:
        yield DirRecord("", self._mtimes[0])
        for inode, path in self._walk(ROOT, ""):
            if inode in self._children:
                yield DirRecord(path, self._mtimes[inode - 1])

    def _walk(self, inode: int, prefix: str) -> Iterator[tuple[int, str]]:
        for name, child in self.listing(inode):
            path = prefix + name.decode("utf-8", "surrogateescape")
            yield child, path
            if child in self._children:
                yield from self._walk(child, path + "/")


# -- the tree document ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Columns:
    """A decoded tree document: one entry per directory or file, parents first.

    Entry ``i`` is inode ``i + 2`` (the root, inode 1, is not an entry), and
    entries come depth first with each directory's children in name order, so
    a mount can take the columns as its inode table as they are.
    """

    table: list[Access]  # every visibility the entries refer to, by position
    root_mtime_ns: int
    root_access: int
    names: list[str]
    parents: list[int]
    mtimes: list[int]
    sizes: list[int]
    digests: list[str | None]  # None for a directory
    access: list[int]
    urls: dict[int, str]  # entry -> URL of content outside Elasticsearch

    def entries(self) -> tuple[list[Any], ...]:
        """The per-entry columns, in the order the constructor takes them."""
        return self.names, self.parents, self.mtimes, self.sizes, self.digests, self.access


def encode(dirs: Iterable[DirRecord], files: Iterable[FileRecord]) -> bytes:
    """The compressed tree document that ingest publishes, from consistent records.

    Columns of short names rather than records of full paths: a mount decodes
    tldr's 38,405 files several times faster so (0.24 s as records). Each
    entry names its visibility by position in a shared table, since a handful
    of distinct visibilities cover thousands of files.
    """
    root = DirRecord("", 0)
    entries: dict[str, DirRecord | FileRecord] = {}
    for record in (*dirs, *files):
        if record.path == "" and isinstance(record, DirRecord):
            root = record
        elif entries.setdefault(record.path, record) is not record:
            raise TreeError(f"duplicate entry in tree: {record.path}")
    for path in list(entries):
        for parent in _parents(path)[:-1]:
            if parent in entries:
                break
            entries[parent] = DirRecord(parent, 0)
    table: dict[Access, int] = {}
    index = {"": ROOT}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "root": [root.mtime_ns, table.setdefault(root.access, len(table))],
        **{column: [] for column in ("names", "parents", "mtimes", "sizes", "digests", "access")},
        "urls": {},
    }
    for i, path in enumerate(sorted(entries, key=_sort_key)):
        record = entries[path]
        parent, _, name = path.rpartition("/")
        index[path] = i + 2
        doc["names"].append(name)
        doc["parents"].append(index[parent])
        doc["mtimes"].append(record.mtime_ns)
        doc["access"].append(table.setdefault(record.access, len(table)))
        is_file = isinstance(record, FileRecord)
        doc["sizes"].append(record.size if is_file else 0)
        doc["digests"].append(record.digest if is_file else None)
        if is_file and record.url is not None:
            doc["urls"][str(i)] = record.url
    doc["table"] = [[a.public, list(a.groups)] for a in table]
    # ensure_ascii keeps names that are not valid UTF-8 (surrogate escapes) encodable.
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode("ascii"), mtime=0)


def _sort_key(path: str) -> list[bytes]:
    # Components compared as bytes: the order of a Tree's listings, and depth first.
    return [part.encode("utf-8", "surrogateescape") for part in path.split("/")]


def decode_columns(blob: bytes) -> Columns:
    """The columns of `encode`'s output; a damaged document is a TreeError, never a crash.

    Types and references are checked here; names and structure by the Tree built
    from the columns.
    """
    try:
        doc = json.loads(gzip.decompress(blob))
    except (OSError, EOFError, ValueError) as e:
        raise TreeError(f"tree document is corrupt: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TreeError(f"tree document has format {found!r}; this esfuse reads format {FORMAT}")
    try:
        table = [Access(_bool(p), tuple(_str(g) for g in gs)) for p, gs in doc["table"]]
        root_mtime, root_access = doc["root"]
        names, parents, mtimes, sizes, digests, access = (
            doc[k] for k in ("names", "parents", "mtimes", "sizes", "digests", "access")
        )
        columns = (names, parents, mtimes, sizes, digests, access)
        if len({len(c) if isinstance(c, list) else -1 for c in columns}) != 1:
            raise ValueError("columns of different lengths")
        _check_types(names, str)
        _check_types(digests, (str, type(None)))
        for column in (parents, mtimes, sizes, access):
            _check_types(column, int)
        if not all(0 <= a < len(table) for a in (root_access, *set(access))):
            raise ValueError("a visibility that is not in the table")
        urls = {int(i): _str(u) for i, u in doc["urls"].items()}
        if any(not 0 <= i < len(names) or digests[i] is None for i in urls):
            raise ValueError("a URL for an entry that is not a file")
        return Columns(
            table, _int(root_mtime), _int(root_access), names, parents, mtimes, sizes,
            digests, access, urls,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise TreeError(f"tree document is corrupt: bad record ({e})") from None


def _check_types(column: list[Any], kind: type | tuple[type, ...]) -> None:
    # type(), not isinstance: json gives exact types, and True must not pass for an int.
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(column, list) or not set(map(type, column)) <= set(kinds):
        raise TypeError(f"a column holds something other than {kinds[0].__name__}")


def records(columns: Columns) -> tuple[list[DirRecord], list[FileRecord]]:
    """The columns as records with full paths, for ingest, refresh and access pruning."""
    paths = {ROOT: ""}
    table = columns.table
    dirs = [DirRecord("", columns.root_mtime_ns, table[columns.root_access])]
    files: list[FileRecord] = []
    for i, (name, parent, mtime, size, digest, access) in enumerate(
        zip(*columns.entries(), strict=True)
    ):
        if parent not in paths:
            raise TreeError(f"tree document is corrupt: entry {name!r} comes before its parent")
        path = paths[parent] + "/" + _checked(name) if parent != ROOT else _checked(name)
        if digest is None:
            paths[i + 2] = path
            dirs.append(DirRecord(path, mtime, table[access]))
        else:
            url = columns.urls.get(i)
            files.append(FileRecord(path, size, mtime, digest, table[access], url))
    return dirs, files


def decode(blob: bytes) -> tuple[list[DirRecord], list[FileRecord]]:
    """The records of `encode`'s output; a damaged document is a TreeError, never a crash."""
    return records(decode_columns(blob))


def visible(
    dirs: list[DirRecord], files: list[FileRecord], viewer: Viewer
) -> tuple[list[DirRecord], list[FileRecord]]:
    """The records `viewer` may see. A directory holding files shows only if one of them
    does; a directory holding none (empty, or only empty directories) follows its own rule
    and those of its ancestors, so that it cannot reveal a hidden parent."""
    # Decoded records share their Access objects: a handful to test, usually all seen.
    accesses = {id(r.access): r.access for r in (*dirs, *files)}
    if all(viewer.sees(a) for a in accesses.values()):
        return dirs, files
    shown = [f for f in files if viewer.sees(f.access)]
    holds_files = _ancestors(f.path for f in files)
    holds_shown = _ancestors(f.path for f in shown)
    hidden_dirs = holds_files - holds_shown
    by_path = {d.path: d for d in dirs}

    def empty_and_seen(d: DirRecord) -> bool:
        chain = [d.path, *_parents(d.path)]
        return (
            d.path not in holds_files
            and not hidden_dirs.intersection(chain)
            and all(viewer.sees(by_path[p].access) for p in chain if p in by_path)
        )

    return [d for d in dirs if d.path in holds_shown or empty_and_seen(d)], shown


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)] if path else []


def _ancestors(paths: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for parent in _parents(path):
            if parent in found:
                break
            found.add(parent)
    return found


def load_columns(columns: Columns, viewer: Viewer) -> Tree:
    """The tree `viewer` may see, from a decoded tree document."""
    if all(viewer.sees(a) for a in columns.table):
        return Tree.from_columns(columns)  # the usual case: nothing to prune
    return Tree(*visible(*records(columns), viewer))


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


# -- what a refresh changed -------------------------------------------------------


@dataclass
class Changes:
    """What the kernel must forget when `new` replaces `old` (inodes are shared)."""

    gone: list[tuple[int, bytes, int]] = field(default_factory=list)  # (parent, name, inode)
    added: list[tuple[int, bytes]] = field(default_factory=list)  # names new or now elsewhere
    touched: list[int] = field(default_factory=list)  # live in both, attributes changed

    def __bool__(self) -> bool:
        return bool(self.gone or self.added or self.touched)


def changes(old: Tree, new: Tree) -> Changes:
    found = Changes()
    for inode in range(1, old.slots):
        try:
            before = old.node(inode)
            after = new.node(inode)
        except KeyError:
            continue  # gone: reported through its parent's entry below
        if before != after:
            found.touched.append(inode)
        if before.is_dir:
            was, now = old._children[inode], new._children[inode]
            found.gone += [(inode, n, i) for n, i in was.items() if now.get(n) != i]
            found.added += [(inode, n) for n, i in now.items() if was.get(n) != i]
    return found
