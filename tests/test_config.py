"""Configuration files: what they set, and that flags and the environment beat them."""

from __future__ import annotations

import os

import click
import pytest

from esfuse.cli import main, parse_size
from esfuse.config import default_map
from esfuse.errors import EsfuseError
from esfuse.store import check_name
from tests.conftest import esfuse


def write(tmp_path, text: str):
    path = tmp_path / "esfuse.toml"
    path.write_text(text)
    return path


def test_shared_settings_and_command_tables(tmp_path):
    path = write(
        tmp_path,
        'es = "http://h:9200"\nindex = "docs"\n'
        '[mount]\ngroups = ["a", "b"]\ncache-size = "512M"\nrefresh = 0\n'
        "[ingest]\nchecksum = true\n",
    )
    mapping = default_map(path, main)
    assert mapping["mount"] == {
        "url": "http://h:9200",
        "index": "docs",
        "groups": "a,b",
        "cache_size": "512M",
        "refresh": 0,
    }
    assert mapping["ingest"] == {"url": "http://h:9200", "index": "docs", "checksum": True}
    assert mapping["umount"] == {}


@pytest.mark.parametrize(
    "text, message",
    [
        ("bogus = 1", "unknown setting 'bogus'"),
        ("[mount]\nchecksum = true", "mount has no option --checksum"),
        ("[frobnicate]\nx = 1", "no command 'frobnicate'"),
        ("es = ", "not valid TOML"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(EsfuseError, match=message):
        default_map(write(tmp_path, text), main)


def test_flags_beat_the_environment_which_beats_the_file(tmp_path):
    config = write(tmp_path, 'es = "http://127.0.0.1:1"\ntimeout = 0.5\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESFUSE_")}
    src = tmp_path / "src"
    src.mkdir()

    def target(*args, **extra_env) -> str:
        done = esfuse("--config", config, "ingest", src, *args, env={**env, **extra_env})
        assert done.returncode == 1
        return done.stderr

    assert "127.0.0.1:1 " in target()
    assert "127.0.0.1:2 " in target(ESFUSE_ES="http://127.0.0.1:2")
    assert "127.0.0.1:3 " in target("--es", "http://127.0.0.1:3", ESFUSE_ES="http://127.0.0.1:2")
    missing = esfuse("--config", tmp_path / "nope.toml", "umount", tmp_path)
    assert missing.returncode == 1 and "cannot read configuration" in missing.stderr


@pytest.mark.parametrize(
    "text, size",
    [
        ("256M", 256 << 20),
        ("1G", 1 << 30),
        ("65536", 65536),
        ("512k", 512 << 10),
        ("2GiB", 2 << 30),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "12X", "-1M", "1.5G"])
def test_bad_sizes(text):
    with pytest.raises(click.BadParameter):
        parse_size(text)


@pytest.mark.parametrize(
    "name, ok",
    [
        ("docs", True),
        ("bench-tldr.v2", True),
        ("Docs", False),
        ("-x", False),
        ("a b", False),
        ("a/b", False),
    ],
)
def test_index_names(name, ok):
    if ok:
        assert check_name(name) == name
    else:
        with pytest.raises(EsfuseError):
            check_name(name)
