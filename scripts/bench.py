"""Time esfuse and esgrep against their baselines on the same corpus, in one run.

    scripts/bench [CORPUS...] [--synthetic N ...] [--rounds N]

For each corpus (archives in ../shared/corpora, and synthetic trees of N files
from scripts/synth-corpus), ingest it (incrementally after the first time),
then for several rounds time, side by side:

- mount-ready (`esfuse mount` start to the first `ls`), and the tree load in it;
- `ls -l` of the largest directory, first after mount;
- `grep -r` over the mount, first after mount (with the contents an earlier
  mount kept on local disk, and without), first once the preload has
  handed every content to the kernel, and warm; over the floor (the
  same tree served from RAM by scripts/floorfs.py, with stock and patched pyfuse3,
  and, first after mount, doing at mount what the preload does); and over a
  local copy (and `rg` when installed);
- esgrep, first after mount and warm, with a selective and an unselective literal;
- `cat` of single uncached files (p50), and the daemon's resident memory:
  after mount, after a full read, and with a cache smaller than the corpus.

Prints Markdown tables of medians with ratios to their baselines, and the
Elasticsearch requests per esgrep call. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from esfuse import protocol

REPO = Path(__file__).resolve().parent.parent
CORPORA = Path(os.environ.get("ESFUSE_CORPORA", REPO.parent / "shared" / "corpora"))
SYNTHETIC = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "esfuse" / "synthetic"
BIN = Path(sys.executable).parent
ESFUSE = [sys.executable, "-m", "esfuse"]
ESGREP = str(BIN / "esgrep")
# (selective, unselective) literal per corpus; the selective ones match a few dozen files.
PATTERNS = {"mintlify-docs": ("Pagination", "the"), "tldr-pages": ("ffmpeg", "the")}
SYNTHETIC_PATTERNS = ("zebrafish", "the")
SMALL_CACHE = 8 << 20
CAT_SAMPLES = 60
WARM_RUNS = 3  # per round and pattern


def sh(*args: object, **kwargs: object) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, **kwargs)
    if done.returncode:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode()
        sys.exit(f"bench: {' '.join(map(str, args))} failed: {err.strip()}")
    return done


def timed(*args: object, cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{args}: {done.stderr.decode()}")
    return elapsed


def status(mnt: Path) -> dict:
    return protocol.call(protocol.socket_of(mnt), {"op": "status"}, 30)


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 else dest


def largest_dir(src: Path) -> tuple[Path, int]:
    best, size = src, -1
    for dirpath, dirnames, filenames in os.walk(src):
        if len(dirnames) + len(filenames) > size:
            best, size = Path(dirpath), len(dirnames) + len(filenames)
    return best.relative_to(src), size


@contextmanager
def floor(src: Path, mnt: Path, *options: str) -> Iterator[None]:
    """The floor file system mounted at `mnt` with `options` (see floorfs.py)."""
    args = [sys.executable, REPO / "scripts" / "floorfs.py", src, mnt, *options]
    proc = subprocess.Popen(
        [str(a) for a in args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        sys.exit("bench: floorfs did not mount")
    try:
        yield
    finally:
        sh("fusermount3", "-u", mnt)
        proc.wait()


class Bench:
    def __init__(
        self, url: str, src: Path, index: str, mnt: Path, patterns: tuple[str, str]
    ) -> None:
        self.url, self.src, self.index, self.mnt = url, src, index, mnt
        self.selective, self.unselective = patterns
        self.times: dict[str, list[float]] = defaultdict(list)
        self.requests: dict[str, str] = {}
        self.wide, self.wide_entries = largest_dir(src)
        self.floor_mnt = mnt.parent / "floor"
        self.floor_mnt.mkdir(exist_ok=True)

    def mount(self, *extra: object) -> None:
        started = time.perf_counter()
        sh(*ESFUSE, "mount", self.mnt, "--es", self.url, "--index", self.index, *extra)
        sh("ls", self.mnt)
        self.times["ready"].append(time.perf_counter() - started)
        self.times["tree load"].append(status(self.mnt)["tree_load_ms"] / 1000)

    def umount(self) -> None:
        sh(*ESFUSE, "umount", self.mnt)

    def grep(self, key: str, pattern: str, where: Path) -> None:
        self.times[key].append(timed("grep", "-r", pattern, ".", cwd=where))

    def esgrep(self, key: str, pattern: str) -> None:
        before = status(self.mnt)["requests"]
        self.times[key].append(timed(ESGREP, "-r", pattern, ".", cwd=self.mnt))
        after = status(self.mnt)["requests"]
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        self.requests.setdefault(key, ", ".join(f"{v} {k}" for k, v in sorted(delta.items())))

    def wait_preloaded(self) -> None:
        started = time.perf_counter()
        while status(self.mnt)["preload"] == "loading":
            if time.perf_counter() - started > 600:
                sys.exit("bench: the preload did not finish in 10 minutes")
            time.sleep(0.02)
        self.times["preload"].append(time.perf_counter() - started)

    def rss(self, key: str) -> None:
        self.times[key].append(status(self.mnt)["rss_bytes"] / 1e6)

    def scale_round(self, number: int) -> None:
        """What scale changes: mount-ready, memory, a wide directory, esgrep, cat."""
        self.mount()
        self.rss("rss mounted")
        self.times["ls wide"].append(timed("ls", "-l", self.wide, cwd=self.mnt))
        self.esgrep("esgrep sel cold", self.selective)
        self.esgrep("esgrep sel warm", self.selective)
        self.umount()
        self.cat(number)
        self.grep("local sel", self.selective, self.src)

    def round(self, number: int) -> None:
        sel, unsel = self.selective, self.unselective
        # esgrep: without preload, whose requests would blur what esgrep asks for.
        self.mount("--no-preload")
        self.times["ls wide"].append(timed("ls", "-l", self.wide, cwd=self.mnt))
        for pattern, name in ((sel, "sel"), (unsel, "unsel")):
            self.esgrep(f"esgrep {name} cold", pattern)
            self.esgrep(f"esgrep {name} warm", pattern)
        self.umount()
        # grep -r over the mount, as mounted by default (with preload), and over the
        # floor beside it. Warm runs alternate between the two and the local copy,
        # so that this machine's drift (10-20% within minutes) falls on all alike.
        self.mount()
        self.rss("rss mounted")
        self.grep("grep sel cold", sel, self.mnt)
        with floor(self.src, self.floor_mnt, "--patched", "--hand-over"):
            self.grep("floor sel handed", sel, self.floor_mnt)
        with floor(self.src, self.floor_mnt, "--patched"):
            self.grep("floor sel cold", sel, self.floor_mnt)
            for _ in range(WARM_RUNS):
                for pattern, name in ((sel, "sel"), (unsel, "unsel")):
                    self.grep(f"grep {name} warm", pattern, self.mnt)
                    self.grep(f"floor {name} warm", pattern, self.floor_mnt)
                    self.grep(f"local {name}", pattern, self.src)
        self.rss("rss read")
        self.umount()
        # The same, once the preload has handed every content to the kernel.
        self.mount()
        self.wait_preloaded()
        self.grep("grep sel preloaded", sel, self.mnt)
        self.umount()
        # Right after a mount that keeps nothing on local disk, as the first mount on
        # a machine: every content then comes from Elasticsearch.
        self.mount("--no-keep-contents")
        self.grep("grep sel cold unkept", sel, self.mnt)
        self.umount()
        self.cat(number)
        self.small_cache()
        with floor(self.src, self.mnt):
            timed("grep", "-r", sel, ".", cwd=self.mnt)  # warms it
            self.grep("floor opens sel warm", sel, self.mnt)
            self.grep("floor opens unsel warm", unsel, self.mnt)
        for pattern, name in ((sel, "sel"), (unsel, "unsel")):
            if shutil.which("rg"):
                self.times[f"rg {name}"].append(timed("rg", pattern, ".", cwd=self.src))

    def cat(self, number: int) -> None:
        """Single reads of uncached files, in directories not read before (no read-ahead)."""
        self.mount("--no-preload")
        rng = random.Random(number)
        files = [p for p in self.src.rglob("*") if p.is_file() and p.stat().st_size]
        seen: set[Path] = set()
        for path in rng.sample(files, min(len(files), CAT_SAMPLES * 4)):
            if path.parent in seen:
                continue
            seen.add(path.parent)
            started = time.perf_counter()
            with open(self.mnt / path.relative_to(self.src), "rb") as f:
                f.read()
            self.times["cat"].append(time.perf_counter() - started)
            if len(seen) == CAT_SAMPLES:
                break
        self.umount()

    def small_cache(self) -> None:
        """Resident memory after reading everything through a cache smaller than the corpus."""
        self.mount("--cache-size", str(SMALL_CACHE))
        self.grep("grep small cache", self.unselective, self.mnt)
        self.rss("rss small cache")
        self.umount()

    def table(self, title: str) -> str:
        med = {k: statistics.median(v) for k, v in self.times.items()}
        sel, unsel = self.selective, self.unselective
        rows = [
            f"#### {title}",
            "",
            "| case | median | vs local `grep -r` | vs floor | ES requests |",
            "|---|---:|---:|---:|---|",
        ]

        def row(key: str, label: str, local: str | None = None, base: str | None = None) -> None:
            if key not in med:
                return
            cells = [f"{med[key] * 1000:.0f} ms"]
            for ref in (local, base):
                cells.append(f"{med[key] / med[ref]:.2f}×" if ref in med else "")
            rows.append(f"| {label} | {' | '.join(cells)} | {self.requests.get(key, '')} |")

        row("ready", "mount-ready (`esfuse mount` → first `ls`)")
        row("tree load", "… of which tree load (fetch, decode, build)")
        row("preload", "preload after mount-ready (into the kernel, from local disk)")
        row("ls wide", f"`ls -l` of {self.wide}/ ({self.wide_entries} entries), first")
        row("cat", "`cat` of one uncached file, p50")
        for name, pattern in (("sel", sel), ("unsel", unsel)):
            local = f"local {name}"
            row(local, f"`grep -r {pattern}`, local copy", local)
            row(f"rg {name}", f"`rg {pattern}`, local copy", local)
            row(f"floor opens {name} warm", "… floor with opens, warm", local)
            row(f"floor {name} cold", "… floor (RAM, patched pyfuse3), first after mount", local)
            row(
                f"floor {name} handed",
                "… floor, listing and handing everything to the kernel at mount, first after",
                local,
            )
            row(f"floor {name} warm", "… floor (RAM, patched pyfuse3), warm", local)
            row(
                f"grep {name} cold",
                "… over the mount, first after mount",
                local,
                f"floor {name} handed",
            )
            row(
                f"grep {name} cold unkept",
                "… over the mount, first after a mount with nothing kept on local disk",
                local,
                f"floor {name} handed",
            )
            row(
                f"grep {name} preloaded",
                "… over the mount, first once preloaded",
                local,
                f"floor {name} warm",
            )
            row(f"grep {name} warm", "… over the mount, warm", local, f"floor {name} warm")
            row(f"esgrep {name} cold", f"`esgrep -r {pattern}`, first after mount", local)
            row(f"esgrep {name} warm", f"`esgrep -r {pattern}`, warm", local)
        rows += ["", "| daemon memory | resident |", "|---|---:|"]
        for key, label in (
            ("rss mounted", "after mount"),
            ("rss read", "after `grep -r` read everything (default cache, 256 MB)"),
            ("rss small cache", f"after the same with `--cache-size {SMALL_CACHE >> 20}M`"),
        ):
            if key in med:
                rows.append(f"| {label} | {med[key]:.0f} MB |")
        return "\n".join(rows)


def corpora(names: list[str], synthetic: list[int], tmp: Path) -> Iterator[tuple[str, Path]]:
    for name in names:
        archive = CORPORA / f"{name}.tar.gz"
        if not archive.exists():
            print(f"({archive} is not present: skipped)\n")
            continue
        yield name, unpack(archive, tmp / name)
    for files in synthetic:
        # Kept between runs: writing and ingesting a large tree takes minutes.
        dest = SYNTHETIC / f"files-{files}"
        sh(sys.executable, REPO / "scripts" / "synth-corpus", dest, "--files", files)
        yield f"synthetic-{files}", dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "corpora",
        nargs="*",
        default=["mintlify-docs", "tldr-pages"],
        help="names of archives in ../shared/corpora",
    )
    parser.add_argument(
        "--synthetic",
        type=int,
        action="append",
        default=[],
        metavar="FILES",
        help="also a synthetic tree of this many files (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="only what a tree's size changes (for very large trees, where a full "
        "round reads every file several times)",
    )
    args = parser.parse_args()

    url = sh(REPO / "scripts/es-dev", "start", text=True).stdout.strip().splitlines()[-1]
    print(f"{args.rounds} rounds, medians; {os.cpu_count()} cores; Elasticsearch on loopback\n")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in corpora(args.corpora, args.synthetic, Path(tmp)):
            files = sum(1 for p in src.rglob("*") if p.is_file())
            started = time.perf_counter()
            sh(*ESFUSE, "ingest", src, "--es", url, "--index", f"bench-{name}")
            ingest = time.perf_counter() - started
            mnt = Path(tmp) / "mnt"
            mnt.mkdir(exist_ok=True)
            synthetic = name.startswith("synthetic")
            patterns = SYNTHETIC_PATTERNS if synthetic else PATTERNS.get(name, ("token", "the"))
            bench = Bench(url, src, f"bench-{name}", mnt, patterns)
            for number in range(args.rounds):
                (bench.scale_round if args.scale_only else bench.round)(number)
            print(bench.table(f"{name} ({files} files; ingest this run {ingest:.0f} s)") + "\n")


if __name__ == "__main__":
    main()
