"""Evaluate a saved checkpoint outside Ray Train (``urm-ray eval``), with its EMA weights."""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from urm_ray.config import RunConfig, build_config
from urm_ray.data import stream
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.optim import EMA
from urm_ray.train import checkpoint
from urm_ray.data.tasks.verify import optional_verifier
from urm_ray.train.evaluate import held_out_metrics


def load_checkpoint(folder: str | Path) -> tuple[RunConfig, torch.nn.Module]:
    """The run config and the evaluation model (EMA weights when the run kept an EMA)."""
    folder = Path(folder)
    cfg = build_config(checkpoint.load_config_dict(folder))
    meta = stream.load_meta(cfg.data)
    model = build_model(cfg.model, TaskSpec(meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers))
    state = checkpoint.load_state(folder)
    model.load_state_dict(state["model"])
    if state["ema"] is not None:
        ema = EMA(model, state["ema"]["decay"])
        ema.load_state_dict(state["ema"])
        ema.copy_to(model)
    return cfg, model.eval()


def evaluate_checkpoint(folder: str | Path, split: str = "", max_rows: int = 0) -> dict[str, Any]:
    """Exact/token accuracy and segments of a checkpoint on a split of its dataset."""
    cfg, model = load_checkpoint(folder)
    data_cfg = replace(cfg.data, eval_split=split or cfg.data.eval_split)
    dataset = stream.eval_dataset(data_cfg)
    if max_rows:
        dataset = dataset.limit(max_rows)
    meta = stream.load_meta(cfg.data)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        return stream.iter_torch_batches(
            dataset, cfg.train.eval_batch_size, epoch=0, seed=0, shuffle=False, drop_last=False,
            buffer_rows=0,
        )

    metrics = held_out_metrics(model, batches, cfg.train.eval_samples,
                               optional_verifier(meta.task, meta.seq_len))
    return {"split": data_cfg.eval_split, **metrics}
