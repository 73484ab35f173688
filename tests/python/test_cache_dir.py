"""zerowait.default_cache_dir(): where a cache of remote data goes when the user names none,
under the user's own cache directory (XDG Base Directory spec), so no root is needed."""

from __future__ import annotations

import os

import zerowait


def test_it_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert zerowait.default_cache_dir() == str(tmp_path / "xdg" / "zerowait" / "blocks")
    assert not (tmp_path / "xdg").exists(), "asking for the place creates nothing"


def test_else_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in (None, "", "relative/cache"):  # a relative XDG_CACHE_HOME is ignored (the spec)
        if xdg is None:
            monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert zerowait.default_cache_dir() == os.path.join(tmp_path, ".cache", "zerowait",
                                                            "blocks")
