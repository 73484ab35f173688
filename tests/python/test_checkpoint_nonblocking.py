"""A save that never blocks the step (docs/checkpoint.md, "A save that never blocks").

save() copies the tensors an optimizer owns after it returns; an optimizer step waits for that
copy, other tensors are copied before save() returns, and an in-place change of a tracked tensor
outside a step fails the save. The background copy is held back with the engine's fault point
$ZEROWAIT_FAULT_COPY_STALL_MS, so the training loop reaches its next step while the copy is still
to come, whatever the machine's load: the order of events is asserted, never a time.
"""

from __future__ import annotations

import pytest
import torch

import zerowait

# Long enough that save() has returned and the test's next statement runs before the copy
# starts, even on a loaded machine; each test below waits for it once or twice.
STALL_MS = "2500"


@pytest.fixture
def stalled_copy(monkeypatch):
    monkeypatch.setenv("ZEROWAIT_FAULT_COPY_STALL_MS", STALL_MS)


def trained(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 1) -> None:
    """Steps the optimizer on a fixed batch (the first step makes it known to Checkpointers)."""
    generator = torch.Generator().manual_seed(7)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 16, generator=generator)).square().mean().backward()
        optimizer.step()


def forward_backward(model: torch.nn.Module) -> None:
    model(torch.randn(8, 16)).square().mean().backward()


def copies(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


def assert_equal_states(loaded: dict, expected: dict) -> None:
    assert loaded.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key


def test_the_step_after_save_changes_every_parameter_and_the_saved_step_holds_the_old_values(
        tmp_path, stalled_copy):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)
    before = copies(model.state_dict())
    momentum_before = {i: s["momentum_buffer"].clone()
                       for i, s in optimizer.state_dict()["state"].items()}

    handle = ckpt.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert not handle.copied(), "save() returned before the parameters were copied"
    forward_backward(model)  # runs while the copy is still to come
    optimizer.step()         # waits for the copy, then changes every parameter
    assert handle.copied()
    for key, value in model.state_dict().items():
        assert not torch.equal(value, before[key]), f"the step left {key} unchanged"

    result = handle.wait()
    assert result["committed"]
    assert result["copy_wait_s"] > 0  # the optimizer step waited for the copy ...
    assert ckpt.blocked_s >= result["copy_wait_s"]  # ... and the loop's stall says so
    # ... but not for the writer, held back STALL_MS: the step's own thread copied the tensors
    # meanwhile (SaveJob::take_copy_pieces), so it returned before the writer woke.
    assert result["copy_wait_s"] < int(STALL_MS) / 1000
    loaded = ckpt.load(1)
    assert_equal_states(loaded["model"], before)
    for i, momentum in momentum_before.items():
        assert torch.equal(loaded["optim"]["state"][i]["momentum_buffer"], momentum)
    ckpt.close()


def test_batchnorm_statistics_changed_by_the_next_forward_keep_their_save_time_values(
        tmp_path, stalled_copy):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)
    before = copies(model.state_dict())

    handle = ckpt.save(1, {"model": model.state_dict()})
    assert not handle.copied()
    forward_backward(model)  # training mode: running_mean, running_var, num_batches_tracked move
    for name in ("1.running_mean", "1.running_var", "1.num_batches_tracked"):
        assert not torch.equal(model.state_dict()[name], before[name]), name
    optimizer.step()
    assert handle.wait()["committed"]
    assert_equal_states(ckpt.load(1)["model"], before)
    ckpt.close()


def test_a_tensor_no_optimizer_owns_is_copied_before_save_returns(tmp_path, stalled_copy):
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)
    ema = {k: v.clone() for k, v in model.state_dict().items()}
    ema_before = copies(ema)

    handle = ckpt.save(1, {"model": model.state_dict(), "ema": ema})
    assert not handle.copied()  # the parameters are still to be copied ...
    for value in ema.values():
        value.add_(1.0)  # ... but the EMA copy, which no optimizer owns, already was
    assert handle.wait()["committed"]
    assert_equal_states(ckpt.load(1)["ema"], ema_before)
    ckpt.close()


