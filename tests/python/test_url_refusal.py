"""A URL where only a local path works is refused in one line (exit 2 on the command line,
InvalidArgumentError in Python), and nothing is created under a folder named "s3:" or "https:".
One case per path-taking argument and parameter that takes only a local path; those that do
read URLs (datasets, pack and checkpoint outputs on S3, checkpoint mirrors) are not here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import zerowait
from zerowait.profiler import StepProfiler

URLS = ["s3://nobucket/x", "https://example.invalid/x"]


def refusal(what: str, url: str) -> str:
    return f"{what}: {url} is a URL; {what} must be a local path"


def assert_no_url_folder(root: Path) -> None:
    made = [p for p in root.rglob("*") if p.name in ("s3:", "https:", "http:")]
    assert made == [], f"a URL became local folders: {made}"


# (name as the message gives it, the command line with U where the URL goes)
COMMANDS = [
    ("PATH", ["doctor", "U"]),
    ("--root", ["doctor", "--root", "U"]),
    ("--generate", ["emulate", "resnet50", "--generate", "U"]),
    ("--data", ["emulate", "resnet50", "--data", "U"]),
    ("--out", ["emulate", "resnet50", "--generate", "gen", "--out", "U"]),
    ("PATH", ["bench", "storage", "U"]),
    ("DIR", ["bench", "files", "U"]),
    ("--dataset", ["bench", "files", ".", "--dataset", "U"]),
    ("--data", ["bench", "net", "--halving", "--data", "U"]),
    ("PATH", ["cache", "status", "U"]),
    ("PATH", ["cache", "warm", "U"]),
    ("--output", ["unpack", "data", "-o", "U"]),
    ("RUN", ["report", "U"]),
    ("--output", ["report", "run", "-o", "U"]),
    ("--doctor", ["report", "run", "--doctor", "U"]),
    ("--out", ["watch", "--out", "U", "--", "true"]),
    ("--compare", ["watch", "--compare", "U", "--", "true"]),
    ("DIR", ["generate", "imagefolder", "U"]),
    ("--tmp", ["pack", ".", "-o", "out", "--tmp", "U"]),
]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("what,args", COMMANDS, ids=[" ".join(a) for _, a in COMMANDS])
def test_command_refuses_a_url(cli, tmp_path, what, args, url):
    argv = [str(cli)] + [url if a == "U" else a for a in args]
    result = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2, (argv, result.returncode, result.stderr)
    assert f"zerowait: error: {refusal(what, url)}" in result.stderr, result.stderr
    assert_no_url_folder(tmp_path)
    assert list(tmp_path.iterdir()) == [], "nothing is written before the refusal"


def local_only_calls(tmp: Path):
    """(what the message names, a call taking the URL) for every Python parameter that takes
    only a local path."""
    return [
        ("map_dir", lambda u: zerowait.Loader(tmp / "data", 8, map=dict, map_dir=u)),
        ("cache_dir", lambda u: zerowait.Loader(tmp / "data", 8, cache_dir=u)),
        ("cache_dir", lambda u: zerowait.Dataset(tmp / "data", cache_dir=u)),
        ("out", lambda u: StepProfiler(out=u, sample_system=False)),
        ("out", lambda u: StepProfiler(sample_system=False).save(u)),
        ("before", lambda u: StepProfiler(sample_system=False).compare(u)),
        ("path", lambda u: zerowait.metrics.write_textfile(u)),
        ("tmp_dir", lambda u: zerowait.ShardWriter(tmp / "out", tmp_dir=u)),
        ("tmp_dir", lambda u: zerowait.pack([tmp / "src"], tmp / "out", tmp_dir=u)),
        ("out_dir", lambda u: zerowait.generate_imagefolder(u, files=1)),
        ("path", lambda u: zerowait.gds.GdsReader(u, "off")),
        ("dataset", lambda u: zerowait.gds.DatasetDeviceReader(u, "off")),
    ]


CALL_IDS = ["Loader(map_dir)", "Loader(cache_dir)", "Dataset(cache_dir)", "StepProfiler(out)",
            "StepProfiler.save", "StepProfiler.compare", "metrics.write_textfile",
            "ShardWriter(tmp_dir)", "pack(tmp_dir)", "generate_imagefolder", "gds.GdsReader",
            "gds.DatasetDeviceReader"]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("index", range(len(CALL_IDS)), ids=CALL_IDS)
def test_python_parameter_refuses_a_url(tmp_path, monkeypatch, index, url):
    monkeypatch.chdir(tmp_path)
    what, call = local_only_calls(tmp_path)[index]
    if CALL_IDS[index] == "metrics.write_textfile":
        url += ".prom"  # node_exporter's file name, checked after the URL
    with pytest.raises(zerowait.InvalidArgumentError) as raised:
        call(url)
    assert str(raised.value) == refusal(what, url)
    assert isinstance(raised.value, ValueError)
    assert_no_url_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_local_paths_pass(tmp_path):
    """The check lets plain paths through, relative ones and those with a colon included."""
    from zerowait._paths import local_path
    for path in ["data", "./s3:x", "a:b/c", "/abs/x", tmp_path, "1http://x"]:
        assert local_path(path, "p") == str(path)
