"""kill -9 at random moments of 4-rank sharded saves: the short version of
sharded_kill_harness.py (its docstring says what a round does and how steps are judged; run
`python tests/python/sharded_kill_harness.py --rounds 100 --backend zerowait|dcp` for the full
proof, docs/checkpoint.md "Sharded state").

No count of kills must land anywhere in particular: a round that kills the ranks between saves
proves less, never something false."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).parent / "sharded_kill_harness.py"
sys.path.insert(0, str(HARNESS.parent))
from sharded_kill_harness import DCP_KINDS  # noqa: E402


def run_harness(backend: str, rounds: int, tmp_path: Path) -> dict:
    report = tmp_path / f"{backend}.json"
    # Kills within 2 s of readiness: room for saves to commit on a loaded machine.
    child = subprocess.run([sys.executable, str(HARNESS), "--rounds", str(rounds), "--backend",
                            backend, "--dir", str(tmp_path / backend), "--json", str(report),
                            "--max-wait", "2"],
                           capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stdout + child.stderr
    return json.loads(report.read_text())["counts"]


@pytest.mark.slow
def test_no_torn_or_mixed_step_is_ever_accepted_after_kill_nine(tmp_path):
    counts = run_harness("zerowait", 5, tmp_path)
    assert counts.get("torn or mixed steps accepted", 0) == 0, counts
    assert counts.get("newest step went back", 0) == 0, counts
    assert counts.get("load() did not return the newest step", 0) == 0, counts
    assert counts["kills: all at once"] + counts["kills: one rank, then the rest"] == 5
    # Steps were committed and checked (every element, each rank's part): not a vacuous pass.
    assert counts["committed steps checked, whole"] >= 1, counts


@pytest.mark.slow
def test_the_dcp_side_classifies_every_directory_it_leaves(tmp_path):
    counts = run_harness("dcp", 2, tmp_path)
    kinds = {key.removeprefix("directories: "): n for key, n in counts.items()
             if key.startswith("directories: ")}
    newest = {key.removeprefix("newest directory: "): n for key, n in counts.items()
              if key.startswith("newest directory: ")}
    assert set(kinds) <= set(DCP_KINDS) and set(newest) <= set(kinds), counts
    # One newest directory a round (none when the kill came before the first one was made).
    assert sum(newest.values()) <= 2 and sum(kinds.values()) >= sum(newest.values()), counts
