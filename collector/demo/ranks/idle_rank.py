"""Demo job 1003, the rank of a sweep that asked for 2 GPUs and uses 1: it holds its GPU and waits."""

import time

if __name__ == "__main__":
    time.sleep(10**6)
