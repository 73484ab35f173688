"""zerowait.Checkpointer from Python: round trips of every dtype and structure, async handles,
in-place loads, safetensors compatibility, retention, incremental and compressed saves, corrupt
and missing steps, a full filesystem, and ranks in real processes (gloo and files)."""

from __future__ import annotations

import collections
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zerowait
from dist_checkpoint_worker import corrupt_tensor, rank_state
from helpers import start_ranks
from zerowait import _core

HERE = Path(__file__).parent
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
# Every dtype the installed torch has, experimental ones included.
ALL_DTYPES = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)} - QUANTIZED,
                    key=str)


# --- helpers -----------------------------------------------------------------------------------


def random_tensor(dtype: torch.dtype, shape: tuple, seed: int) -> torch.Tensor:
    """Random bytes viewed as `dtype` (any bit pattern: the test compares bytes)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).view(dtype).reshape(
        shape)


def raw_bytes(t: torch.Tensor) -> bytes:
    """The bytes of t's elements in row-major order, for dtypes without == or a copy kernel."""
    t = t.detach().resolve_conj().resolve_neg().cpu()
    if t.element_size() == 1:
        u = t.view(torch.uint8).contiguous()
    else:
        u = t.contiguous().reshape(-1).view(torch.uint8)
    return u.numpy().tobytes()


def assert_same(actual, expected, where: str = "state") -> None:
    """Equal values of equal types, dict keys in the same order with the same key types."""
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        assert actual.device == expected.device, where
        assert raw_bytes(actual) == raw_bytes(expected), where
    elif isinstance(expected, (np.ndarray, np.generic)):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        assert np.asarray(actual).tobytes() == np.asarray(expected).tobytes(), where
    elif isinstance(expected, dict):
        assert [(type(k), k) for k in actual] == [(type(k), k) for k in expected], where
        for k in expected:
            assert_same(actual[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), where
    elif isinstance(expected, float):
        assert actual == expected and math.copysign(1, actual) == math.copysign(1, expected), where
    else:
        assert actual == expected, where


def manifest(directory: Path, step: int, rank: int = 0) -> dict:
    return _core._CheckpointReader(str(directory), step, rank).manifest()


def small_state(value: float, tensors: int = 4) -> dict:
    return {"model": {f"layer.{i}.weight": torch.full((16, 16), value + i) for i in range(tensors)},
            "step": int(value)}


@pytest.fixture()
def ckpt_dir(tmp_path) -> Path:
    return tmp_path / "ckpt"


# --- what a state may hold ---------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*support is experimental:UserWarning")
def test_every_torch_dtype_round_trips_with_views(ckpt_dir):
    state = {}
    for i, dtype in enumerate(ALL_DTYPES):
        base = random_tensor(dtype, (4, 6), seed=i)
        state[str(dtype).removeprefix("torch.")] = {
            "full": base, "transposed": base.t(), "slice": base[1:3, ::2], "scalar": base[2, 3],
            "empty": base[:0]}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    assert_same(ckpt.load(), state)
    # Safetensors names where safetensors has one; raw bytes, with the real dtype in the
    # structure, where it does not.
    stored = {t["name"]: t for t in manifest(ckpt_dir, 1)["tensors"]}
    assert (stored["/bfloat16/full"]["dtype"], stored["/bfloat16/full"]["shape"]) == (
        "BF16", [4, 6])
    assert stored["/float8_e4m3fn/slice"]["dtype"] == "F8_E4M3"
    assert (stored["/complex128/full"]["dtype"], stored["/complex128/full"]["shape"]) == (
        "U8", [4 * 6 * 16])
    assert stored["/bfloat16/transposed"]["nbytes"] == 4 * 6 * 2  # the view's elements only
    assert stored["/bfloat16/scalar"]["nbytes"] == 2


def test_nested_structures_and_plain_values_round_trip(ckpt_dir):
    weight = torch.randn(4, 3)
    state = {
        "model": collections.OrderedDict(
            [("layer.0.weight", weight), ("layer.0.bias", torch.randn(4))]),
        "optimizer": {
            "state": {1: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 3)},
                      0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1],
                              "fused": None, "amsgrad": False}],
        },
        "tensors": {
            "zero_d": torch.tensor(7), "empty": torch.empty(0, 5), "transposed": weight.t(),
            "view": weight[1:, 2], "expanded": torch.randn(3, 1).expand(3, 4),
            "conj": torch.randn(3, dtype=torch.complex64).conj(),
            "parameter": torch.nn.Parameter(torch.randn(2)), "size": torch.Size([2, 3]),
            "requires_grad": torch.randn(2, requires_grad=True) * 2,
            "neg": torch._neg_view(torch.randn(3)),  # a negative bit without a conj bit
            "transposed_grad": torch.randn(2, 3, requires_grad=True).t(),
        },
        "numpy": {
            "f4": np.arange(6, dtype=np.float32).reshape(2, 3),
            "big_endian": np.arange(5, dtype=">i4"), "fortran": np.asfortranarray(
                np.arange(6.0).reshape(2, 3)),
            "bool": np.array([True, False]), "zero_d": np.array(3.5), "empty": np.zeros((0, 4)),
            "long_double": np.array([1.5, -2.0], dtype=np.longdouble),
            "strings": np.array(["a", "bcd"]), "dates": np.array(["2024-01-01"], "datetime64[D]"),
            "f64_scalar": np.float64(2.5), "i64_scalar": np.int64(-7), "bool_scalar": np.bool_(1),
        },
        "scalars": [0, -1, 2**70, -(2**64), 2**64 - 1, 1.5, -0.0, math.nan, math.inf, -math.inf,
                    True, False, None, "häh/~\"", b"\x00\xff", bytearray(b"ab")],
        "empty": {"dict": {}, "list": [], "tuple": (), "odict": collections.OrderedDict()},
        10: "int key", "10": "str key", -1: {2: (3, [4, {"deep": (torch.ones(2),)}])},
        2**64: "a key beyond 64 bits", -(2**63): "the smallest int64",
        "z": "keys keep their order, not sorted", "a": 1,
    }
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    loaded = ckpt.load()
    for name in ("requires_grad", "transposed_grad"):
        state["tensors"][name] = state["tensors"][name].detach()
    assert_same(loaded, state)
    assert loaded["tensors"]["parameter"].requires_grad


