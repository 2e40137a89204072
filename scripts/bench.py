"""Time esfuse against a local copy of the same corpus, side by side in one run.

Prints a Markdown table of medians and ratios; nothing here asserts a timing.
Each round mounts afresh, so "cold" is the first `grep -r` after a mount (the
daemon's cache empty, the kernel's page cache dropped with the old mount).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ESFUSE = [sys.executable, "-m", "esfuse"]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def sh(*args: object, **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, **kwargs)


def grep_r(pattern: str, root: Path) -> Callable[[], None]:
    def run() -> None:
        done = subprocess.run(["grep", "-r", pattern, str(root)], capture_output=True)
        if done.returncode not in (0, 1):
            raise RuntimeError(done.stderr.decode())

    return run


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 else dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--corpus", default=str(REPO.parent / "shared/corpora/mintlify-docs.tar.gz")
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pattern", default="token")
    parser.add_argument("--index", default="bench-mintlify")
    args = parser.parse_args()

    url = sh(REPO / "scripts/es-dev", "start", text=True).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        src = unpack(Path(args.corpus), Path(tmp) / "src")
        files = sum(1 for p in src.rglob("*") if p.is_file())
        sh(*ESFUSE, "ingest", src, "--es", url, "--index", args.index)
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        times: dict[str, list[float]] = {"ready": [], "cold": [], "warm": [], "local": []}
        for _ in range(args.rounds):
            times["ready"].append(
                timed(
                    lambda: (
                        sh(*ESFUSE, "mount", mnt, "--es", url, "--index", args.index),
                        sh("ls", mnt),
                    )
                )
            )
            times["cold"].append(timed(grep_r(args.pattern, mnt)))
            times["warm"].append(timed(grep_r(args.pattern, mnt)))
            times["local"].append(timed(grep_r(args.pattern, src)))
            sh(*ESFUSE, "umount", mnt)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"corpus: {Path(args.corpus).name} ({files} files), {args.rounds} rounds, "
        f"`grep -r {args.pattern}`, {os.cpu_count()} cores\n"
    )
    print("| case | median | ratio |")
    print("|---|---:|---:|")
    print(f"| mount-ready (`esfuse mount` → first `ls`) | {med['ready'] * 1000:.0f} ms | |")
    print(f"| `grep -r` local copy | {med['local'] * 1000:.0f} ms | 1.00× |")
    for key, label in (("cold", "first after mount"), ("warm", "warm")):
        print(
            f"| `grep -r` over the mount, {label} | {med[key] * 1000:.0f} ms | "
            f"{med[key] / med['local']:.2f}× local |"
        )


if __name__ == "__main__":
    main()
