"""The GPU benchmarks in one command (bench/run gpu; scripts/gpu-check.sh runs it on the GPU
machine): each section measures zerowait beside the reference that bounds it and the peer users
would pick instead, in this process, on the same data, and prints a table of ratios.

    bench/run gpu [--scale small|full] [--only overlap,checkpoint,gds,decode] [--json FILE]

Sections (one module each, ``run(args) -> dict`` with "rows", "ratios" and "notes"):
  overlap     Loader(device="cuda") feeding a fixed GPU step, against the step alone and the copy
              on the default stream; H2D bandwidth against pinned cudaMemcpyAsync (gpu_overlap.py)
  checkpoint  save() blocking from HBM against torch.distributed.checkpoint.async_save and
              torch.save; restore against safetensors' load_file(device="cuda") (gpu_checkpoint.py)
  gds         file -> HBM through cuFile against pread + pinned H2D (gpu_gds.py)
  decode      JPEG decode + crop on the GPU against the CPU path on every core and torchvision's
              GPU decode (gpu_decode.py)

Without a CUDA device every section says so and records why instead of figures: the dry run's
check that the script itself runs. ``--scale small`` shrinks every size (the dry run's default);
``full`` is what the issue's goals are judged on.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SECTIONS = ("overlap", "checkpoint", "gds", "decode")


def cuda_reason():
    """Why the GPU sections cannot measure here ("" when a CUDA device is there)."""
    try:
        import torch
    except ImportError as e:
        return f"no torch ({e})"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return ""


def print_section(name, result):
    print(f"\n== {name} ==")
    if result.get("skipped"):
        print(f"skipped: {result['skipped']}")
        return
    rows = result.get("rows", [])
    if rows:
        columns = list(dict.fromkeys(k for row in rows for k in row))
        widths = {c: max(len(c), *(len(fmt(row.get(c))) for row in rows)) for c in columns}
        print("  ".join(f"{c:<{widths[c]}}" for c in columns))
        print("  ".join("-" * widths[c] for c in columns))
        for row in rows:
            print("  ".join(f"{fmt(row.get(c)):<{widths[c]}}" for c in columns))
    for r in result.get("ratios", []):
        value = "-" if r.get("value") is None else f"{r['value']:.3f}"
        print(f"ratio  {r['name']:<62} {value:>8}  goal {r['goal']:<8} {r['result']}")
    for note in result.get("notes", []):
        print(f"note: {note}")


def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=("small", "full"), default="full")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections (default: all)")
    parser.add_argument("--json", type=Path, help="write every section's figures here")
    parser.add_argument("--work", type=Path, default=HERE / "out" / "gpu",
                        help="scratch directory for data and checkpoints")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    reason = cuda_reason()
    results = {"scale": args.scale, "cuda": reason or "available", "sections": {}}
    failed = 0
    for name in [s for s in args.only.split(",") if s]:
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
        started = time.monotonic()
        try:
            module = importlib.import_module(f"gpu_{name}")
            result = {"skipped": reason} if reason else module.run(args)
        except Exception as e:  # noqa: BLE001 - one section's failure must not lose the others
            traceback.print_exc()
            result = {"error": f"{type(e).__name__}: {e}"}
            failed += 1
        result["seconds"] = round(time.monotonic() - started, 1)
        results["sections"][name] = result
        print_section(name, result)
        if args.json:  # after every section, so a time limit keeps what finished
            args.json.write_text(json.dumps(results, indent=1, default=str))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