def test_the_walk_keeps_an_ordered_dicts_own_order_any_text_and_float_types(ckpt_dir):
    ordered = collections.OrderedDict([("a", torch.ones(1)), ("b", 2), ("c", 3)])
    ordered.move_to_end("a")  # its order is its own list's, no longer the dict's underneath
    text = "quote \" backslash \\ controls \n\t\x00\x1f\x7f snowman \u2603 emoji \U0001f600"
    state = {"ordered": ordered, text: text, "texts": [text, {text: torch.zeros(2)}],
             "floats": [1.0, -2.0, 1e16, 1e-300, 5e-324, 0.1, 1 / 3, float(2**53)]}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    loaded = ckpt.load()
    assert list(loaded["ordered"]) == ["b", "c", "a"]
    assert_same(loaded, state)
    assert all(type(x) is float for x in loaded["floats"])
    assert manifest(ckpt_dir, 1)["tensors"][1]["name"] == "/texts/1/" + text


def test_a_state_nested_deeper_than_pythons_recursion_limit_is_a_recursion_error(ckpt_dir):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    ckpt = zerowait.Checkpointer(ckpt_dir)
    with pytest.raises(RecursionError):
        ckpt.save(1, {"deep": deep})
    assert gc.isenabled()  # the walk pauses the collector: it is back on after a failure
    ckpt.save(1, {"fine": torch.ones(2)}, blocking=True)
    assert_same(ckpt.load(), {"fine": torch.ones(2)})


def test_module_state_dict_keeps_its_metadata(ckpt_dir):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, model.state_dict(), blocking=True)
    loaded = ckpt.load()
    assert loaded._metadata == model.state_dict()._metadata
    torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).load_state_dict(loaded)


def test_tensors_are_named_by_json_pointer_and_the_structure_is_plain_json(ckpt_dir):
    t = torch.arange(4.0)
    state = {"model": {"layer.0.weight": t}, "optimizer": {"state": {0: {"exp_avg": t}}},
             "a/b~c": t, 0: t, "0": t * 2}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    m = manifest(ckpt_dir, 1)
    names = [x["name"] for x in m["tensors"]]
    assert names[:4] == ["/model/layer.0.weight", "/optimizer/state/0/exp_avg", "/a~1b~0c", "/0"]
    assert len(set(names)) == 5  # int key 0 and str key "0" share a pointer: still two tensors
    assert_same(ckpt.load(), state)

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    ckpt.save(2, t, blocking=True)  # a state that is one tensor
    assert [x["name"] for x in manifest(ckpt_dir, 2)["tensors"]] == ["/"]
    assert_same(ckpt.load(), t)

    on_disk = (ckpt_dir / "step-1" / "rank-00000.json").read_text()
    structure = json.loads(on_disk, parse_constant=no_constants)["structure"]
    assert structure == m["structure"] and "pickle" not in on_disk
    node = structure["root"]["items"][0][1]["items"][0][1]
    assert {k: node[k] for k in ("type", "index", "dtype", "shape", "device")} == {
        "type": "tensor", "index": 0, "dtype": "float32", "shape": [4], "device": "cpu"}


