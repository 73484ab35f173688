"""Run by test_wheel.py as an unprivileged user, with the interpreter of a fresh virtual
environment into which pip installed the wheel and torch: one Loader epoch over SHARDS and a
checkpoint round trip in CKPT_DIR, then the shared libraries this process has mapped.

    python wheel_session.py SHARDS CKPT_DIR   # prints one JSON object

Only the standard library, torch and zerowait: it runs outside the repository's environment.
"""

import json
import sys

import torch

import zerowait


def main() -> None:
    shards, ckpt_dir = sys.argv[1], sys.argv[2]
    samples = len(zerowait.Dataset(shards))
    loader = zerowait.Loader(shards, batch_size=8, seed=0, drop_last=False, threads=2,
                             decode={"jpg": zerowait.CenterCrop(32), "cls": "int"})
    seen = 0
    for batch in loader:
        assert tuple(batch["jpg"].shape[1:]) == (32, 32, 3), batch["jpg"].shape
        seen += batch["cls"].shape[0]
    loader.close()

    state = {"model": {"weight": torch.arange(4096, dtype=torch.float32).reshape(64, 64),
                       "bias": torch.ones(64, dtype=torch.bfloat16)},
             "step": 3}
    with zerowait.Checkpointer(ckpt_dir, keep_last=2) as ckpt:
        ckpt.save(3, state, blocking=True)
        restored = ckpt.load()
    round_trip = (restored["step"] == 3 and
                  all(torch.equal(restored["model"][k], v) for k, v in state["model"].items()))

    # Every file mapped into this process (the last column of /proc/self/maps), libraries only.
    with open("/proc/self/maps", encoding="utf-8") as maps:
        mapped = sorted({line.split()[-1] for line in maps
                         if len(line.split()) >= 6 and ".so" in line.split()[-1]})
    print(json.dumps({"samples": samples, "seen": seen, "checkpoint_round_trip": round_trip,
                      "zerowait_file": zerowait.__file__, "mapped": mapped}))


if __name__ == "__main__":
    main()
