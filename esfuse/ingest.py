"""`esfuse ingest`: a source directory into a docs index, incrementally and safely.

Order of work, so that a reader never meets a tree entry without its content
and a failure never damages what is published:

1. scan the source (stat only) and take the digests of files whose size and
   mtime match the published tree, hashing the rest (all with ``checksum``);
2. upload contents and text that Elasticsearch does not hold yet;
3. refresh, then publish the new tree (the pointer is written last);
4. collect garbage: documents referenced by neither the new tree nor the one
   it replaced (kept for mounts still reading it), and older tree parts.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from esfuse import store as layout
from esfuse.access import Access, Rules
from esfuse.errors import EsfuseError, TreeError
from esfuse.external import load_manifest
from esfuse.store import Pointer, Store
from esfuse.tree import DirRecord, FileRecord, Tree, decode, encode

log = logging.getLogger(__name__)

BATCH_BYTES = 8 << 20
BATCH_OPS = 1000
UPLOADERS = 2


@dataclass
class Scan:
    """What the source directory holds, relative to its root."""

    root: Path
    dirs: list[DirRecord] = field(default_factory=list)
    files: list[FileRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Summary:
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    uploaded_bytes: int = 0
    version: int = 0
    files: int = 0
    bytes: int = 0

    def line(self, src: Path, index: str, seconds: float) -> str:
        return (
            f"ingested {src} into {index!r}: {self.files} files, {self.bytes / 1e6:.1f} MB "
            f"({self.added} added, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged} unchanged; {self.uploaded_bytes / 1e6:.1f} MB uploaded), "
            f"tree version {self.version}, {seconds:.1f} s"
        )


def _utf8_name(path: Path, name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise EsfuseError(f"cannot ingest {path}: its name is not valid UTF-8") from None


def scan(root: Path, rules: Rules) -> Scan:
    """Stat every directory and regular file below `root`, with the access the rules give
    them; symlinks and devices are skipped."""
    if not root.is_dir():
        raise EsfuseError(f"source directory {root} does not exist or is not a directory")
    result = Scan(root)

    def visit(directory: Path, rel: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
            st = directory.stat()
        except OSError as e:
            raise EsfuseError(f"cannot read directory {directory}: {e.strerror}") from None
        result.dirs.append(DirRecord(rel, st.st_mtime_ns, rules.access_of(rel, is_dir=True)))
        for entry in entries:
            path = Path(entry.path)
            _utf8_name(path, entry.name)
            child = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                visit(path, child)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                access = rules.access_of(child)
                result.files.append(FileRecord(child, st.st_size, st.st_mtime_ns, "", access))
            else:
                result.skipped.append(child)

    visit(root, "")
    return result


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as e:
        raise EsfuseError(f"cannot read {path}: {e.strerror}") from None
    return h.hexdigest()


def with_digests(found: Scan, old: list[FileRecord], checksum: bool) -> list[FileRecord]:
    """Scanned files with digests: reused from the old tree when size and mtime agree."""
    known = {} if checksum else {f.path: f for f in old}
    result = []
    for f in found.files:
        prior = known.get(f.path)
        if prior is not None and (prior.size, prior.mtime_ns) == (f.size, f.mtime_ns):
            digest = prior.digest
        else:
            digest = file_digest(found.root / f.path)
        result.append(FileRecord(f.path, f.size, f.mtime_ns, digest, f.access))
    return result


def read_exact(path: Path, f: FileRecord) -> bytes:
    """The file's bytes, refusing a file that changed since it was hashed."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise EsfuseError(f"cannot read {path}: {e.strerror}") from None
    if len(data) != f.size or hashlib.sha256(data).hexdigest() != f.digest:
        raise EsfuseError(f"{path} changed while being ingested; run ingest again")
    return data


def access_fields(access: Access) -> dict[str, Any]:
    return {"public": access.public, "groups": list(access.groups)}


