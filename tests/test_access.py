"""Access control: rules at ingest, viewers at mount, no leak by any route."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from esfuse import protocol
from esfuse.access import EVERYTHING, PUBLIC, Access, Rules, Viewer, glob_to_regex
from esfuse.errors import EsfuseError, StoreError
from esfuse.store import Connection, Store, connect
from esfuse.tree import DirRecord, FileRecord, Tree, visible
from tests.conftest import ESFUSE, Docs, mount_or_fail, run, unmount

ESGREP = str(Path(sys.executable).parent / "esgrep")

# -- pure units ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "glob, path, hit",
    [
        ("internal/**", "internal/a.md", True),
        ("internal/**", "internal/x/y/z.md", True),
        ("internal/**", "internals/a.md", False),
        ("*.md", "a.md", True),
        ("*.md", "d/a.md", False),
        ("**/*.md", "a.md", True),
        ("**/*.md", "d/e/a.md", True),
        ("a/**/b.md", "a/b.md", True),
        ("a/**/b.md", "a/x/y/b.md", True),
        ("page-?.md", "page-1.md", True),
        ("page-?.md", "page-10.md", False),
        ("[ab]*.md", "b1.md", True),
        ("[!ab]*.md", "b1.md", False),
        ("a.md", "a_md", False),
    ],
)
def test_globs(glob, path, hit):
    assert bool(glob_to_regex(glob).fullmatch(path)) == hit


def test_last_matching_rule_wins_and_directories_match_with_a_slash():
    admin = Access(False, ("admin",))
    rules = Rules(
        PUBLIC, [(glob_to_regex("internal/**"), admin), (glob_to_regex("internal/open/**"), PUBLIC)]
    )
    assert rules.access_of("internal/a.md") == admin
    assert rules.access_of("internal/open/b.md") == PUBLIC
    assert rules.access_of("internal", is_dir=True) == admin
    assert rules.access_of("guide.md") == PUBLIC


def test_rules_files_are_checked(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {
                "default": {"public": False, "groups": ["staff"]},
                "rules": [{"path": "pub/**", "public": True}],
            }
        )
    )
    rules = Rules.load(good)
    assert rules.access_of("x.md") == Access(False, ("staff",))
    assert rules.access_of("pub/x.md") == PUBLIC
    for text, message in [
        ("{not json", "not valid JSON"),
        ('{"rules": {}}', "expected"),
        ('{"rules": [{"public": false}]}', "'path' must be"),
        ('{"rules": [{"path": "a", "public": "no"}]}', "'public' must be"),
        ('{"rules": [{"path": "a", "groups": "admin"}]}', "'groups' must be"),
        ('{"rules": [{"path": "[a", "public": false}]}', "unterminated"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(EsfuseError, match=message):
            Rules.load(bad)
    with pytest.raises(EsfuseError, match="cannot read"):
        Rules.load(tmp_path / "missing.json")


def test_viewers():
    secret = Access(False, ("admin", "billing"))
    assert Viewer().sees(PUBLIC) and not Viewer().sees(secret)
    assert Viewer(frozenset({"billing"})).sees(secret)
    assert not Viewer(frozenset({"sales"})).sees(secret)
    assert EVERYTHING.sees(secret) and EVERYTHING.es_filter() is None
    assert Access.union([secret, Access(False, ("sales",))]) == Access(
        False, ("admin", "billing", "sales")
    )
    assert Access.union([secret, PUBLIC]).public


def test_pruning_hides_directories_with_only_hidden_files_and_never_reveals_a_parent():
    hidden = Access(False, ("admin",))
    files = [
        FileRecord("pub.md", 1, 1, "d"),
        FileRecord("mixed/pub.md", 1, 1, "d"),
        FileRecord("mixed/sec.md", 1, 1, "d", hidden),
        FileRecord("secret/a/b.md", 1, 1, "d", hidden),
    ]
    dirs = [
        DirRecord("", 1),
        DirRecord("mixed", 1),
        DirRecord("secret", 1, hidden),
        DirRecord("secret/a", 1, hidden),
        DirRecord("secret/empty", 1),
        DirRecord("open-empty", 1),
        DirRecord("closed-empty", 1, hidden),
    ]
    tree = Tree(*visible(dirs, files, Viewer()))
    assert sorted(f.path for f in tree.files()) == ["mixed/pub.md", "pub.md"]
    assert sorted(d.path for d in tree.dirs()) == ["", "mixed", "open-empty"]
    admin = Tree(*visible(dirs, files, Viewer(frozenset({"admin"}))))
    assert admin.file_count == 4
    assert admin.resolve("secret/empty") is not None and admin.resolve("closed-empty")


# -- against Elasticsearch and real mounts ---------------------------------------------

SOURCE = {
    "README.md": "public readme\n",
    "guide/start.md": "public guide, mentions billing\n",
    "mixed/public.md": "public in a mixed dir\n",
    "mixed/secret-plan.md": "TOPSECRET-MIXED billing plan\n",
    "internal/billing/rates.md": "TOPSECRET-RATES billing rates\n",
    "internal/admin-only/keys.md": "TOPSECRET-KEYS admin keys\n",
    "internal/admin-only/deep/dir/more.md": "TOPSECRET-DEEP\n",
    "internal/copy-of-readme.md": "public readme\n",  # same content as a public file
}
RULES = {
    "default": {"public": True},
    "rules": [
        {"path": "internal/**", "public": False, "groups": ["admin", "billing"]},
        {"path": "internal/admin-only/**", "public": False, "groups": ["admin"]},
        {"path": "mixed/secret-*", "public": False, "groups": ["billing"]},
    ],
}
PUBLIC_VIEW = {"README.md", "guide/start.md", "mixed/public.md"}
BILLING_VIEW = PUBLIC_VIEW | {
    "mixed/secret-plan.md",
    "internal/billing/rates.md",
    "internal/copy-of-readme.md",
}


@pytest.fixture(scope="module")
def secured(es_url, es, tmp_path_factory):
    root = tmp_path_factory.mktemp("secured")
    src = root / "src"
    for rel, text in SOURCE.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (src / "internal" / "admin-only" / "empty").mkdir()
    rules = root / "rules.json"
    rules.write_text(json.dumps(RULES))
    d = Docs(es_url, es, src, prefix="secured")
    done = d.ingest("--access", rules)
    assert done.returncode == 0, done.stderr
    mounts = {
        "public": mount_or_fail(d, root / "public"),
        "billing": mount_or_fail(d, root / "billing", "--groups", "billing,sales"),
        "all": mount_or_fail(d, root / "all", "--all"),
    }
    yield d, mounts
    for m in mounts.values():
        unmount(m)
    d.drop()


def listed(mountpoint: Path) -> set[str]:
    out = run("find", ".", "-type", "f", cwd=mountpoint, text=True, check=True).stdout
    return {line[2:] for line in out.splitlines()}


def test_each_mount_lists_what_it_may_see(secured):
    _, mounts = secured
    assert listed(mounts["public"]) == PUBLIC_VIEW
    assert listed(mounts["billing"]) == BILLING_VIEW
    assert listed(mounts["all"]) == set(SOURCE)
    assert (mounts["all"] / "internal/admin-only/empty").is_dir()
    assert not (mounts["billing"] / "internal/admin-only").exists()


def hidden_of(view: set[str]) -> list[str]:
    return sorted(set(SOURCE) - view)


@pytest.mark.parametrize("name, view", [("public", PUBLIC_VIEW), ("billing", BILLING_VIEW)])
def test_hidden_files_leave_no_trace(secured, name, view):
    _, mounts = secured
    m = mounts[name]
    hidden = hidden_of(view)
    hidden_dirs = {str(Path(h).parent) for h in hidden} - {str(Path(v).parent) for v in view}
    for rel in hidden + sorted(hidden_dirs) + ["internal/admin-only/empty"]:
        for probe in (os.stat, os.lstat, Path.read_bytes, os.listdir):
            with pytest.raises(FileNotFoundError):
                probe(m / rel)
    outputs = [
        run("ls", "-laR", m),
        run("find", m, "-ls"),
        run("du", "-a", m),
        run("grep", "-r", "TOPSECRET", m),
        run("grep", "-rc", "", m),
        run("grep", "-rL", "x", m),
        run("getfattr", "-R", "-d", m),
        run("stat", "-f", m),
        *[
            run(ESGREP, *opts, m)
            for opts in (
                ["-r", "TOPSECRET"],
                ["-rn", "billing"],
                ["-rc", "TOPSECRET"],
                ["-rL", "zzz"],
                ["-rl", "--include=secret*", "plan"],
                ["-ri", "topsecret"],
                ["-rv", "zzz"],
                ["-r", "-e", "rates", "-e", "keys"],
            )
        ],
    ]
    secrets = {SOURCE[h].split()[0].encode() for h in hidden} - {
        SOURCE[v].split()[0].encode() for v in view
    }
    for done in outputs:
        text = done.stdout + done.stderr
        assert not [s for s in secrets if s in text], done.args
        for rel in hidden:
            assert Path(rel).name.encode() not in text, (rel, done.args)
        for d in hidden_dirs:
            assert f"/{Path(d).name}".encode() not in text, (d, done.args)


def test_counts_and_link_counts_only_count_what_is_seen(secured):
    _, mounts = secured
    for name, view in (("public", PUBLIC_VIEW), ("billing", BILLING_VIEW), ("all", set(SOURCE))):
        m = mounts[name]
        inodes = sum(1 for _ in m.rglob("*")) + 1
        assert os.statvfs(m).f_files == inodes
        assert os.stat(m).st_nlink == 2 + sum(1 for c in m.iterdir() if c.is_dir())
        assert inodes >= len(view)


def test_esgrep_over_each_mount_equals_grep_over_it(secured):
    _, mounts = secured
    for m in mounts.values():
        for argv in (["-rn", "billing"], ["-rc", "TOPSECRET"], ["-rl", "public"]):
            ours = run(ESGREP, *argv, ".", cwd=m)
            theirs = run("grep", *argv, ".", cwd=m)
            assert (ours.returncode, ours.stdout, ours.stderr) == (
                theirs.returncode,
                theirs.stdout,
                theirs.stderr,
            )


def test_raw_socket_requests_for_hidden_scopes_learn_nothing(secured):
    _, mounts = secured
    path = protocol.socket_of(mounts["public"])
    for scope in ("internal", "internal/admin-only/keys.md", "mixed/secret-plan.md", "nope"):
        response = protocol.call(
            path,
            {
                "op": "grep",
                "patterns": ["TOPSECRET"],
                "dialect": "F",
                "scopes": [scope],
                "every_file": False,
            },
            10,
        )
        assert response == {"v": 1, "ok": True, "mode": "filtered", "candidates": 0}
    response = protocol.call(
        path,
        {"op": "grep", "patterns": ["x"], "dialect": "G", "scopes": [""], "every_file": True},
        10,
    )
    assert response["candidates"] == len(PUBLIC_VIEW)


def test_elasticsearch_itself_withholds_what_a_viewer_may_not_see(secured):
    d, _ = secured

    async def probe():
        client = connect(Connection(url=d.url))
        try:
            _, everything = await Store(client, d.name).load_tree(EVERYTHING)
            public = Store(client, d.name, viewer=Viewer())
            keys = {f.path: (f.digest, 0) for f in everything.files()}
            assert (await public.fetch_chunks([keys["README.md"]]))[keys["README.md"]]
            # Shared content stays readable: a public file has the same bytes.
            assert await public.fetch_chunks([keys["internal/copy-of-readme.md"]])
            with pytest.raises(StoreError, match="missing"):
                await public.fetch_chunks([keys["internal/billing/rates.md"]])
            hits = await public.search_files({"match_all": {}}, [""])
            assert {p for p, _ in hits} == PUBLIC_VIEW
        finally:
            await client.close()

    trio.run(probe)


def test_another_user_cannot_use_the_control_socket(secured):
    _, mounts = secured
    path = protocol.socket_of(mounts["all"])
    code = (
        "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1])\nexcept PermissionError:\n sys.exit(13)\n"
    )
    done = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            code,
            path,
        ],
        capture_output=True,
    )
    assert done.returncode == 13, done.stderr


def test_changing_the_rules_updates_what_elasticsearch_serves(es_url, es, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.md").write_text("alpha\n")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [{"path": "a.md", "public": False}]}))
    d = Docs(es_url, es, src, prefix="rules-change")
    try:
        assert d.ingest("--access", rules).returncode == 0
        assert es.count(index=f"{d.name}-chunks", query={"term": {"public": True}})["count"] == 0
        rules.write_text(json.dumps({"rules": []}))
        assert d.ingest("--access", rules).returncode == 0
        es.indices.refresh(index=f"{d.name}-*")
        assert es.count(index=f"{d.name}-chunks", query={"term": {"public": True}})["count"] == 1
        assert es.count(index=f"{d.name}-files", query={"term": {"public": True}})["count"] == 1
        mount = mount_or_fail(d, tmp_path / "m")
        assert (mount / "a.md").read_text() == "alpha\n"
        unmount(mount)
    finally:
        d.drop()


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_a_sandbox_can_get_a_private_view_for_its_groups(secured):
    d, mounts = secured
    done = run(
        *ESFUSE,
        "sandbox",
        mounts["public"],
        "--es",
        d.url,
        "--groups",
        "billing",
        "--",
        "find",
        "/docs",
        "-type",
        "f",
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert {line.removeprefix("/docs/") for line in done.stdout.split()} == BILLING_VIEW
    assert listed(mounts["public"]) == PUBLIC_VIEW  # the shared mount is unchanged
    assert not [p for p in Path(tempfile.gettempdir()).glob("esfuse-sandbox-*")]
