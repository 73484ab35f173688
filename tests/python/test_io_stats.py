"""What `Loader.stats()` says about how it read: the backend in use, not the one asked for, and
this loader's own fallback count. The fallback is forced in a child process by
$ZEROWAIT_DISABLE_IO_URING, where the answer is known by construction: every shard opened with
io="io_uring" falls back to pread once; a loader reading with pread beside it has none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import zerowait

SAMPLES = 30


def write_dataset(out: Path) -> int:
    """SAMPLES small samples in shards of about 12 KB; returns how many shards were written."""
    with zerowait.ShardWriter(out, shard_size=12_000, sync=False) as writer:
        for i in range(SAMPLES):
            writer.write({"__key__": f"s{i:04d}", "bin": bytes([i % 251]) * 1000})
    return len(list(out.glob("*.zws")))


CHILD = textwrap.dedent("""
    import json, sys
    import zerowait

    def epoch(io):
        loader = zerowait.Loader(sys.argv[1], batch_size=4, io=io, threads=2)
        samples = sum(len(batch["__index__"]) for batch in loader)
        stats = loader.stats()
        loader.close()
        return dict(io=stats["io"], io_fallbacks=stats["io_fallbacks"], samples=samples)

    print(json.dumps(dict(io_uring=epoch("io_uring"), pread=epoch("pread"))))
""")


def test_io_uring_refused_reports_pread_and_one_fallback_per_shard(tmp_path):
    shards = write_dataset(tmp_path / "ds")
    assert shards >= 2
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ds")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ZEROWAIT_DISABLE_IO_URING="1"))
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["io_uring"] == {"io": "pread", "io_fallbacks": shards, "samples": SAMPLES}
    # The process noted fallbacks; this loader met none of them.
    assert stats["pread"] == {"io": "pread", "io_fallbacks": 0, "samples": SAMPLES}
    assert "io_uring is not available (disabled by ZEROWAIT_DISABLE_IO_URING)" in done.stderr
