"""Time esfuse and esgrep against grep on a local copy of the same corpus, in one run.

For each corpus: ingest it (incremental after the first time), then for several
rounds mount afresh and time mount-ready, `grep -r` over the mount (first run
after mount, then warm), esgrep (first run after mount, then warm) with a
selective and an unselective pattern, and the baselines on a local copy (`grep
-r`, and `rg` when installed). Prints Markdown tables of medians, ratios to
local `grep -r` with the same pattern, and Elasticsearch requests per esgrep
call. Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from esfuse import protocol

REPO = Path(__file__).resolve().parent.parent
CORPORA = Path(os.environ.get("ESFUSE_CORPORA", REPO.parent / "shared" / "corpora"))
BIN = Path(sys.executable).parent
ESFUSE = [sys.executable, "-m", "esfuse"]
ESGREP = str(BIN / "esgrep")
# (selective, unselective) literal per corpus; the selective ones match a few dozen files.
PATTERNS = {"mintlify-docs": ("Pagination", "the"), "tldr-pages": ("ffmpeg", "the")}


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


def requests(mnt: Path) -> dict[str, int]:
    path = protocol.socket_of(mnt)
    return protocol.call(path, {"op": "status"}, 10)["requests"]


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 else dest


class Bench:
    def __init__(self, url: str, src: Path, index: str, mnt: Path) -> None:
        self.url, self.src, self.index, self.mnt = url, src, index, mnt
        self.times: dict[str, list[float]] = defaultdict(list)
        self.requests: dict[str, str] = {}

    def mount(self) -> None:
        started = time.perf_counter()
        sh(*ESFUSE, "mount", self.mnt, "--es", self.url, "--index", self.index)
        sh("ls", self.mnt)
        self.times["ready"].append(time.perf_counter() - started)

    def umount(self) -> None:
        sh(*ESFUSE, "umount", self.mnt)

    def esgrep(self, key: str, pattern: str) -> None:
        before = requests(self.mnt)
        self.times[key].append(timed(ESGREP, "-r", pattern, ".", cwd=self.mnt))
        after = requests(self.mnt)
        delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        self.requests.setdefault(key, ", ".join(f"{v} {k}" for k, v in sorted(delta.items())))

    def round(self, selective: str, unselective: str) -> None:
        self.mount()
        for pattern, name in ((selective, "sel"), (unselective, "unsel")):
            self.esgrep(f"esgrep {name} cold", pattern)
            self.esgrep(f"esgrep {name} warm", pattern)
        self.umount()
        self.mount()
        self.times["grep sel cold"].append(timed("grep", "-r", selective, ".", cwd=self.mnt))
        self.times["grep sel warm"].append(timed("grep", "-r", selective, ".", cwd=self.mnt))
        self.times["grep unsel warm"].append(timed("grep", "-r", unselective, ".", cwd=self.mnt))
        self.umount()
        for pattern, name in ((selective, "sel"), (unselective, "unsel")):
            self.times[f"local {name}"].append(timed("grep", "-r", pattern, ".", cwd=self.src))
            if shutil.which("rg"):
                self.times[f"rg {name}"].append(timed("rg", pattern, ".", cwd=self.src))

    def table(self, title: str, selective: str, unselective: str) -> str:
        med = {k: statistics.median(v) for k, v in self.times.items()}
        rows = [
            f"### {title}",
            "",
            "| case | median | vs local `grep -r` | ES requests |",
            "|---|---:|---:|---|",
            f"| mount-ready (`esfuse mount` → first `ls`) | {med['ready'] * 1000:.0f} ms | | |",
        ]
        labels = [
            ("local sel", f"`grep -r {selective}`, local copy"),
            ("rg sel", f"`rg {selective}`, local copy"),
            ("grep sel cold", f"`grep -r {selective}` over the mount, first after mount"),
            ("grep sel warm", f"`grep -r {selective}` over the mount, warm"),
            ("esgrep sel cold", f"`esgrep -r {selective}`, first after mount"),
            ("esgrep sel warm", f"`esgrep -r {selective}`, warm"),
            ("local unsel", f"`grep -r {unselective}`, local copy"),
            ("rg unsel", f"`rg {unselective}`, local copy"),
            ("grep unsel warm", f"`grep -r {unselective}` over the mount, warm"),
            ("esgrep unsel cold", f"`esgrep -r {unselective}`, first after mount"),
            ("esgrep unsel warm", f"`esgrep -r {unselective}`, warm"),
        ]
        for key, label in labels:
            if key not in med:
                continue
            base = med["local unsel" if "unsel" in key else "local sel"]
            rows.append(
                f"| {label} | {med[key] * 1000:.0f} ms | {med[key] / base:.2f}× | "
                f"{self.requests.get(key, '')} |"
            )
        return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "corpora",
        nargs="*",
        default=["mintlify-docs", "tldr-pages"],
        help="names of archives in ../shared/corpora",
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    url = sh(REPO / "scripts/es-dev", "start", text=True).stdout.strip().splitlines()[-1]
    print(f"{args.rounds} rounds, medians; {os.cpu_count()} cores; Elasticsearch on loopback\n")
    for name in args.corpora:
        archive = CORPORA / f"{name}.tar.gz"
        if not archive.exists():
            print(f"({archive} is not present: skipped)\n")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = unpack(archive, Path(tmp) / "src")
            files = sum(1 for p in src.rglob("*") if p.is_file())
            sh(*ESFUSE, "ingest", src, "--es", url, "--index", f"bench-{name}")
            mnt = Path(tmp) / "mnt"
            mnt.mkdir()
            bench = Bench(url, src, f"bench-{name}", mnt)
            selective, unselective = PATTERNS.get(name, ("token", "the"))
            for _ in range(args.rounds):
                bench.round(selective, unselective)
            print(bench.table(f"{name} ({files} files)", selective, unselective) + "\n")


if __name__ == "__main__":
    main()
