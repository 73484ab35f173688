"""Checkpoints from HBM: zerowait's save() against torch.distributed.checkpoint.async_save and
torch.save, restore to the GPU against safetensors, all on one bf16 state on the GPU (8 GiB at
--scale full, a list of 64-256 MiB tensors like a large model's), in one process.

- save: the time each call held the caller, with everything it needs done before the tensors may
  change. zerowait: save() returns once its copies are queued, the caller's stream waiting for
  them; the GPU stall is measured too (events around save() on the caller's stream, idle before:
  the most it can be) and the time until the step is committed. DCP async_save: with its default
  staging (a blocking copy to CPU memory) and with DefaultStager (pinned memory, staged on a
  background thread: the caller must wait for staging_completion before changing the tensors).
  torch.save: the whole call. Each measured after a warm-up (zerowait's first save faults in and
  pins its staging pool; DefaultStager's first staging allocates its pinned copies);
- D2H bandwidth of zerowait's copies (CUDA events on its copy stream) against copy_(non_blocking)
  of the same tensors into one pinned (cudaHostAlloc) buffer, timed with CUDA events;
- restore to the GPU: Checkpointer.load(map_location="cuda") against
  safetensors.torch.load_file(device="cuda") of the same tensors, warm (page cache; zerowait with
  direct_reads=False) and cold (page cache dropped; zerowait's default O_DIRECT reads), both
  checked bit for bit against the source.

Time is bounded: saves go to /dev/shm when it has room (the writes then cost memory bandwidth, not
the unknown disk's), else to --work; a 256 MiB write probe sizes what goes to disk, and a stage
that would overrun the section's budget is skipped with a note.

    python bench/gpu_checkpoint.py --cpu-check   # the peers' API calls on CPU tensors (no GPU)
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import common
from common import log, ratio

GiB, MiB = 1 << 30, 1 << 20
BUDGET_S = {"full": 75.0, "small": 40.0}
STATE_BYTES = {"full": 8 * GiB, "small": 512 * MiB}
TENSOR_MIB = (256, 128, 64, 256, 192)  # cycled: a large model's shapes
SHM = Path("/dev/shm")


def make_state(torch, total, device, dtype):
    """{"model": {"layers.i.weight": tensor}} of about `total` bytes, tensors of TENSOR_MIB."""
    gen = torch.Generator(device=device).manual_seed(5)
    model, used, i = {}, 0, 0
    while used < total:
        nbytes = min(TENSOR_MIB[i % len(TENSOR_MIB)] * MiB, total - used)
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        model[f"layers.{i}.weight"] = torch.randn(elements, device=device, generator=gen).to(dtype)
        used += nbytes
        i += 1
    return {"model": model}


def tensors(state):
    return list(state["model"].values())


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


def prefix_state(state, limit):
    """The first tensors of `state` holding at most `limit` bytes (at least one)."""
    model, used = {}, 0
    for name, t in state["model"].items():
        if model and used + t.numel() * t.element_size() > limit:
            break
        model[name] = t
        used += t.numel() * t.element_size()
    return {"model": model}


def same_bits(torch, loaded, source):
    for name, t in source.items():
        if not torch.equal(loaded[name].view(torch.int16), t.view(torch.int16)):
            raise AssertionError(f"restored tensor {name} differs from the saved one")


class Run:
    def __init__(self, args, device):
        import torch

        self.torch, self.device = torch, device
        self.cuda = device == "cuda"
        self.scale = args.scale
        self.started = time.monotonic()
        self.budget = BUDGET_S[args.scale]
        self.work = Path(args.work) / "checkpoint"
        common.empty_folder(self.work)
        self.rows, self.ratios, self.notes = [], [], []
        self.figures = {}

    def left(self):
        return self.budget - (time.monotonic() - self.started)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def row(self, what, **figures):
        self.rows.append({"measurement": what, **figures})
        log(f"{what}: {figures}", "gpu_checkpoint")

    def skip(self, what, needs_s):
        if self.left() >= needs_s:
            return False
        self.notes.append(f"skipped {what}: about {needs_s:.0f} s needed, "
                          f"{max(self.left(), 0):.0f} s of the section's budget left")
        return True

    # --- where the bytes go -----------------------------------------------------------------

    def probe_disk(self):
        """Write bandwidth of --work with an fsync (256 MiB): what sizes the disk stages."""
        path = self.work / "probe"
        block = os.urandom(8 * MiB)
        started = time.monotonic()
        with open(path, "wb") as f:
            for _ in range(32):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        bps = 256 * MiB / (time.monotonic() - started)
        path.unlink()
        self.row("disk write probe (256 MiB + fsync)", path=str(self.work), GB_s=bps / 1e9)
        return bps

    def probe_first_touch(self):
        """How fast fresh host memory fills (256 MiB): every peer but zerowait's warm pool copies
        into new memory, and page faults may cost far more than the copy (0.3 GB/s on some VMs)."""
        torch = self.torch
        started = time.monotonic()
        torch.empty(256 * MiB, dtype=torch.uint8).fill_(1)
        bps = 256 * MiB / (time.monotonic() - started)
        self.row("first-touch probe (256 MiB of new host memory)", GB_s=bps / 1e9)
        return bps

    def save_dir(self, state_bytes):
        """/dev/shm when it can hold two saves at once with room to spare, else --work."""
        try:
            free = shutil.disk_usage(SHM).free if SHM.is_dir() else 0
        except OSError:
            free = 0
        if free >= 2.5 * state_bytes + GiB:
            path = SHM / f"zerowait-bench-{os.getpid()}"
            self.notes.append(f"saves written to {SHM} (tmpfs, {free / GiB:.0f} GiB free): "
                              f"blocking and staging are measured, not the disk")
        else:
            path = self.work / "saves"
            self.notes.append(f"saves written to {path}: {SHM} has {free / GiB:.1f} GiB free")
        common.empty_folder(path)
        return path

    # --- save ---------------------------------------------------------------------------------

    def reference_d2h(self, state):
        """copy_(non_blocking) of every tensor into one pinned buffer, timed with CUDA events."""
        torch = self.torch
        ts = tensors(state)
        pinned = torch.empty(nbytes(ts), dtype=torch.uint8, pin_memory=True)
        best = None
        for _ in range(3):  # the first warms up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            offset = 0
            start.record()
            for t in ts:
                n = t.numel() * t.element_size()
                pinned[offset:offset + n].copy_(t.view(-1).view(torch.uint8), non_blocking=True)
                offset += n
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
            best = seconds if best is None else min(best, seconds)
        del pinned
        gbps = nbytes(ts) / best / 1e9
        self.row("pinned copy_(non_blocking) D2H (reference)", GB_s=gbps, seconds=best)
        return gbps

    def zerowait_save(self, state, directory):
        import zerowait

        torch = self.torch
        ckpt = zerowait.Checkpointer(directory / "zerowait", keep_last=1)
        first = time.monotonic()
        ckpt.save(1, state).wait()
        self.row("zerowait save, first (staging pool faulted in and pinned)",
                 blocked_s=ckpt.blocked_s, committed_s=time.monotonic() - first)
        best = None
        for step in (2, 3) if self.scale == "small" else (2,):
            self.sync()
            before = torch.cuda.Event(enable_timing=True) if self.cuda else None
            after = torch.cuda.Event(enable_timing=True) if self.cuda else None
            if before is not None:
                before.record()
            started = time.monotonic()
            handle = ckpt.save(step, state)
            blocked = time.monotonic() - started
            if after is not None:
                after.record()  # runs once the caller's stream has waited for the copies
            result = handle.wait()
            committed = time.monotonic() - started
            stall = before.elapsed_time(after) / 1000 if before is not None else 0.0
            figures = {"blocked_s": blocked, "gpu_stall_s": stall, "committed_s": committed,
                       "d2h_s": result["device_copy_s"],
                       "d2h_GB_s": result["device_bytes"] / max(result["device_copy_s"], 1e-9)
                       / 1e9, "writer_waited_s": result["device_wait_s"]}
            if best is None or blocked < best["blocked_s"]:
                best = figures
        ckpt.close()
        self.row("zerowait save (pool warm)", **best)
        shutil.rmtree(directory / "zerowait", ignore_errors=True)
        return best

    def dcp_async_save(self, state, directory, stager_kind):
        """DCP async_save, default staging or DefaultStager: the time it held the caller, when
        the tensors may change again (staging done), and when the checkpoint is written."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        stager = None
        if stager_kind == "DefaultStager":
            # Pinned memory and a background thread; shared memory only serves the process
            # executor (not used here) and needs /dev/shm room for the whole state.
            options = StagingOptions(use_pinned_memory=self.cuda, use_shared_memory=False,
                                     use_async_staging=True, use_non_blocking_copy=self.cuda)
            stager = DefaultStager(options)
            stager.stage(state).result()  # warm-up: its pinned copies are allocated and cached
        else:
            tiny = {"w": self.torch.ones(1024, device=self.device)}
            dcp.async_save(tiny, checkpoint_id=str(directory / "dcp-warm")).result()
        self.sync()
        kwargs = {"async_stager": stager} if stager is not None else {}
        started = time.monotonic()
        response = dcp.async_save(state, checkpoint_id=str(directory / "dcp"), **kwargs)
        blocked = time.monotonic() - started
        if hasattr(response, "staging_completion"):
            response.staging_completion.result()
            upload = response.upload_completion
        else:
            upload = response
        staged = time.monotonic() - started
        upload.result()
        written = time.monotonic() - started
        if stager is not None:
            stager.close()
        shutil.rmtree(directory / "dcp", ignore_errors=True)
        shutil.rmtree(directory / "dcp-warm", ignore_errors=True)
        self.row(f"DCP async_save ({stager_kind})", blocked_s=blocked, staged_s=staged,
                 written_s=written)
        return {"blocked_s": blocked, "staged_s": staged}

    def torch_save(self, state, directory):
        path = directory / "torch.pt"
        self.sync()
        started = time.monotonic()
        self.torch.save(state, path)
        blocked = time.monotonic() - started
        path.unlink()
        self.row("torch.save", blocked_s=blocked)
        return blocked

    # --- restore ------------------------------------------------------------------------------

    def restore(self, state, disk_bps, touch_bps):
        import safetensors.torch
        import zerowait

        torch = self.torch
        # Per byte restored: four passes over the disk (two files written, two read cold), two
        # into new host memory (a new Checkpointer's pool, safetensors' CPU copies) and about
        # four more through memory (loads), in 80 % of the time left.
        seconds_per_byte = 4 / disk_bps + 2 / touch_bps + 4 / 5e9
        limit = max(64 * MiB, min(nbytes(tensors(state)), 0.8 * self.left() / seconds_per_byte))
        rstate = prefix_state(state, limit)
        total = nbytes(tensors(rstate))
        if total < nbytes(tensors(state)):
            self.notes.append(f"restore measured on the first {total / GiB:.2f} GiB of the state: "
                              f"the disk writes at {disk_bps / 1e9:.2f} GB/s")
        source = rstate["model"]
        directory = self.work / "restore"
        common.empty_folder(directory)
        zerowait.Checkpointer(directory / "zerowait").save(1, rstate, blocking=True)
        st_path = directory / "state.safetensors"
        safetensors.torch.save_file({k: v.cpu() for k, v in source.items()}, str(st_path))
        cache = common.Cache(lambda: [str(p) for p in directory.rglob("*") if p.is_file()])
        if cache.note():
            self.notes.append(cache.note())

        def zerowait_load(direct):
            loaded = zerowait.Checkpointer(directory / "zerowait", direct_reads=direct).load(
                map_location=self.device)
            return loaded["model"]

        def safetensors_load(_direct):
            return safetensors.torch.load_file(str(st_path), device=self.device)

        results = {}
        for temperature in ("warm", "cold"):
            for name, load in (("zerowait", zerowait_load), ("safetensors", safetensors_load)):
                if temperature == "warm":
                    same_bits(torch, load(False), source)  # warms the cache and the pools
                else:
                    cache.drop()
                self.sync()
                started = time.monotonic()
                loaded = load(temperature == "cold")
                self.sync()
                seconds = time.monotonic() - started
                same_bits(torch, loaded, source)
                del loaded
                results[(name, temperature)] = seconds
                self.row(f"restore to {self.device}: {name}, {temperature}", GiB=total / GiB,
                         seconds=seconds, GB_s=total / seconds / 1e9)
        shutil.rmtree(directory, ignore_errors=True)
        return results

    # --- the section --------------------------------------------------------------------------

    def measure_saves(self, state, saves):
        total = nbytes(tensors(state))
        ref = self.reference_d2h(state) if self.cuda else None
        zw = self.zerowait_save(state, saves)
        plain = self.dcp_async_save(state, saves, "default staging")
        pinned = (None if self.skip("DCP async_save with DefaultStager", 3 * total / 4e9 + 5)
                  else self.dcp_async_save(state, saves, "DefaultStager"))
        if ref is not None:
            self.ratios.append(ratio("zerowait D2H bandwidth / pinned copy_ (same bytes)",
                                     zw["d2h_GB_s"] / ref, 0.85, True))
        self.ratios.append(ratio("zerowait save() blocking / DCP async_save blocking",
                                 zw["blocked_s"] / plain["blocked_s"], 0.5, False))
        if pinned is not None:
            self.ratios.append(ratio(
                "zerowait save() blocking / DCP+DefaultStager wait until staged",
                zw["blocked_s"] / pinned["staged_s"], 0.5, False))
            self.notes.append(
                f"GPU stall after zerowait's save() (its copies, caller stream idle before): "
                f"{zw['gpu_stall_s']:.3f} s; DCP+DefaultStager staging: "
                f"{pinned['staged_s']:.3f} s, during which the caller must not change the "
                f"tensors (the CPU waits, or the loop risks a torn checkpoint)")

    def run(self):
        torch = self.torch
        disk_bps = self.probe_disk()
        touch_bps = self.probe_first_touch()
        state_bytes = STATE_BYTES[self.scale]
        # Five fresh host copies of the state (the pinned reference, zerowait's first pool, DCP's
        # two stagings, torch.save) in under half the budget.
        fit = 0.45 * self.budget * touch_bps / 5
        if fit < state_bytes:
            state_bytes = min(state_bytes, max(256 * MiB, int(fit)))
            self.notes.append(f"state shrunk to {state_bytes / GiB:.2f} GiB: new host memory "
                              f"fills at {touch_bps / 1e9:.2f} GB/s here")
        saves = self.save_dir(state_bytes)
        if not str(saves).startswith(str(SHM)):
            # Four saves of the state reach the disk (two zerowait, two DCP) plus torch.save's.
            fit = 0.4 * self.budget * disk_bps / 5
            if fit < state_bytes:
                state_bytes = min(state_bytes, max(256 * MiB, int(fit)))
                self.notes.append(f"state shrunk to {state_bytes / GiB:.2f} GiB so that its "
                                  f"saves fit the time budget at {disk_bps / 1e9:.2f} GB/s")
        state = make_state(torch, state_bytes, self.device, torch.bfloat16)
        total = nbytes(tensors(state))
        self.notes.append(f"state: {len(state['model'])} bf16 tensors on {self.device}, "
                          f"{total / GiB:.2f} GiB")
        try:
            self.measure_saves(state, saves)
            if not self.skip("restore", 10):
                times = self.restore(state, disk_bps, touch_bps)
                for temperature in ("warm", "cold"):
                    self.ratios.append(ratio(
                        f"restore to {self.device}, {temperature}: zerowait speed / safetensors",
                        times[("safetensors", temperature)] / times[("zerowait", temperature)],
                        1.0, True))
            if not self.skip("torch.save", total / min(touch_bps, disk_bps) + 5):
                self.torch_save(state, saves)
        finally:
            shutil.rmtree(saves, ignore_errors=True)
        return {"rows": self.rows, "ratios": self.ratios, "notes": self.notes}


def run(args):
    """The section for bench/gpu.py: CUDA tensors (bench/gpu.py calls it only with a device)."""
    return Run(args, "cuda").run()


def main():
    """--cpu-check: the same calls on small CPU tensors, to check the peers' APIs where there is
    no GPU (the figures mean nothing)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--cpu-check", action="store_true", required=True)
    parser.add_argument("--work", type=Path, default=common.DEFAULT_OUT / "gpu-checkpoint")
    args = parser.parse_args()
    args.scale = "small"
    global STATE_BYTES, TENSOR_MIB
    STATE_BYTES, TENSOR_MIB = {"small": 48 * MiB}, (16, 8, 4)
    result = Run(args, "cpu").run()
    for line in result["rows"] + result["ratios"] + result["notes"]:
        print(line)


if __name__ == "__main__":
    sys.exit(main())
