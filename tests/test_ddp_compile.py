"""DDP and ``train.compile`` together, on CPU: two gloo workers on B rows each train as one
worker on 2B rows (losses and weights after three steps), with the compiled core whole inside
DDP (no graph break) and no recompile after the first step."""

from __future__ import annotations

from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel

from ranks import run_ranks
from tiny import batch, config, TASK

from urm_ray.train.step import build_state, train_step

STEPS, ROWS = 3, 8  # the global batch of tiny.config: 4 rows per worker on 2 workers
# no random halting: both sides halt the same rows whatever order they draw numbers in
DETERMINISTIC = ("model.halt_exploration_prob=0.0",)
SUMS = ("count", "lm_loss", "q_halt_loss")


def _train(compiled: bool, world: int, rank: int) -> dict:
    wrap = None if world == 1 else (lambda model: DistributedDataParallel(model, broadcast_buffers=False))
    state = build_state(config("urm", compiled, DETERMINISTIC), TASK, torch.device("cpu"), world=world, wrap=wrap)
    rows = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    before = state.model.lm_head.weight.detach().clone()
    sums, graphs = [], []
    for step in range(STEPS):
        torch.manual_seed(step)
        # past the first step every graph exists: a recompile raises
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            metrics = train_step(state, {k: v[rows] for k, v in batch(step).items()})
        sums.append({key: metrics[key] for key in SUMS})
        graphs.append(counters["stats"]["unique_graphs"])
    return {"sums": sums, "graphs": graphs, "breaks": dict(counters["graph_break"]),
            "ddp": isinstance(state.wrapped, DistributedDataParallel), "lm_head_before": before,
            "weights": {name: p.detach().clone() for name, p in state.model.named_parameters()},
            "table": state.model.puzzle_emb.weights.clone()}


def _compiled_ddp_rank(rank: int, world: int) -> dict:
    counters.clear()
    return _train(True, world, rank)


def _assert_rel_close(actual: torch.Tensor, expected: torch.Tensor, name: str, tol: float = 1e-5) -> None:
    """Relative error in the 2-norm: compiled kernels and the all-reduce reorder float32 sums."""
    error = (actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-12)
    assert error <= tol, f"{name}: relative error {error:.2e} > {tol:.0e}"


def test_two_compiled_ddp_workers_train_as_one_worker_on_both_batches(tmp_path: Path):
    # the deadline catches a hung rank; compiling takes minutes on a busy 2-core machine
    ranks = run_ranks(_compiled_ddp_rank, world_size=2, folder=tmp_path, timeout=600)
    one = _train(False, 1, 0)  # eager, one worker, all rows: what DDP + compile must reproduce
    for result in ranks:
        assert result["ddp"]
        assert result["breaks"] == {}
        assert result["graphs"][0] > 0 and result["graphs"] == [result["graphs"][0]] * STEPS
    for step in range(STEPS):
        for key in SUMS:  # each worker sums its rows: the two add up to the one worker's sums
            together = ranks[0]["sums"][step][key] + ranks[1]["sums"][step][key]
            _assert_rel_close(together, one["sums"][step][key], f"step {step} {key}")
    for name, weight in one["weights"].items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name  # DDP kept them equal
        _assert_rel_close(ranks[0]["weights"][name], weight, name)
    _assert_rel_close(ranks[0]["table"], one["table"], "puzzle embedding")
    assert not torch.equal(one["weights"]["lm_head.weight"], one["lm_head_before"])  # it trained
