"""What a new user sees on a first run (scripts/setup.sh's demo): the benchmark's ratios as
measurements, not PASS/FAIL against the project's internal goals (those only with --judge or
--strict), and one-time notes once per process tree, however many processes meet the fallback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import common  # noqa: E402  (bench/common.py)

ROWS = [common.table_row("zerowait shards", "cold", (0.5, 50_000_000, 2000)),
        common.table_row("per-file open/read/close (C)", "cold", (2.0, 50_000_000, 2000))]
RATIOS = [common.ratio("cold shards/per-file C samples/s", 4.07, 10.0, higher_is_better=True)]


def test_the_table_shows_ratios_as_measurements_unless_judging_is_asked(capsys):
    common.print_table(ROWS, RATIOS, ["a note"], judged=False)
    shown = capsys.readouterr().out
    assert re.search(r"cold shards/per-file C samples/s\s+4\.07\s*$", shown, re.MULTILINE), shown
    assert "FAIL" not in shown and "PASS" not in shown and ">= 10" not in shown, shown
    assert "note: a note" in shown

    common.print_table(ROWS, RATIOS, [], judged=True)
    judged = capsys.readouterr().out
    assert re.search(r"cold shards/per-file C samples/s\s+4\.07\s+>= 10\.0\s+FAIL", judged), judged


def test_the_setup_demo_runs_the_benchmark_without_judging():
    demo = [line for line in (REPO / "scripts" / "setup.sh").read_text().splitlines()
            if '"$ROOT/bench/run"' in line and not line.lstrip().startswith("#")]
    assert demo, "setup.sh no longer runs bench/run"
    for line in demo:
        assert "--judge" not in line and "--strict" not in line, line


# Four processes forked from one that had not met the fallback, all meeting it at once (as the
# ranks of `zerowait emulate` do), then a program exec'd below them: one note in all.
TREE = textwrap.dedent("""
    import os, subprocess, sys
    import zerowait
    dataset = sys.argv[1]
    def meet_the_fallback():
        loader = zerowait.Loader(dataset, batch_size=4, io="auto", autotune=False)
        assert loader.next(timeout=30) is not None
        loader.close()
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            meet_the_fallback()
            os._exit(0)
        children.append(pid)
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
    meet_the_fallback()
    subprocess.run([sys.executable, "-c", "import zerowait, sys; "
                    "l = zerowait.Loader(sys.argv[1], batch_size=4, io='auto', autotune=False); "
                    "assert l.next(timeout=30) is not None; l.close()", dataset], check=True)
""")


def test_a_note_is_printed_once_per_process_tree(image_dataset):
    # With io_uring turned off by hand, io="auto" falls back to pread, with a one-time note.
    env = dict(os.environ, ZEROWAIT_DISABLE_IO_URING="1")
    done = subprocess.run([sys.executable, "-c", TREE, str(image_dataset)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines()
             if line.startswith("zerowait: note: io_uring is not available")]
    assert len(notes) == 1, done.stderr[-3000:]
