"""What the steps of bench/gpu_check.sh share: the device, the configs, the batches, the result rows.

Every step is its own process, ``python bench/gpu_<name>.py ... --out RESULTS [--dry-run]``, that
appends one JSON line to RESULTS per measurement as soon as it is measured, so a step cut by its
timeout or by running out of memory keeps what it had measured. The steps import PyTorch and the
training core (``urm_ray.train.step``) only, no Ray, MLflow, Optuna or PyYAML: configs are built
from dotted keys here, not read from the YAML presets.

``--dry-run``: on the CPU, at tiny sizes, gloo for NCCL, one thread, and torch.compile with the
``eager`` backend (dynamo's graph capture without inductor's code generation, which takes tens of
seconds per graph on a CPU): every code path of the check but the kernels.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from urm_ray.config import RunConfig, build_config, with_values
from urm_ray.models.task import TaskSpec

TASK = TaskSpec(vocab_size=6, seq_len=16, num_puzzle_identifiers=5)  # tests/tiny.py's shape
TINY = {"model.hidden_size": 32, "model.num_heads": 2, "model.expansion": 1.0,
        "model.halt_exploration_prob": 0.0,  # no random ACT minimum: both sides halt alike
        "train.global_batch_size": 8, "optim.lr": 1e-3, "optim.weight_decay": 0.1,
        "optim.warmup_steps": 0,  # the first step already moves the weights
        "optim.ema_decay": 0.99}
# tests/tiny.py's families, on the sudoku4 presets' model sections, the puzzle embedding on for URM
FAMILIES: dict[str, dict[str, Any]] = {
    "urm": {"model.name": "urm", "model.num_layers": 2, "model.loops": 3, "model.truncation": 1,
            "model.max_segments": 4, "model.puzzle_emb_dim": 32},
    "hrm": {"model.name": "hrm", "model.h_layers": 1, "model.l_layers": 1, "model.h_cycles": 2,
            "model.l_cycles": 2, "model.max_segments": 3, "model.puzzle_emb_dim": 0},
    "trm": {"model.name": "trm", "model.num_layers": 1, "model.h_cycles": 2, "model.l_cycles": 2,
            "model.max_segments": 6, "model.puzzle_emb_dim": 0, "model.puzzle_emb_len": 0},
    "gram": {"model.name": "gram", "model.num_layers": 1, "model.h_cycles": 2, "model.l_cycles": 2,
             "model.max_segments": 4, "model.puzzle_emb_dim": 0, "model.puzzle_emb_len": 0,
             "model.latent_dim": 8},
    "gram_urm": {"model.name": "gram_urm", "model.num_layers": 1, "model.loops": 3, "model.truncation": 1,
                 "model.max_segments": 4, "model.puzzle_emb_dim": 0, "model.latent_dim": 8,
                 "model.kl_coef": 8.4, "model.noise_scale": 0.095},
    "transformer": {"model.name": "transformer", "model.num_layers": 2, "model.max_segments": 2,
                    "model.puzzle_emb_dim": 0},
}


def run_config(values: dict[str, Any]) -> RunConfig:
    """A validated RunConfig from dotted keys (``{"model.name": "urm", "model.loops": 8}``),
    every other key at its default."""
    return build_config(with_values({}, values))


def tiny_config(family: str, **train: Any) -> RunConfig:
    """``family`` at tests/tiny.py's size; ``train``: train-section keys (``bf16=False``)."""
    return run_config({**TINY, **FAMILIES[family], **{f"train.{k}": v for k, v in train.items()}})


def random_batch(rows: int, task: TaskSpec, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch in the stream's dtypes, drawn on the CPU (the same rows on every device), a fifth
    of the labels ignored."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, task.vocab_size, (rows, task.seq_len), generator=gen, dtype=torch.int32)
    ignored = torch.rand(rows, task.seq_len, generator=gen) < 0.2
    labels = torch.where(ignored, -100, torch.randint(0, task.vocab_size, (rows, task.seq_len), generator=gen))
    ids = torch.randint(0, task.num_puzzle_identifiers, (rows,), generator=gen, dtype=torch.int32)
    batch = {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids}  # [B, L] int32, [B, L], [B] int32
    return {k: v.to(device) for k, v in batch.items()}


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64 (inf or nan stays visible)."""
    actual, expected = actual.double().cpu(), expected.double().cpu()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


class Results:
    """Appends one JSON line per row to the results file, flushed at once, and echoes it."""

    def __init__(self, path: Path, check: str) -> None:
        self.path, self.check = path, check

    def write(self, status: str, **fields: Any) -> dict[str, Any]:
        row = {"check": self.check, "status": status, **fields}
        line = json.dumps(row, default=str)
        with self.path.open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)
        return row

    def guarded(self, fields: dict[str, Any], measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Write ``measure()``'s row (its ``status`` key, else ok) with ``fields`` and the seconds it
        took; an exception becomes a row of status ``oom`` or ``error``, and the step goes on."""
        start = time.perf_counter()
        try:
            row = measure()
        except torch.cuda.OutOfMemoryError as err:
            row = {"status": "oom", "error": str(err).splitlines()[0][:300]}
        except Exception as err:  # noqa: BLE001 (one item's failure must not stop the others)
            traceback.print_exc()
            row = {"status": "error", "error": f"{type(err).__name__}: {err}"[:500]}
        finally:
            free_device_memory()
        status = row.pop("status", "ok")
        return self.write(status, **fields, **row, seconds=round(time.perf_counter() - start, 2))


def free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, required=True, help="the JSONL file rows are appended to")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (the check's own test)")
    return p


def device_for(args: argparse.Namespace) -> torch.device:
    """cuda, or on --dry-run the CPU: one thread (on a busy machine a second one spins more than it
    computes at these sizes) and torch.compile's backend set to eager."""
    if args.dry_run:
        torch.set_num_threads(1)
        torch.compile = functools.partial(torch.compile, backend="eager")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: on a machine without one, run bench/gpu_check.sh --dry-run")
    return torch.device("cuda")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def cpu_drawn_noise(seed: int) -> Iterator[None]:
    """``torch.randn_like`` drawn on the CPU from a seeded generator and moved to the tensor's
    device: the same noise (GRAM's eps) on the CPU and on a GPU, whose generators differ. Eager only."""
    gen = torch.Generator().manual_seed(seed)
    original = torch.randn_like

    def randn_like(t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        dtype = kwargs.get("dtype") or t.dtype
        return torch.randn(t.shape, generator=gen, dtype=dtype).to(t.device)

    torch.randn_like = randn_like
    try:
        yield
    finally:
        torch.randn_like = original
