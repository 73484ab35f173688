"""A Lightning Trainer whose checkpoints zerowait writes: asynchronous, atomic, verified.

    python examples/lightning_train.py --dir ckpt --max-steps 200
    python examples/lightning_train.py --dir ckpt --max-steps 400 --resume    # from last.ckpt

The only zerowait line is the plugin: ``Trainer(plugins=[zerowait.lightning.CheckpointIO()])``.
ModelCheckpoint decides when to save and what to keep, as usual; each checkpoint file it names
(``epoch=3-step=40.ckpt``) is a small pointer to a zerowait step in ``<dir>/zerowait``, which
``zerowait ckpt verify`` checks at the end. docs/checkpoint.md, "Lightning".
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import zerowait.lightning


class Regression(L.LightningModule):
    """A two-layer network fitting a fixed random linear map."""

    def __init__(self, features: int = 32) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class ReportSteps(L.Callback):
    def on_train_start(self, trainer, module) -> None:
        print(f"started at global step {trainer.global_step}", flush=True)

    def on_train_end(self, trainer, module) -> None:
        print(f"finished at global step {trainer.global_step}, loss "
              f"{float(trainer.callback_metrics['loss']):.4f}", flush=True)


def synthetic_data(samples: int, features: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="ModelCheckpoint's folder")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=4, help="save every N training steps")
    parser.add_argument("--resume", action="store_true", help="resume from last.ckpt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    L.seed_everything(args.seed, verbose=False)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=args.dir, every_n_train_steps=args.every, save_top_k=2, monitor="step",
        mode="max",
        # last.ckpt as a link to the newest top-k file: a copy would be a second save of the
        # same state, which waits for the first to be written.
        save_last="link")
    trainer = L.Trainer(max_steps=args.max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[checkpoints, ReportSteps()],
                        plugins=[zerowait.lightning.CheckpointIO()])
    # fit() ends with the plugin's teardown: every save committed and named, or an error.
    trainer.fit(Regression(), synthetic_data(512, 32, args.seed),
                ckpt_path="last" if args.resume else None)
    print(f"best: {checkpoints.best_model_path}", flush=True)

    store = f"{args.dir}/zerowait"
    verify = subprocess.run([sys.executable, "-m", "zerowait", "ckpt", "verify", store])
    if verify.returncode != 0:
        sys.exit(f"zerowait ckpt verify {store} failed")
    print(f"{store}: every kept step verified", flush=True)


if __name__ == "__main__":
    main()