@pytest.mark.filterwarnings("ignore:.*quantize_per_tensor:UserWarning")
def test_an_unsupported_value_is_a_type_error_naming_its_key_path(ckpt_dir):
    ckpt = zerowait.Checkpointer(ckpt_dir)
    state = {"optimizer": {"param_groups": [{"lr": 0.1, "fn": lambda: 0}]}}
    with pytest.raises(TypeError) as error:
        ckpt.save(1, state)
    assert str(error.value) == ('state["optimizer"]["param_groups"][0]["fn"]: cannot save an '
                                "object of type 'function'; pass allow_pickle=True to pickle it")
    with pytest.raises(TypeError, match=r'state\["a"\]\[1\]: .* type \'set\''):
        ckpt.save(1, {"a": (1, {2})})
    with pytest.raises(TypeError, match=r"state: cannot save a key of type 'float'"):
        ckpt.save(1, {1.5: 1})
    with pytest.raises(TypeError, match=r'state\["q"\]: cannot save a quantized tensor'):
        ckpt.save(1, {"q": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)})
    with pytest.raises(TypeError, match=r'state\["s"\]: cannot save a sparse_coo tensor'):
        ckpt.save(1, {"s": torch.eye(3).to_sparse()})
    with pytest.raises(TypeError, match=r"numpy array of dtype object"):
        ckpt.save(1, {"o": np.array([None, 1])})
    with pytest.raises(TypeError, match=r"type 'MaskedArray'"):  # would lose its mask
        ckpt.save(1, {"m": np.ma.masked_array([1, 2], mask=[0, 1])})
    loop = [1]
    loop.append({"back": loop})
    with pytest.raises(TypeError, match=r'state\[1\]\["back"\]: the state contains itself'):
        ckpt.save(1, loop)
    assert ckpt.steps() == [] and ckpt.latest() is None
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        ckpt.load()
    with pytest.raises(FileNotFoundError):
        ckpt.load(step=3)


def test_allow_pickle_stores_other_objects_and_loading_them_needs_it_too(ckpt_dir):
    import fractions

    state = {"ratio": fractions.Fraction(1, 3), "tags": {"a", "b"}, "w": torch.ones(2)}
    zerowait.Checkpointer(ckpt_dir, allow_pickle=True).save(1, state, blocking=True)
    assert_same(zerowait.Checkpointer(ckpt_dir, allow_pickle=True).load(), state)
    root = manifest(ckpt_dir, 1)["structure"]["root"]
    assert [node["type"] for _, node in root["items"]] == ["pickle", "pickle", "tensor"]
    with pytest.raises(ValueError, match=r'state\["ratio"\] was pickled; pass allow_pickle=True'):
        zerowait.Checkpointer(ckpt_dir).load()


# --- async saves -------------------------------------------------------------------------------


def test_save_returns_a_handle_and_snapshots_the_state(ckpt_dir):
    state = small_state(1.0)
    expected = {"model": {k: v.clone() for k, v in state["model"].items()}, "step": 1}
    with zerowait.Checkpointer(ckpt_dir) as ckpt:
        handle = ckpt.save(5, state)
        for tensor in state["model"].values():  # the training loop goes on at once
            tensor.zero_()
        assert isinstance(handle, zerowait.SaveHandle) and handle.step == 5
        result = handle.wait(timeout=60)
        assert handle.done() and handle.result() == result
        assert result["step"] == 5 and result["committed"]
        assert result["bytes_total"] == 4 * 16 * 16 * 4
        assert result["tensors_written"] == 4 and result["tensors_referenced"] == 0
        assert ckpt.save(6, state, blocking=True).done()
        assert ckpt.steps() == [5, 6] and ckpt.latest() == 6
        assert_same(ckpt.load(5), expected)
        assert ckpt.loaded_step == 5
        with pytest.raises(FileExistsError, match="already committed"):
            ckpt.save(6, state, blocking=True)
    with pytest.raises(ValueError, match="closed"):
        ckpt.save(7, state)


def test_skip_if_busy_while_a_rank_is_late_and_a_rank_that_never_comes(tmp_path):
    """File coordination: rank 0's save stays busy for as long as rank 1 has not saved (no
    window of time to hit), and commits once it has; wait(timeout) gives up without stopping the
    save. A rank that never comes fails the save at the commit timeout, committing nothing."""
    ckpt = zerowait.Checkpointer(tmp_path / "late", rank=0, world_size=2, commit_timeout=600)
    handle = ckpt.save(1, small_state(1.0))
    assert ckpt.save(2, small_state(2.0), skip_if_busy=True) is None
    with pytest.raises(TimeoutError, match="step 1 is still saving"):
        handle.wait(timeout=0.05)
    assert not handle.done()
    with zerowait.Checkpointer(tmp_path / "late", rank=1, world_size=2) as late:
        late.save(1, small_state(1.5), blocking=True)
    assert handle.wait(timeout=600)["committed"] and ckpt.steps() == [1]
    ckpt.close()

    ckpt = zerowait.Checkpointer(tmp_path / "never", rank=0, world_size=2, commit_timeout=0.3)
    handle = ckpt.save(1, small_state(1.0))
    with pytest.raises(TimeoutError, match="1 of 2 ranks"):
        handle.wait()
    assert handle.done() and ckpt.steps() == []
    ckpt.wait()  # reported by the handle already: nothing to raise
    assert ckpt.save(3, small_state(3.0), skip_if_busy=True) is not None  # no longer busy
    with pytest.raises(TimeoutError, match="step 3"):
        ckpt.close()  # nobody waited for step 3's handle


@pytest.fixture()
def device_path_on_cpu(monkeypatch):
    """Runs the GPU paths with CPU tensors: saved tensors are copied into staging by the Python
    side, restored ones filled through the staging pool (the device path's twin in C++)."""
    import zerowait._checkpoint_device

    monkeypatch.setattr(zerowait._checkpoint_device, "_host_addressable", lambda tensor: False)


