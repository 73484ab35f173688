"""`zerowait ckpt export DIR STEP --to safetensors`: a step's full tensors in one safetensors file,
sharded ones assembled from the chunks two real ranks saved, compared bit for bit (and after
--dtype casts, with torch's own .to()); damaged pieces named; usage errors exit 2."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import zerowait
from zerowait import _core
from helpers import flip_byte, start_ranks

sys.path.insert(0, str(Path(__file__).parent))
from sharded_checkpoint_worker import equal_bits, per_rank_tensors, reference  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Step 1 saved by two ranks: reference() Shard(0) under /model, its "w" Shard(1) as /tp/w1,
    and per-rank tensors under /head."""
    root = tmp_path_factory.mktemp("export")
    (root / "out").mkdir()
    procs = start_ranks(HERE / "sharded_checkpoint_worker.py",
                        ["save-export", root / "ckpt", root / "out"], 2)
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {rank}:\n{err}"
    return root / "ckpt"


def export(cli, directory, out, *extra):
    return subprocess.run([str(cli), "ckpt", "export", str(directory), *map(str, extra),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)


def expected_full(rank: int) -> dict:
    full = {f"/model/{name}": t for name, t in reference().items()}
    full["/tp/w1"] = reference()["w"]
    full.update({f"/head/{name}": t for name, t in per_rank_tensors(rank).items()})
    return full


@pytest.mark.parametrize("rank", [0, 1])
def test_export_is_the_full_tensors_bit_for_bit(cli, saved, tmp_path, rank):
    out = tmp_path / "model.safetensors"
    done = export(cli, saved, out, 1, "--to", "safetensors", "--rank", rank, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    got = load_file(out)
    expected = expected_full(rank)
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert equal_bits(got[name], t), name
    chunks = {t["name"]: t["chunks"] for t in report["tensors"]}
    assert chunks["/model/w"] == 2 and chunks["/tp/w1"] == 2 and chunks["/head/bias"] == 0
    assert report["bytes_read"] == sum(t.nbytes for t in expected.values())
    with safe_open(str(out), framework="pt") as f:
        metadata = f.metadata()
    assert metadata["step"] == "1" and metadata["format"] == "pt"
    assert metadata["run_id"] == _core._ckpt_step_info(str(saved), 1)["run_id"] != ""


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                               ("fp32", torch.float32)])
def test_dtype_casts_floats_as_torch_does_and_prefix_names(cli, saved, tmp_path, dtype,
                                                           torch_dtype):
    out = tmp_path / "model.safetensors"
    done = export(cli, saved, out, 1, "--to", "safetensors", "--dtype", dtype,
                  "--prefix", "/model/")
    assert done.returncode == 0, done.stderr
    assert "exported" in done.stdout
    got = load_file(out)
    assert sorted(got) == sorted(reference())  # only /model/..., named without the prefix
    for name, t in reference().items():
        want = t.to(torch_dtype) if t.is_floating_point() else t  # ints stay as saved
        assert equal_bits(got[name], want), name


def test_cast_rounds_ties_subnormals_and_infinities_like_torch(cli, tmp_path):
    """One process, plain tensors: values at bf16/fp16 rounding ties, subnormals, infinities."""
    tie = 1 + 2 ** -8  # halfway between two bf16 values: rounds to even
    special = torch.tensor([tie, 1 + 3 * 2 ** -8, -tie, 1e-40, -3e-39, 65519.0, 65520.0, 1e30,
                            float("inf"), float("-inf"), 0.0, -0.0, 5.96e-8, 2.98e-8],
                           dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    state = {"special": special, "f64": torch.randn(1000, generator=g, dtype=torch.float64),
             "f16": torch.randn(77, generator=g).to(torch.float16),
             "i32": torch.arange(5, dtype=torch.int32)}
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    ckpt.save(3, state, blocking=True)
    ckpt.close()
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out = tmp_path / f"{dtype}.safetensors"
        done = export(cli, tmp_path / "ckpt", out, 3, "--to", "safetensors", "--dtype", dtype)
        assert done.returncode == 0, done.stderr
        got = load_file(out)
        assert equal_bits(got["/i32"], state["i32"])
        for name in ("special", "f64", "f16"):
            assert equal_bits(got[f"/{name}"], state[name].to(torch_dtype)), (dtype, name)


def test_a_flipped_byte_in_a_piece_is_named(cli, saved, tmp_path):
    damaged = tmp_path / "ckpt"
    shutil.copytree(saved, damaged)
    manifest = _core._CheckpointReader(str(damaged), 1, 1).manifest()
    piece = next(t for t in manifest["tensors"] if t["name"] == "/tp/w1~chunk1~piece1")
    flip_byte(damaged / piece["file"], piece["offset"] + 3)
    out = tmp_path / "model.safetensors"
    done = export(cli, damaged, out, 1, "--to", "safetensors")
    assert done.returncode == 3, done.stderr
    assert "/tp/w1~chunk1~piece1" in done.stderr and "checksum" in done.stderr
    assert "rank 1" in done.stderr
    assert not out.exists() and list(tmp_path.glob("model.safetensors*")) == []


@pytest.mark.parametrize("args,message", [
    (["7", "--to", "safetensors"], "step 7 is not a committed checkpoint"),
    (["1", "--to", "numpy"], "--to"),
    (["1", "--to", "safetensors", "--dtype", "fp8"], "--dtype"),
    (["1", "--to", "safetensors", "--rank", "2"], "there is no rank 2"),
    (["1", "--to", "safetensors", "--prefix", "/nothing/"], "starts with '/nothing/'"),
    (["1"], "--to"),
])
def test_usage_errors_exit_2(cli, saved, tmp_path, args, message):
    out = tmp_path / "model.safetensors"
    done = export(cli, saved, out, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert not out.exists()
