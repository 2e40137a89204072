"""The project's own edge-case docs tree, generated deterministically.

Unicode and space names, an empty file, a 5 MB text file, binary files, files
with no extension, an empty directory, 6-level nesting, a 5,000-entry
directory, and text that search engines like to mangle (`# OAuth`, `<tip>`,
`user@x.com`, `a&b`, `~/.ssh`).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

WIDE = 5000
BIG_BYTES = 5 * 1000 * 1000
MTIME_NS = 1_700_000_000_123_456_789

WORDS = [
    *"token access_token OAuth api key request response header bearer cache index".split(),
    *"query mount file tree search grep regex chunk shard node cluster docs page guide".split(),
]

PAGES = {
    "README.md": "# Docs\n\nStart with the [quickstart](guide/quickstart.mdx).\n",
    "LICENSE": "MIT License\n\nPermission is hereby granted, free of charge.\n",
    "guide/quickstart.mdx": (
        "---\ntitle: Quickstart\n---\n\n# OAuth\n\nSet `access_token` in the header.\n"
        "<tip>Use a bearer token.</tip>\nMail user@x.com if a&b fails.\n"
        "Keys live in ~/.ssh/id_ed25519.\n"
    ),
    "guide/auth.md": "## Authentication\n\nAuthorization: Bearer $TOKEN\nfoo(bar) [x] {y} a.b*c\n",
    "api/openapi.json": '{"openapi": "3.0.0", "paths": {"/v1/search": {"get": {}}}}\n',
    "api/config.yaml": "server:\n  port: 8080\n  hosts: [a, b]\n",
    "café/naïve résumé.md": "Ünïcödé text: naïve café, Straße, ΑΒΓ, 日本語.\n",
    "日本語/ドキュメント.mdx": "# ドキュメント\n\nトークンを設定します。\n",
    "with space/file name.txt": "a file whose name has a space\n",
    "emoji 🚀.md": "rocket 🚀 launch\n",
    "empty.txt": "",
    "no-newline.txt": "last line without newline",
    "crlf.txt": "windows\r\nline endings\r\n",
    "a/b/c/d/e/f/deep.md": "# Deep\n\nsix levels down\n",
    "Makefile": "all:\n\techo build\n",
}


def big_text(size: int = BIG_BYTES) -> bytes:
    rng = random.Random(42)
    lines: list[str] = []
    total = 0
    n = 0
    while total < size:
        line = f"{n:07d} " + " ".join(rng.choice(WORDS) for _ in range(12)) + "\n"
        lines.append(line)
        total += len(line)
        n += 1
    return "".join(lines).encode()[:size]


def binary_blob() -> bytes:
    rng = random.Random(7)
    return bytes(range(256)) * 4 + bytes(rng.getrandbits(8) for _ in range(70_000))


def make_fixture(root: Path) -> Path:
    """Write the fixture under `root` and return it."""
    files: dict[str, bytes] = {k: v.encode() for k, v in PAGES.items()}
    files["large/big.txt"] = big_text()
    files["assets/logo.png"] = b"\x89PNG\r\n\x1a\n" + binary_blob()
    files["assets/latin1.txt"] = "caf\xe9 na\xefve\n".encode("latin-1")
    files["assets/nul.bin"] = b"text\0with\0nuls\naccess_token\n"
    for i in range(WIDE):
        files[f"wide/page-{i:04d}.md"] = f"# Page {i}\n\nentry {i} of the wide directory\n".encode()
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, ns=(MTIME_NS, MTIME_NS + len(rel)))
    (root / "empty-dir").mkdir(exist_ok=True)
    return root