def test_gpu_path_copies_through_staging(ckpt_dir, device_path_on_cpu):
    """Save and restore through staging, with CPU tensors (test_checkpoint_restore.cpp runs the
    restore's staging with small batches)."""
    state = {"w": torch.randn(3, 5).t(), "b": torch.arange(7, dtype=torch.bfloat16)[::2],
             "zero_d": torch.tensor(1.5), "empty": torch.empty(0),
             "big": [torch.randn(1 << 18) for _ in range(3)], "ids": np.arange(4),
             "step": 1}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    result = ckpt.save(1, state, blocking=True).wait()
    assert result["device_bytes"] == 0 and result["device_copy_s"] == 0  # no CUDA copies
    assert_same(ckpt.load(), state)
    assert_same(ckpt.load(map_location=None), state)


def test_gpu_path_fills_into_tensors_in_place(ckpt_dir, device_path_on_cpu):
    state = {"w": torch.randn(64, 32), "t": torch.randn(16, 8).t(), "h": torch.randn(9).half()}
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, state, blocking=True)
    target = {"w": torch.zeros(64, 32), "t": torch.zeros(16, 8).t(), "h": torch.zeros(9).half()}
    pointers = {k: v.data_ptr() for k, v in target.items()}
    loaded = ckpt.load(into=target)
    for key in state:
        assert loaded[key] is target[key] and target[key].data_ptr() == pointers[key]
        assert raw_bytes(target[key]) == raw_bytes(state[key]), key


def test_gpu_path_reports_a_damaged_tensor(ckpt_dir, device_path_on_cpu):
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, small_state(1.0), blocking=True)
    corrupt_tensor(ckpt_dir, 1, "/model/layer.2.weight")
    with pytest.raises(zerowait.CorruptDataError, match="layer.2.weight"):
        ckpt.load(step=1)


def test_a_snapshot_that_fails_half_way_leaves_the_checkpointer_usable(ckpt_dir,
                                                                      device_path_on_cpu,
                                                                      monkeypatch):
    """A copy into staging that fails: save() raises, gives the staging pool back, and the next
    save works."""
    import zerowait._checkpoint_device as device

    real_view = device._staging_view
    calls = []

    def failing_view(torch_module, address, nbytes):
        calls.append(nbytes)
        if len(calls) == 2:
            raise RuntimeError("copy failed (injected)")
        return real_view(torch_module, address, nbytes)

    monkeypatch.setattr(device, "_staging_view", failing_view)
    ckpt = zerowait.Checkpointer(ckpt_dir)
    with pytest.raises(RuntimeError, match="injected"):
        ckpt.save(1, small_state(1.0))
    ckpt.save(2, small_state(2.0), blocking=True)
    assert ckpt.steps() == [2]
    assert_same(ckpt.load(), small_state(2.0))


def test_an_open_checkpointer_finishes_its_last_save_at_exit(ckpt_dir):
    script = (f"import torch, zerowait\n"
              f"ckpt = zerowait.Checkpointer({str(ckpt_dir)!r})\n"
              f"ckpt.save(1, {{'w': torch.randn(1 << 20)}})\n")  # no wait(), no close()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert zerowait.Checkpointer(ckpt_dir).steps() == [1]


# --- loading -----------------------------------------------------------------------------------


def test_load_into_fills_existing_tensors_in_place(ckpt_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(3, {"model": model.state_dict(), "step": 3, "ids": np.arange(5)}, blocking=True)

    other = torch.nn.Linear(8, 4)
    target = other.state_dict()
    pointers = {k: v.data_ptr() for k, v in target.items()}
    ids = np.zeros(5, dtype=np.int64)
    loaded = ckpt.load(into={"model": target, "ids": ids})
    assert loaded["step"] == 3 and loaded["ids"] is ids and ids.tolist() == [0, 1, 2, 3, 4]
    for key, tensor in target.items():
        assert loaded["model"][key] is tensor and tensor.data_ptr() == pointers[key]
    assert torch.equal(other.weight, model.weight) and torch.equal(other.bias, model.bias)

    transposed = torch.empty(8, 4).t()  # not contiguous: read into a temporary, then copied
    loaded = ckpt.load(into={"model": {"weight": transposed}})
    assert loaded["model"]["weight"] is transposed and torch.equal(transposed, model.weight)
    assert torch.equal(loaded["model"]["bias"], model.bias)  # no counterpart: allocated

    with pytest.raises(ValueError, match=r'state\["model"\]\["weight"\]: the checkpoint holds '
                                         r"float32 \[4, 8\], but into= holds float32 \[4, 9\]"):
        ckpt.load(into={"model": {"weight": torch.empty(4, 9)}})
    with pytest.raises(ValueError, match=r"holds float32 \[4, 8\], but into= holds float64"):
        ckpt.load(into={"model": {"weight": torch.empty(4, 8, dtype=torch.float64)}})
    with pytest.raises(ValueError, match=r"holds a tensor, but into= holds list"):
        ckpt.load(into={"model": {"weight": [1]}})


def test_map_location_moves_loaded_tensors(ckpt_dir):
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, {"w": torch.ones(3), "p": torch.nn.Parameter(torch.ones(2))}, blocking=True)
    on_meta = ckpt.load(map_location="meta")
    assert on_meta["w"].device.type == on_meta["p"].device.type == "meta"
    assert type(on_meta["p"]) is torch.nn.Parameter and on_meta["p"].is_leaf
    assert ckpt.load(map_location=None)["w"].device.type == "cpu"  # where it was saved from


