"""The CUDA runtime and cuFile libraries the nvidia-* wheels and torch carry, one path a line,
for scripts/gpu-check.sh to put on the C++ test programs' LD_LIBRARY_PATH."""

import glob
import importlib.util
import os

for name in ("nvidia.cuda_runtime", "nvidia.cufile", "torch"):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # a parent package that is missing
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for pattern in ("libcudart.so*", "libcufile.so*"):
            for path in sorted(glob.glob(os.path.join(root, "lib", pattern))):
                print(path)