def documents(
    store: Store,
    root: Path,
    files: list[FileRecord],
    chunk_access: dict[str, Access],
    have: set[str],
) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """Bulk operations (with their payload size) for each file: its chunks if new, its text."""
    for f in files:
        data = read_exact(root / f.path, f)
        ops: list[dict[str, Any]] = []
        if f.digest not in have:
            have.add(f.digest)
            for n in range(layout.chunk_count(f.size, layout.CHUNK_SIZE)):
                chunk = data[n * layout.CHUNK_SIZE : (n + 1) * layout.CHUNK_SIZE]
                ops += [
                    {
                        "index": {
                            "_index": store.index("chunks"),
                            "_id": layout.chunk_id((f.digest, n)),
                        }
                    },
                    {
                        "data": base64.b64encode(chunk).decode("ascii"),
                        **access_fields(chunk_access[f.digest]),
                    },
                ]
        indexed = f.size <= layout.TEXT_LIMIT
        doc: dict[str, Any] = {
            "path": f.path,
            "digest": f.digest,
            "size": f.size,
            "indexed": indexed,
            **access_fields(f.access),
        }
        if indexed:
            doc["text"] = data.decode("utf-8", "replace")
        ops += [
            {
                "index": {
                    "_index": store.index("files"),
                    "_id": layout.file_doc_id(f.path, f.digest),
                }
            },
            doc,
        ]
        yield ops, f.size


def access_updates(
    store: Store, old: list[FileRecord], new: list[FileRecord], chunk_access: dict[str, Access]
) -> list[dict[str, Any]]:
    """Partial updates for documents that stay but whose visibility changed."""
    before = {(f.path, f.digest): f.access for f in old}
    ops: list[dict[str, Any]] = []
    for f in new:
        prior = before.get((f.path, f.digest))
        if prior is not None and prior != f.access and f.url is None:
            ops += [
                {
                    "update": {
                        "_index": store.index("files"),
                        "_id": layout.file_doc_id(f.path, f.digest),
                    }
                },
                {"doc": access_fields(f.access)},
            ]
    old_chunks = union_by_digest(old)
    sizes = {f.digest: f.size for f in new}
    for digest, access in chunk_access.items():
        if digest in old_chunks and old_chunks[digest] != access:
            for n in range(layout.chunk_count(sizes[digest], layout.CHUNK_SIZE)):
                ops += [
                    {
                        "update": {
                            "_index": store.index("chunks"),
                            "_id": layout.chunk_id((digest, n)),
                        }
                    },
                    {"doc": access_fields(access)},
                ]
    return ops


def union_by_digest(files: list[FileRecord]) -> dict[str, Access]:
    """Who may read each content: whoever may see any file that has it."""
    holders: dict[str, list[Access]] = {}
    for f in files:
        holders.setdefault(f.digest, []).append(f.access)
    return {digest: Access.union(accesses) for digest, accesses in holders.items()}


class Progress:
    """A one-line progress display on a terminal; silent otherwise."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.bytes = 0
        self.enabled = sys.stderr.isatty()
        self._shown = 0.0

    def advance(self, files: int, nbytes: int) -> None:
        self.done += files
        self.bytes += nbytes
        now = time.monotonic()
        if self.enabled and (now - self._shown > 0.1 or self.done == self.total):
            self._shown = now
            sys.stderr.write(
                f"\ruploading {self.done}/{self.total} files, {self.bytes / 1e6:.1f} MB "
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.total:
            sys.stderr.write("\n")


async def upload(
    store: Store,
    root: Path,
    files: list[FileRecord],
    chunk_access: dict[str, Access],
    have: set[str],
) -> int:
    """Send the documents of `files` in size-bounded bulk batches, a few in flight at once."""
    progress = Progress(len(files))
    send, receive = trio.open_memory_channel[tuple[list[dict[str, Any]], int, int]](UPLOADERS)

    async def uploader(
        receive: trio.MemoryReceiveChannel[tuple[list[dict[str, Any]], int, int]],
    ) -> None:
        async with receive:
            async for ops, count, nbytes in receive:
                await store.bulk(ops)
                progress.advance(count, nbytes)

    total = 0
    async with trio.open_nursery() as nursery:
        for _ in range(UPLOADERS):
            nursery.start_soon(uploader, receive.clone())
        receive.close()
        async with send:
            batch: list[dict[str, Any]] = []
            count = nbytes = 0
            for ops, size in documents(store, root, files, chunk_access, have):
                batch += ops
                count += 1
                nbytes += size
                total += size
                if nbytes >= BATCH_BYTES or len(batch) >= 2 * BATCH_OPS:
                    await send.send((batch, count, nbytes))
                    batch, count, nbytes = [], 0, 0
                await trio.lowlevel.checkpoint()
            if batch:
                await send.send((batch, count, nbytes))
    progress.close()
    return total


def referenced(trees: list[list[FileRecord]], chunk_size: int) -> tuple[set[str], set[str]]:
    """Ids of the chunk and file documents these trees' files point at."""
    chunks: set[str] = set()
    files: set[str] = set()
    for records in trees:
        for f in records:
            if f.url is not None:
                continue
            files.add(layout.file_doc_id(f.path, f.digest))
            chunks.update(
                layout.chunk_id((f.digest, n))
                for n in range(layout.chunk_count(f.size, chunk_size))
            )
    return chunks, files


