"""examples/observe/ddp_loop.py with a fault planted (gradcert observe's error tests).

    python observe_faults.py FAULT RANK UPDATE -- ARGS...   (torchrun starts it per rank)

FAULT: crash (os._exit(1) as the optimizer steps update UPDATE on rank RANK), raise (an uncaught
RuntimeError there, as a job that dies inside torch), hang (sleeps there for ever: a stopped
rank), none. The example runs as __main__, as torchrun would run it.
"""

import os
import runpy
import sys
import time

import torch

fault, rank, update = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.argv = [None] + sys.argv[5:]
example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "observe", "ddp_loop.py")
sys.argv[0] = os.path.realpath(example)
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python ddp_loop.py` would: its toy.py
steps = [0]
original = torch.optim.AdamW.step


def step(self, *a, **k):
    if int(os.environ.get("RANK", "0")) == rank and steps[0] == update:
        if fault == "crash":
            print(f"observe_faults: rank {rank} crashes at update {update}", file=sys.stderr, flush=True)
            os._exit(1)
        if fault == "raise":
            raise RuntimeError(f"observe_faults: rank {rank} raises at update {update}")
        if fault == "hang":
            print(f"observe_faults: rank {rank} stops at update {update}", file=sys.stderr, flush=True)
            time.sleep(10_000)
    steps[0] += 1
    return original(self, *a, **k)


torch.optim.AdamW.step = step
runpy.run_path(os.path.realpath(example), run_name="__main__")
