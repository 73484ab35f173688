"""The CUDA runtime and cuFile libraries the nvidia-* wheels and torch carry, one path a line,
for scripts/gpu-check.sh to put on the C++ test programs' LD_LIBRARY_PATH (and to report in its
preflight). The wheels' layouts differ by CUDA version (nvidia/cuda_runtime/lib for 12,
nvidia/cu13/lib for 13), so their whole tree is searched."""

import importlib.util
from pathlib import Path

PATTERNS = ("libcudart.so*", "libcufile.so*")

for name in ("nvidia", "torch"):
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for pattern in PATTERNS:
            for path in sorted(Path(root).rglob(pattern)):
                print(path)