@pytest.mark.filterwarnings("ignore:.*support is experimental:UserWarning")
def test_every_safetensors_file_opens_with_safetensors(ckpt_dir):
    safetensors = pytest.importorskip("safetensors", reason="safetensors is not installed")
    state = {str(d).removeprefix("torch."): random_tensor(d, (8, 33), seed=i)
             for i, d in enumerate(ALL_DTYPES)}
    state["big"] = torch.randn(64, 1024)  # its own file: max_file_bytes is smaller
    ckpt = zerowait.Checkpointer(ckpt_dir, max_file_bytes=64 << 10)
    ckpt.save(1, state, blocking=True)
    m = manifest(ckpt_dir, 1)
    by_name = {t["name"]: t for t in m["tensors"]}
    assert len(m["files"]) > 1
    seen = 0
    for f in m["files"]:
        assert f["container"] == "safetensors"
        with safetensors.safe_open(str(ckpt_dir / f["path"]), framework="pt") as st:
            for name in st.keys():
                tensor = st.get_tensor(name)
                stored = by_name[name]
                assert [*tensor.shape] == stored["shape"]
                original = state[name.lstrip("/")]
                if stored["dtype"] != "U8" or original.dtype == torch.uint8:
                    assert tensor.dtype == original.dtype
                assert raw_bytes(tensor) == raw_bytes(original), name
                seen += 1
    assert seen == len(state)


# --- retention, incremental, compression -------------------------------------------------------


def test_retention_keeps_the_last_and_every_nth(ckpt_dir):
    ckpt = zerowait.Checkpointer(ckpt_dir, keep_last=2, keep_every=4)
    for step in range(1, 10):
        ckpt.save(step, small_state(step), blocking=True)
    ckpt.wait()
    assert ckpt.steps() == [4, 8, 9]
    assert sorted(p.name for p in ckpt_dir.glob("step-*")) == ["step-4", "step-8", "step-9"]
    for step in (4, 8, 9):
        assert_same(ckpt.load(step), small_state(step))


def test_incremental_save_writes_only_changed_tensors(ckpt_dir):
    state = {f"t{i:02d}": torch.randn(4096) for i in range(20)}
    ckpt = zerowait.Checkpointer(ckpt_dir, incremental=True)
    first = ckpt.save(1, state, blocking=True).wait()
    before = {k: v.clone() for k, v in state.items()}
    state["t03"].add_(1)
    state["t17"][5] = 42.0
    second = ckpt.save(2, state, blocking=True).wait()
    assert (second["tensors_written"], second["tensors_referenced"]) == (2, 18)
    assert second["bytes_total"] == first["bytes_total"] == 20 * 4096 * 4
    assert 2 * 4096 * 4 <= second["bytes_written"] <= 0.15 * second["bytes_total"]
    assert _core._ckpt_step_info(str(ckpt_dir), 2)["references"] == [1]
    assert_same(ckpt.load(), state)
    assert_same(ckpt.load(1), before)


def test_incremental_retention_never_deletes_a_referenced_file(ckpt_dir):
    state = {f"t{i}": torch.full((1024,), float(i)) for i in range(6)}
    expected = {}
    with zerowait.Checkpointer(ckpt_dir, incremental=True, keep_last=2) as ckpt:
        for step in range(1, 7):
            state[f"t{step % 6}"].add_(100)  # each step changes one tensor
            ckpt.save(step, state, blocking=True)
            expected[step] = {k: v.clone() for k, v in state.items()}
    assert ckpt.steps() == [5, 6]
    for step in (5, 6):
        assert _core._ckpt_verify(str(ckpt_dir), step)["problems"] == []
        assert_same(ckpt.load(step), expected[step])
    assert len(_core._ckpt_step_info(str(ckpt_dir), 6)["references"]) >= 2


def test_zstd_compression_round_trips(ckpt_dir):
    g = torch.Generator().manual_seed(3)
    state = {"bf16": torch.randn(256, 64, generator=g).bfloat16(),
             "f32": torch.randn(1000, generator=g), "i64": torch.arange(5000),
             "bool": torch.rand(77, generator=g) > 0.5,
             "c64": torch.randn(10, dtype=torch.complex64, generator=g), "empty": torch.empty(0),
             "zero_d": torch.tensor(2.0), "f8": random_tensor(torch.float8_e5m2, (33,), 1)}
    ckpt = zerowait.Checkpointer(ckpt_dir, compression="zstd")
    result = ckpt.save(1, state, blocking=True).wait()
    assert result["bytes_written"] < result["bytes_total"]
    assert {f["container"] for f in manifest(ckpt_dir, 1)["files"]} == {"zerowait-zstd"}
    assert_same(ckpt.load(), state)
    assert _core._ckpt_verify(str(ckpt_dir), 1)["problems"] == []


# --- damaged steps -----------------------------------------------------------------------------


