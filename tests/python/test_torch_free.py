"""A job that never imports torch (numpy state, a loader made for a framework-free pipeline)
must not have zerowait import it: with a CUDA build of torch that is a second or more per
process, paid by every Checkpointer() and Loader(), and by every child a test starts."""

import subprocess
import sys

CHILD = r"""
import sys, numpy as np, zerowait
directory, dataset = sys.argv[1], sys.argv[2]
with zerowait.Checkpointer(directory, keep_last=2) as ckpt:
    ckpt.save(1, {"w": np.arange(10, dtype=np.float32), "step": 1}, blocking=True)
    assert np.array_equal(ckpt.load(1)["w"], np.arange(10, dtype=np.float32))
loader = zerowait.Loader(dataset, batch_size=4)
loader.close()
print(sorted(m for m in ("torch", "torch.distributed") if m in sys.modules))
"""


def test_checkpointer_and_loader_do_not_import_torch(image_dataset, tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ckpt"),
                           str(image_dataset)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
