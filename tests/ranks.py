"""Run a function on several torch.distributed ranks, each in a fresh process, with a deadline.

Spawned (not forked) processes: the test process may hold Ray's and gRPC's threads, which a fork
would copy mid-lock. A rank that hangs fails the test at the deadline instead of the whole suite.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RankFn = Callable[[int, int], Any]


def _rank_main(rank: int, world_size: int, folder: str, fn: RankFn) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        torch.save(fn(rank, world_size), Path(folder) / f"rank{rank}.pt")
        dist.barrier()  # no rank tears gloo down while its peer may still be talking to it
    finally:
        dist.destroy_process_group()


def run_ranks(fn: RankFn, world_size: int, folder: Path, timeout: float = 180) -> list[Any]:
    """``fn(rank, world_size)`` on every rank inside a gloo process group; returns what each returned.

    ``fn`` must be importable (a module-level function of a test module).
    """
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(rank, world_size, str(folder), fn))
             for rank in range(world_size)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    if hung:
        raise AssertionError(f"ranks {hung} of {world_size} still running after {timeout} s")
    failed = {rank: proc.exitcode for rank, proc in enumerate(procs) if proc.exitcode != 0}
    if failed:
        raise AssertionError(f"ranks exited with {failed} (rank: exit code); see the captured stderr")
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]
