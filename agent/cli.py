"""`jobpulse-agent`: the node agent's command line."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version as dist_version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jobpulse-agent",
                                description="jobpulse node agent: samples GPUs and ships them to the collector.")
    p.add_argument("--version", action="version", version=f"jobpulse-agent {dist_version('jobpulse')}")
    return p


def main(argv: list[str] | None = None) -> int:
    _parser().parse_args(argv)
    print("jobpulse-agent: the sampling agent is not part of this release yet (see issue 3)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
