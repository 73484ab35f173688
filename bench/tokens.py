"""Token-window benchmark: language-model pretraining input from zerowait shards.

One synthetic corpus of --docs documents (token ids below 50,257, lengths 64..4,096, uint16 on
disk) is written twice with the public API and read with the Loader, shuffle="random", page cache
warm, in this one process:

- packed: zerowait.token_windows(docs, --seq-len, eos=50256) -> one sample per window of exactly
  seq_len tokens. Rows: the samples as raw bytes (the reference: what the loader delivers with no
  decoding) against decode={"tokens": TokenWindow(seq_len)} (int64 [batch, seq_len]) and with
  out_dtype="int32" (half the bytes);
- per document: one sample per document; raw bytes against TokenWindow(seq_len) (padded or
  cut, with lengths);
- the peer: what nanoGPT-style training scripts run today on the same packed tokens, a flat uint16
  file read through numpy.memmap by a torch Dataset (random window index -> int64 tensor) in a
  DataLoader(batch_size, shuffle=True, num_workers=2).

Each row makes its loader once and runs epochs until at least --seconds of them are timed,
after one warm-up epoch, and reports samples/s (and tokens/s for windows). Goal (issue 11):
token windows >= 0.90 x the raw-bytes rate of the same shards.

Usage: bench/run tokens [--docs 20000] [--seq-len 2048] [--batch-size 32] [--seconds 2]
                        [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import zerowait

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

EOS = 50_256


def corpus(docs, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(docs):
        yield rng.integers(0, EOS, int(rng.integers(64, 4097)), dtype=np.uint16)


def loader_epoch(path, batch_size, decode=None):
    """Epochs of one zerowait.Loader (made once, as a training job makes it); each call runs the
    next epoch and returns the samples it delivered (counted the same cheap way in every row:
    a per-batch tensor op would cost the short epochs here a tenth of their time)."""
    loader = zerowait.Loader(path, batch_size=batch_size, shuffle="random", seed=0,
                             fields=["tokens"], decode=decode)

    def epoch():
        return sum(batch["__index__"].numel() for batch in loader)
    return epoch


class MemmapWindows(torch.utils.data.Dataset):
    """The nanoGPT way: windows of a flat token file, opened with numpy.memmap in each worker."""

    def __init__(self, path, seq_len):
        self.path, self.seq_len = path, seq_len
        self.count = Path(path).stat().st_size // 2 // seq_len
        self.tokens = None

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        window = self.tokens[i * self.seq_len:(i + 1) * self.seq_len]
        return torch.from_numpy(window.astype(np.int64))


def dataloader_epoch(path, seq_len, batch_size):
    dataset = MemmapWindows(path, seq_len)

    def epoch():
        return sum(len(batch) for batch in loader)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                         num_workers=2, persistent_workers=True)
    return epoch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    common.add_epoch_options(parser, "tokens", seconds=2.0)
    args = parser.parse_args()

    out = common.empty_folder(args.out)
    start = time.perf_counter()
    packed = zerowait.write_dataset(zerowait.token_windows(corpus(args.docs), args.seq_len,
                                                           eos=EOS),
                                    out / "packed", shard_size=64 << 20, sync=False)
    per_doc = zerowait.write_dataset(({"tokens": d.tobytes()} for d in corpus(args.docs)),
                                     out / "documents", shard_size=64 << 20, sync=False)
    with open(out / "tokens.bin", "wb") as flat:
        for document in corpus(args.docs):
            flat.write(np.append(document, np.uint16(EOS)).tobytes())
    common.log(f"wrote {packed['samples']} windows of {args.seq_len} and "
               f"{per_doc['samples']} documents ({per_doc['bytes_in'] / common.MB:.0f} MB of "
               f"tokens) in {time.perf_counter() - start:.1f} s", tag="tokens")

    rows = [
        ("packed windows, raw bytes (reference)",
         loader_epoch(out / "packed", args.batch_size)),
        (f"packed windows, TokenWindow({args.seq_len})",
         loader_epoch(out / "packed", args.batch_size,
                      {"tokens": zerowait.TokenWindow(args.seq_len)})),
        (f"packed windows, TokenWindow({args.seq_len}, out_dtype='int32')",
         loader_epoch(out / "packed", args.batch_size,
                      {"tokens": zerowait.TokenWindow(args.seq_len, out_dtype="int32")})),
        ("documents, raw bytes (reference)",
         loader_epoch(out / "documents", args.batch_size)),
        (f"documents, TokenWindow({args.seq_len}) padded/cut",
         loader_epoch(out / "documents", args.batch_size,
                      {"tokens": zerowait.TokenWindow(args.seq_len, pad=EOS)})),
        ("peer: DataLoader(memmap windows, workers=2)",
         dataloader_epoch(out / "tokens.bin", args.seq_len, args.batch_size)),
    ]
    results = {}
    for name, epoch in rows:
        common.log(name, tag="tokens")
        rate, epochs = common.timed_epochs(epoch, args.seconds)
        # Packed windows and the peer's windows hold seq_len tokens each.
        tokens = rate * args.seq_len if not name.startswith("documents") else None
        results[name] = {"samples_per_s": rate, "tokens_per_s": tokens, "epochs": epochs}

    names = [name for name, _ in rows]
    print(f"\nzerowait token-window benchmark: {args.docs} documents of 64-4096 uint16 tokens "
          f"({per_doc['bytes_in'] / common.MB:.0f} MB), seq_len {args.seq_len}, batch "
          f"{args.batch_size}, shuffle random, page cache warm; rates over at least "
          f"{args.seconds:g} s of epochs after a warm-up epoch\n")
    print(f"{'row':<56} {'epochs':>6} {'samples/s':>10} {'Mtokens/s':>10}")
    print("-" * 85)
    for name in names:
        r = results[name]
        tokens = f"{r['tokens_per_s'] / 1e6:,.1f}" if r["tokens_per_s"] else "-"
        print(f"{name:<56} {r['epochs']:>6} {r['samples_per_s']:>10,.0f} {tokens:>10}")
    rate = {name: results[name]["samples_per_s"] for name in names}
    ratios = [
        common.ratio("TokenWindow / raw bytes, packed windows", rate[names[1]] / rate[names[0]],
                     0.90, True),
        common.ratio("TokenWindow int32 rows / raw bytes, packed windows",
                     rate[names[2]] / rate[names[0]], 0.90, True),
        {"name": "TokenWindow / raw bytes, per document", "value": rate[names[4]] / rate[names[3]],
         "goal": "-", "result": "info"},
        common.ratio("TokenWindow packed / DataLoader memmap windows",
                     rate[names[1]] / rate[names[5]], 1.0, True),
    ]
    common.print_ratios(ratios, ["ratios of samples/s; raw bytes: the loader's uint8 column of "
                                 "the same samples; TokenWindow: int64 rows (8 bytes a token "
                                 "where the shards hold 2)"])
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