def test_a_step_without_a_zerowait_state_is_skipped_like_a_damaged_one(ckpt_dir):
    """The policy is C++'s, but whether a step holds a state is Python's to say: a step saved by
    the bare engine (no state structure) is given up with a warning, and the older step loads."""
    with zerowait.Checkpointer(ckpt_dir) as ckpt:
        ckpt.save(1, small_state(1.0), blocking=True)
    weights = np.arange(10, dtype=np.float32)
    engine = _core._Checkpointer(ckpt_dir)
    pending = engine.begin_save(2, [("/w", "F32", [10], 4, True, weights.ctypes.data,
                                     weights.nbytes)], "null", False)
    pending.copy_host_tensors()
    assert pending.start().wait()["committed"]
    engine.wait_all()

    ckpt = zerowait.Checkpointer(ckpt_dir)
    with pytest.warns(UserWarning, match=r"step 2 in .* cannot be loaded: .*holds no zerowait "
                                         r"state; falling back to step 1"):
        state = ckpt.load()
    assert ckpt.loaded_step == 1
    assert_same(state, small_state(1.0))
    with pytest.raises(zerowait.CorruptDataError, match="holds no zerowait state"):
        ckpt.load(step=2)


def test_a_corrupt_newest_step_falls_back_to_the_previous_one(ckpt_dir):
    ckpt = zerowait.Checkpointer(ckpt_dir)
    ckpt.save(1, small_state(1.0), blocking=True)
    ckpt.save(2, small_state(2.0), blocking=True)
    bad_file = corrupt_tensor(ckpt_dir, 2, "/model/layer.2.weight")

    with pytest.warns(UserWarning) as warned:
        state = ckpt.load()
    assert_same(state, small_state(1.0))
    assert ckpt.loaded_step == 1
    message = str(warned[0].message)
    assert "step 2" in message and "falling back to step 1" in message
    assert Path(bad_file).name in message and "/model/layer.2.weight" in message

    with pytest.raises(zerowait.CorruptDataError, match="layer.2.weight"):
        ckpt.load(step=2)
    with pytest.raises(zerowait.CorruptDataError):
        ckpt.load(fallback=False)
    problems = _core._ckpt_verify(str(ckpt_dir), 2)["problems"]
    assert problems and Path(bad_file).name in " ".join(problems)
    assert _core._ckpt_verify(str(ckpt_dir), 1)["problems"] == []


def test_the_mirror_replaces_a_missing_or_corrupt_local_step(tmp_path):
    local, mirror = tmp_path / "local", tmp_path / "mirror"
    ckpt = zerowait.Checkpointer(local, mirror=mirror)
    ckpt.save(1, small_state(1.0), blocking=True)
    ckpt.save(2, small_state(2.0), blocking=True)
    ckpt.wait()  # the mirror copies
    assert zerowait.Checkpointer(mirror).steps() == [1, 2]
    assert _core._ckpt_verify(str(mirror), 2)["problems"] == []

    corrupt_tensor(local, 1, "/model/layer.0.weight")
    with pytest.warns(UserWarning, match=r"step 1 in .*local cannot be loaded: .*layer.0.weight"
                                         r".*; loading the mirror's copy"):
        assert_same(ckpt.load(1), small_state(1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the newest local step is intact: no word of the mirror
        assert_same(ckpt.load(), small_state(2.0))

    shutil.rmtree(local / "step-2")
    with pytest.warns(UserWarning, match=r"step 2 is not in .*local; loading the mirror's copy"):
        assert_same(ckpt.load(), small_state(2.0))
    assert ckpt.loaded_step == 2


URLS = ["s3://bucket/ck", "https://host/data", "gs://bucket/x", "file:///tmp/x"]


@pytest.mark.parametrize("url", URLS)
def test_a_url_is_refused_wherever_only_local_paths_work(url, cli, image_dataset, tmp_path,
                                                         monkeypatch):
    """A URL once became a local folder named "s3:": every entry point that takes a local path
    refuses one, naming it, and creates nothing. (Datasets read http(s) and s3 URLs, checkpoints
    s3 ones, and pack writes to s3: those are tested in test_remote_dataset.py and the C++ tests
    against a real S3 server.)"""
    monkeypatch.chdir(tmp_path)
    refused = f"'{url}' is a URL.*remote storage is not supported yet"
    readable_dataset = url.startswith(("https://", "s3://"))
    checkpoints_there = url.startswith("s3://")
    packs_there = url.startswith("s3://")
    if not checkpoints_there:
        with pytest.raises(ValueError, match=f"checkpoint directory.*{refused}"):
            zerowait.Checkpointer(url)
        with pytest.raises(ValueError, match=f"checkpoint mirror.*{refused}"):
            zerowait.Checkpointer(tmp_path / "ck", mirror=url)
    if not readable_dataset:
        with pytest.raises(ValueError, match=f"dataset {refused}"):
            zerowait.Dataset(url)
        with pytest.raises(ValueError, match=f"dataset {refused}"):
            zerowait.Loader(url, batch_size=4)
    with pytest.raises(ValueError, match=f"pack input {refused}"):
        zerowait.pack(url, tmp_path / "out")
    if not packs_there:
        with pytest.raises(ValueError, match=f"pack output {refused}"):
            zerowait.pack(image_dataset, url)
    commands = [] if packs_there else [["pack", image_dataset, "-o", url]]
    commands += [] if checkpoints_there else [["ckpt", "ls", url]]
    commands += [] if readable_dataset else [["verify", url]]
    for args in commands:
        result = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=120)
        assert result.returncode != 0, args
        assert "remote storage is not supported yet" in result.stderr, (args, result.stderr)
    assert list(tmp_path.iterdir()) == []  # no "s3:" folder, nothing half-made


def test_two_runs_sharing_a_mirror_never_pass_off_one_runs_step_as_the_others(tmp_path, cli):
    """Both runs save step 5 into one mirror: the second run's save is an error naming both runs
    (its copy was once skipped in silence), the mirror keeps the first run's step, and loading
    that step in the second run says whose it is."""
    mirror = tmp_path / "mirror"
    with zerowait.Checkpointer(tmp_path / "first", mirror=mirror) as first:
        first.save(5, small_state(1.0), blocking=True)
    assert len(first.run_id) >= 16  # random unless given

    second = zerowait.Checkpointer(tmp_path / "second", mirror=mirror, run_id="second-run")
    assert second.run_id == "second-run"
    with pytest.raises(FileExistsError, match=rf"step 5 .*mirror.*{first.run_id}.*second-run"):
        second.save(5, small_state(2.0), blocking=True)
    second.wait()  # reported by the save already
    assert second.steps() == []

    with pytest.warns(UserWarning, match=rf"step 5 .* was saved by run {first.run_id}, not by "
                                         r"this run \(second-run\)"):
        assert_same(second.load(5), small_state(1.0))
    assert second.loaded_run_id == first.run_id
    second.save(6, small_state(2.0), blocking=True)
    second.close()

    listed = run_cli_json(cli, "ckpt", "ls", mirror)
    assert [(s["step"], s["run_id"]) for s in listed["steps"]] == [(5, first.run_id),
                                                                   (6, "second-run")]
    table = subprocess.run([str(cli), "ckpt", "ls", str(mirror)], capture_output=True, text=True,
                           timeout=120).stdout
    assert first.run_id in table and "second-run" in table


def test_resuming_from_its_own_directory_is_silent(ckpt_dir):
    """A new run that resumes from the directory's steps is the normal case: no warning."""
    with zerowait.Checkpointer(ckpt_dir) as ckpt:
        ckpt.save(1, small_state(1.0), blocking=True)
    resumed = zerowait.Checkpointer(ckpt_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(resumed.load(), small_state(1.0))
    assert resumed.loaded_run_id == ckpt.run_id != resumed.run_id
    resumed.close()


SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "checkpoint-manifest.schema.json")
                    .read_text())