async def collect_garbage(
    store: Store, keep: list[list[FileRecord]], keep_versions: set[int], chunk_size: int
) -> None:
    chunks, files = referenced(keep, chunk_size)
    for kind, wanted in (("chunks", chunks), ("files", files)):
        stale = [i async for i in store.scan_ids(kind) if i not in wanted]
        for start in range(0, len(stale), BATCH_OPS):
            await store.bulk(
                [
                    {"delete": {"_index": store.index(kind), "_id": i}}
                    for i in stale[start : start + BATCH_OPS]
                ]
            )
        log.info("removed %d unreferenced documents from %s", len(stale), store.index(kind))
    old_parts = [
        i
        async for i in store.scan_ids("meta")
        if i.startswith("tree-") and int(i.split("-")[1]) not in keep_versions
    ]
    await store.bulk([{"delete": {"_index": store.index("meta"), "_id": i}} for i in old_parts])


def compare(old: list[FileRecord], new: list[FileRecord], summary: Summary) -> list[FileRecord]:
    """Count what changed and return the files whose (path, digest) is not published yet."""
    before = {f.path: f.digest for f in old}
    todo = []
    for f in new:
        prior = before.pop(f.path, None)
        if prior == f.digest:
            summary.unchanged += 1
            continue
        if prior is None:
            summary.added += 1
        else:
            summary.changed += 1
        todo.append(f)
    summary.removed = len(before)
    return todo


async def previous_files(store: Store, previous: Pointer | None) -> list[FileRecord]:
    """The published files; none when the published tree cannot be read (corrupt, or from
    an incompatible esfuse), so that ingest can publish a good one over it."""
    if previous is None:
        return []
    try:
        return decode((await store.tree_document(previous))[1])[1]
    except TreeError as e:
        log.warning("the published tree cannot be used (%s); uploading everything again", e)
        return []


async def ingest(
    store: Store,
    src: Path,
    *,
    checksum: bool = False,
    rules: Rules | None = None,
    manifest: Path | None = None,
) -> Summary:
    """Bring the docs index in line with `src`; see the module docstring for the order."""
    rules = rules or Rules()
    found = scan(src, rules)
    externals = load_manifest(manifest, rules) if manifest else []
    for skipped in found.skipped:
        log.warning("skipped %s: not a regular file or directory", skipped)
    await store.ensure_indices()
    owner = f"{socket.gethostname()} pid {os.getpid()}"
    async with store.ingest_lock(owner):
        previous = await store.pointer()
        if previous is not None and previous.chunk_size != layout.CHUNK_SIZE:
            raise EsfuseError(
                f"index {store.name!r} uses chunks of {previous.chunk_size} bytes; "
                f"this esfuse writes {layout.CHUNK_SIZE}: ingest into a new index"
            )
        old = await previous_files(store, previous)
        files = with_digests(found, old, checksum) + externals
        Tree(found.dirs, files)  # refuse an inconsistent tree before writing anything
        summary = Summary(files=len(files), bytes=sum(f.size for f in files))
        # External files have no documents: their bytes are fetched by the mounts.
        todo = [f for f in compare(old, files, summary) if f.url is None]
        chunk_access = union_by_digest([f for f in files if f.url is None])
        have = {f.digest for f in old}
        summary.uploaded_bytes = await upload(store, src, todo, chunk_access, have)
        updates = access_updates(store, old, files, chunk_access)
        for start in range(0, len(updates), 2 * BATCH_OPS):
            await store.bulk(updates[start : start + 2 * BATCH_OPS])
        # Searches (esgrep's, and content reads filtered by access) see only refreshed data.
        await store.refresh("files")
        await store.refresh("chunks")
        pointer = await store.publish(
            encode(found.dirs, files), previous, summary.files, summary.bytes
        )
        summary.version = pointer.version
        versions = {pointer.version} | ({previous.version} if previous else set())
        await collect_garbage(store, [files, old], versions, layout.CHUNK_SIZE)
    return summary