def test_an_inference_tensor_an_optimizer_owns_is_copied_before_save_returns(tmp_path,
                                                                            stalled_copy):
    # It keeps no version count, so no guard could tell a torn background copy of it.
    with torch.inference_mode():
        frozen = torch.arange(8.0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD([{"params": model.parameters()}, {"params": [frozen]}], lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)  # the optimizer is known now; frozen has no grad: left as it is

    handle = ckpt.save(1, {"model": model.state_dict(), "frozen": frozen})
    assert not handle.copied()  # the parameters are still to be copied ...
    with torch.inference_mode():
        frozen.add_(1.0)  # ... but the inference tensor already was
    assert handle.wait()["committed"]
    assert torch.equal(ckpt.load(1)["frozen"], torch.arange(8.0))
    ckpt.close()


def test_an_in_place_edit_of_a_parameter_outside_a_step_fails_the_save_naming_it(
        tmp_path, stalled_copy):
    model = torch.nn.Sequential(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)

    handle = ckpt.save(1, {"model": model.state_dict()})
    assert not handle.copied()
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # not an optimizer step: nothing waits for the copy
    with pytest.raises(zerowait.CancelledError, match=r"/model/0\.weight changed in place"):
        handle.wait()
    assert ckpt.steps() == []  # a snapshot that may be torn is never committed

    # The Checkpointer saves on; its next save holds the edited weights.
    edited = copies(model.state_dict())
    second = ckpt.save(2, {"model": model.state_dict()})
    optimizer.step()
    assert second.wait()["committed"]
    assert_equal_states(ckpt.load(2)["model"], edited)
    ckpt.close()


def test_an_optimizer_owning_none_of_the_saved_tensors_does_not_wait(
        tmp_path, stalled_copy):
    saved, other = torch.nn.Linear(16, 4), torch.nn.Linear(16, 4)
    saved_optimizer = torch.optim.SGD(saved.parameters(), lr=0.1)
    other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(saved, saved_optimizer)
    trained(other, other_optimizer)
    before = copies(saved.state_dict())

    handle = ckpt.save(1, {"model": saved.state_dict()})
    trained(other, other_optimizer)  # owns nothing of this save: does not wait
    assert not handle.copied()
    assert handle.wait()["committed"]
    assert_equal_states(ckpt.load(1)["model"], before)
    ckpt.close()


def test_load_into_the_saved_tensors_waits_for_the_copy(tmp_path, stalled_copy):
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)
    first = copies(model.state_dict())
    ckpt.save(1, {"model": model.state_dict()}).wait()
    trained(model, optimizer)
    second = copies(model.state_dict())

    handle = ckpt.save(2, {"model": model.state_dict()})
    assert not handle.copied()
    ckpt.load(1, into={"model": model.state_dict()})  # would overwrite what step 2 copies
    assert handle.copied()
    assert_equal_states(model.state_dict(), first)
    assert handle.wait()["committed"]
    assert_equal_states(ckpt.load(2)["model"], second)
    ckpt.close()


def test_without_background_copy_or_a_known_optimizer_save_copies_everything_first(
        tmp_path, stalled_copy):
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    never_stepped = torch.nn.Linear(16, 4)
    torch.optim.SGD(never_stepped.parameters(), lr=0.1)
    blocking = zerowait.Checkpointer(tmp_path / "blocking", background_copy=False)
    background = zerowait.Checkpointer(tmp_path / "background")
    trained(model, optimizer)

    assert blocking.save(1, {"model": model.state_dict()}).copied()
    # An optimizer that never stepped is not known: its tensors are copied in save().
    assert background.save(1, {"model": never_stepped.state_dict()}).copied()
    blocking.close()
    background.close()


def test_a_checkpointer_keeps_no_optimizer_or_state_alive(tmp_path):
    import gc
    import weakref

    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ckpt = zerowait.Checkpointer(tmp_path / "ckpt")
    trained(model, optimizer)
    ckpt.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()}).wait()
    gone = [weakref.ref(optimizer), weakref.ref(model.weight)]
    del model, optimizer
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    ckpt.close()
