"""A PyTorch training script that reports its phases and steps to jobpulse.

Run it inside a Slurm job (the task prolog exports JOBPULSE_EVENTS_SOCKET); each rank's events
land in PostgreSQL under the job, step and rank the kernel says the process belongs to, on the
same timeline as the GPU samples:

    srun python train_with_events.py --epochs 3 --batch-size 256

Nothing here can slow or break training: with no agent listening, every call is a no-op that
only counts a drop.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from jobpulse.agent import client as jp

log = logging.getLogger("train")
logging.basicConfig(level=logging.INFO)
logging.getLogger().addHandler(jp.Handler())  # warnings and errors from any logger become events


def make_data(n: int) -> TensorDataset:
    x = torch.randn(n, 64)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


@jp.phase("build_model")  # a decorator: one phase for the whole function call
def build_model(device: torch.device) -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    with jp.phase("data_loading", source="synthetic"):  # start/end events with the duration
        loader = DataLoader(make_data(50_000), batch_size=args.batch_size, shuffle=True,
                            num_workers=args.workers, pin_memory=device.type == "cuda")
    model = build_model(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    jp.event("training started", epochs=args.epochs, batch_size=args.batch_size, device=str(device))

    global_step = 0
    for epoch in range(args.epochs):
        with jp.phase("epoch", epoch=epoch):
            waited = 0.0
            started = t = time.perf_counter()
            for x, y in loader:
                waited += time.perf_counter() - t  # time spent waiting for the data loader
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                global_step += 1
                if global_step % 10 == 0:  # samples/s per rank, on the GPU timeline
                    jp.step(global_step, samples=10 * len(x), loss=round(loss.item(), 4))
                t = time.perf_counter()
            jp.event(f"epoch {epoch} done", loss=round(loss.item(), 4), data_wait_s=round(waited, 2))
            if waited > 0.3 * (time.perf_counter() - started):
                log.warning("epoch %d spent %.1f s waiting for data: raise --workers", epoch, waited)
    jp.event("training finished", steps=global_step)


if __name__ == "__main__":
    main()
