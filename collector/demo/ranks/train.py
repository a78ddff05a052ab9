"""Demo job 1001, one rank of a healthy 2-node training: phases, steps and a checkpoint event each
epoch, through the in-job client a researcher would call."""

import time

from jobpulse.agent import client as jp

STEPS_PER_EPOCH = 30


def load_data() -> None:
    with jp.phase("load_data"):
        time.sleep(4)


def run_epoch(epoch: int, step: int) -> int:
    with jp.phase("epoch"):
        for _ in range(STEPS_PER_EPOCH):
            time.sleep(0.5)  # forward and backward on the (simulated) GPU
            step += 1
            jp.step(step, samples=256, loss=round(2.0 / (1 + step / 50), 4))
    jp.event(f"epoch {epoch} done, checkpoint saved")
    return step


def train() -> None:
    jp.event("rank started", level="info")
    load_data()
    step = 0
    for epoch in range(100_000):
        step = run_epoch(epoch, step)


if __name__ == "__main__":
    train()
