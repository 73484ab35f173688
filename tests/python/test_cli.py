"""The `zerowait` command that `pip install .` installs, run as a real process."""

from __future__ import annotations

import json
import subprocess

import zerowait


def run(cli, *args):
    return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def test_help_lists_the_commands(cli):
    result = run(cli, "--help")
    assert result.returncode == 0, result.stderr
    for command in ("pack", "inspect", "verify"):
        assert command in result.stdout


def test_version_matches_the_package(cli):
    result = run(cli, "--version")
    assert result.returncode == 0
    assert zerowait.__version__ in result.stdout


def test_inspect_json_describes_a_packed_dataset(cli, image_tree, image_dataset):
    result = run(cli, "inspect", "--json", image_dataset)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    ds = zerowait.Dataset(image_dataset)
    assert info["samples"] == len(ds) == 48
    assert info["shard_count"] == ds.shard_count
    assert info["fields"] == ds.fields
    assert info["classes"] == ds.classes


def test_cli_packs_what_python_reads(cli, random_tree, tmp_path):
    root, expected = random_tree
    out = tmp_path / "shards"
    result = run(cli, "pack", root, "-o", out, "--no-sync")
    assert result.returncode == 0, result.stderr
    ds = zerowait.Dataset(out)
    assert {ds.key(i): ds[i] for i in range(len(ds))} == expected
    assert run(cli, "verify", out).returncode == 0


def test_cli_error_names_the_missing_path(cli, tmp_path):
    missing = tmp_path / "nothing-here"
    result = run(cli, "inspect", missing)
    assert result.returncode == 1
    assert str(missing) in result.stderr
