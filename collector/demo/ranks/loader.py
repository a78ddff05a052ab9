"""Demo job 1002, a training loop whose data loader runs in its main process (`num_workers=0`): the
process decodes every image itself while its GPU waits. It wants one core, always runnable (what
input_bound reads), at the idle scheduling class so it never slows the demo's own parts; the stacks
captured under its flag name `next_batch > decode_jpeg`."""

import os

IMAGE = bytes(range(256)) * 64  # one 16 KiB "JPEG"


def decode_jpeg(blob: bytes) -> int:
    pixels = 0
    for byte in blob:
        pixels = (pixels * 31 + byte) & 0xFFFF
    return pixels


def next_batch(size: int = 8) -> list[int]:
    batch = []
    for _ in range(size):
        batch.append(decode_jpeg(IMAGE))
    return batch


def train() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        next_batch()  # the GPU step that follows takes no time: the simulated GPU waits at 0-20 %


if __name__ == "__main__":
    train()