def schema_problems(value, schema: dict, where: str = "$") -> list:
    """The part of JSON Schema docs/checkpoint-manifest.schema.json uses ($ref, type, required,
    properties, items, const, enum, pattern, minimum, oneOf), so the test needs no jsonschema."""
    if "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    if "oneOf" in schema:
        matches = [s for s in schema["oneOf"] if not schema_problems(value, s, where)]
        return [] if len(matches) == 1 else [f"{where}: matches {len(matches)} of oneOf"]
    types = {"object": dict, "array": list, "string": str, "integer": int}
    if "type" in schema and (not isinstance(value, types[schema["type"]])
                             or isinstance(value, bool)):
        return [f"{where}: {value!r} is not of type {schema['type']}"]
    problems = []
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
        problems.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{where}: {value} is below {schema['minimum']}")
    for key in schema.get("required", []):
        if key not in value:
            problems.append(f"{where}: no {key!r}")
    for key, sub in schema.get("properties", {}).items():
        if key in value:
            problems += schema_problems(value[key], sub, f"{where}.{key}")
    for i, item in enumerate(value if "items" in schema else []):
        problems += schema_problems(item, schema["items"], f"{where}[{i}]")
    return problems


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_every_manifest_emitter_follows_the_one_schema(ckpt_dir, cli, compression):
    """The manifest on disk, the Python bindings' manifest and `ckpt inspect --json` are one
    document with one set of field names and encodings (hex xxh3, "nbytes")."""
    ckpt = zerowait.Checkpointer(ckpt_dir, compression=compression, incremental=True)
    ckpt.save(1, small_state(1.0), blocking=True)
    state = small_state(1.0)
    state["model"]["layer.0.weight"] += 1  # step 2 references step 1's other tensors
    ckpt.save(2, state, blocking=True)
    ckpt.close()
    rank_schema = {"$ref": "#/$defs/rank_manifest"}
    on_disk = json.loads((ckpt_dir / "step-2" / "rank-00000.json").read_text())
    record = json.loads((ckpt_dir / "step-2" / "manifest.json").read_text())
    from_python = manifest(ckpt_dir, 2)
    inspected = run_cli_json(cli, "ckpt", "inspect", ckpt_dir, 2)
    from_cli = inspected["ranks"][0]
    for name, document, schema in [("rank-00000.json", on_disk, rank_schema),
                                   ("manifest.json", record, {"$ref": "#/$defs/commit_record"}),
                                   ("python", from_python, rank_schema),
                                   ("ckpt inspect --json", from_cli, rank_schema),
                                   ("either", on_disk, SCHEMA)]:
        assert schema_problems(document, schema) == [], name
    assert from_python == on_disk
    for entry in from_cli["tensors"] + from_cli["files"]:
        entry.pop("in_step"), entry.pop("referenced")
    assert from_cli == on_disk
    assert inspected["run_id"] == record["run_id"] == on_disk["run_id"] == ckpt.run_id
    assert {t["file"].split("/")[0] for t in on_disk["tensors"]} == {"step-1", "step-2"}
    # The check itself catches the old spellings.
    old = dict(from_python, tensors=[dict(t, xxh3=int(t["xxh3"], 16)) for t in on_disk["tensors"]])
    assert schema_problems(old, rank_schema)
    renamed = [{("bytes" if k == "nbytes" else k): v for k, v in t.items()}
               for t in on_disk["tensors"]]
    assert schema_problems(dict(on_disk, tensors=renamed), rank_schema)


