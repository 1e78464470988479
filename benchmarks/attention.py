"""Attention backends: forward and forward+backward time and peak memory against N.

Same as ``attnlab bench attention`` (the code lives in attnlab.experiments.attention_bench):

    python benchmarks/attention.py                       # N = 512 … 16384, all five backends
    python benchmarks/attention.py --n 512 1024 2048 --threads 1 --out /tmp/bench

Writes attention.md (tables), attention.json and attention.png (log-log plot) to --out
(default benchmarks/results/). Each case runs in a fresh subprocess; see the module docstring of
attnlab.experiments.attention_bench for how peak memory is measured.
"""

import sys

from attnlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "attention", *sys.argv[1:]]))
