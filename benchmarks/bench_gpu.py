"""Thin script form of ``torchinferno bench-gpu`` (same code: ``torchinferno.bench.gpu_bench``).

    PYTHONPATH=src python3 benchmarks/bench_gpu.py --json-output /tmp/bench.json
"""

import sys

from torchinferno.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main(["bench-gpu", *sys.argv[1:]]))