def run_cli_json(cli, *args) -> dict:
    result = subprocess.run([str(cli), *map(str, args), "--json"], capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_full_filesystem_fails_the_save_and_keeps_the_previous_step(tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount an 8 MiB tmpfs ({mounted.stderr.strip()}): the full "
                    f"filesystem test needs root")
    try:
        directory = mount_point / "ckpt"
        ckpt = zerowait.Checkpointer(directory)
        ckpt.save(1, small_state(1.0), blocking=True)
        with pytest.raises(OSError, match="No space left on device"):
            ckpt.save(2, {"big": torch.randn(3 << 20)}, blocking=True)  # 12 MiB
        assert ckpt.steps() == [1]
        assert_same(ckpt.load(), small_state(1.0))
        ckpt.close()  # the handle reported the error: close() does not raise it again
        assert (directory / "step-2.tmp").exists()
        zerowait.Checkpointer(directory).close()  # the next run removes the orphan
        assert sorted(p.name for p in directory.iterdir() if p.name.startswith("step-")) == [
            "step-1"]
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


# --- ranks in real processes -------------------------------------------------------------------


def run_ranks(mode: str, world_size: int, directory: Path, out: Path) -> list:
    """Runs dist_checkpoint_worker.py as `world_size` processes; returns their reports."""
    procs = start_ranks(HERE / "dist_checkpoint_worker.py", [mode, directory, out], world_size)
    reports = []
    for rank, p in enumerate(procs):
        _, err = p.communicate(timeout=120)
        report = out / f"rank-{rank}.json"
        reports.append(json.loads(report.read_text()) if report.exists() else None)
        if reports[-1] is None or not reports[-1].get("exits"):
            assert p.returncode == 0, f"rank {rank}:\n{err}"
    return reports


@pytest.mark.parametrize("mode", ["gloo", "files"])
def test_each_rank_saves_and_loads_its_own_part(mode, tmp_path):
    directory = tmp_path / "ckpt"
    reports = run_ranks(mode, 2, directory, tmp_path)
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["steps"] == [1, 2] and r["coordinated_by"] == mode for r in reports)
    assert reports[0]["committed"] == [True, True]
    assert _core._ckpt_step_info(str(directory), 2)["world_size"] == 2
    assert _core._ckpt_verify(str(directory), 1)["problems"] == []
    for rank in range(2):  # read back from here too: every rank's part is in the step
        ckpt = zerowait.Checkpointer(directory, rank=rank, world_size=2)
        assert_same(ckpt.load(1), rank_state(rank, 1))
    if mode == "files":
        assert _core._ckpt_verify(str(directory), 2)["problems"] == []
        return
    # Rank 1 damaged its part of step 2: rank 1 fell back, and rank 0 followed it.
    assert [r["after_damage"]["loaded_step"] for r in reports] == [1, 1]
    assert "rank 0 loaded step 2, but another rank could only load step 1" in " ".join(
        reports[0]["after_damage"]["warnings"])
    assert "falling back to step 1" in " ".join(reports[1]["after_damage"]["warnings"])
    assert _core._ckpt_verify(str(directory), 2)["problems"]


def test_a_rank_that_dies_mid_save_leaves_the_step_uncommitted(tmp_path):
    directory = tmp_path / "ckpt"
    reports = run_ranks("gloo-die", 3, directory, tmp_path)
    assert reports[1]["exits"]
    for report in (reports[0], reports[2]):
        assert report["step_1"] == "committed"
        assert report["step_2"].startswith("ZerowaitIOError: step 2 was not committed: the "
                                           "ranks lost contact at step 2")
        # Later saves fail at once instead of waiting for the dead rank.
        assert report["step_3"].startswith("ZerowaitIOError: step 3 was not committed: the "
                                           "ranks lost contact at step 2")
        assert report["steps_after"] == [1]
    assert zerowait.Checkpointer(directory).steps() == [1]
    assert not (directory / "step-2").exists()


@pytest.mark.parametrize("direct_reads", [True, False])
def test_loads_with_and_without_o_direct(ckpt_dir, direct_reads):
    state = {"w": torch.randn(300_000), "b": torch.arange(5000, dtype=torch.bfloat16), "n": 3}
    zerowait.Checkpointer(ckpt_dir).save(1, state, blocking=True)
    assert_same(zerowait.Checkpointer(ckpt_dir, direct_reads=direct_reads).load(), state)
