"""One system's training steps in a process of its own, driven by bench.train_speed's ``own_processes``.

Loads the spec that ``own_processes`` saved (config, tokenizer, batches, precision), builds system
NAME's step (``train_speed.build``), prints "ready", then answers each line "r" on stdin with the
seconds that step r took, until stdin closes. Importing the bench package sets OpenMP's waiting as in
the parent.
Run: python -m bench.train_worker NAME SPEC
"""

from __future__ import annotations

import sys
import time

import torch

from bench import train_speed


def main(name: str, spec_path: str) -> None:
    spec = torch.load(spec_path, weights_only=False)
    step = train_speed.build(name, spec["cfg"], spec["tok"], spec["batches"], spec["precision"])
    print("ready", flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        step(int(line))
        print(time.perf_counter() - start, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
