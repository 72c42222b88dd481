"""Evaluate a saved checkpoint outside Ray Train (``urm-ray eval``), with its EMA weights.

A task with its own score (ARC: augmentation voting and pass@k, ``PuzzleTask.scoring``) gets that; the results go to MLflow as a run
named ``<run_name>/eval-<split>``, nested under the training run when that run is found."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch

from urm_ray.config import RunConfig, build_config
from urm_ray.data import stream
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.task import PuzzleTask
from urm_ray.data.tasks.verify import optional_verifier
from urm_ray.errors import ConfigError
from urm_ray.eval import testtime
from urm_ray.eval.config import EvalConfig
from urm_ray.eval.heldout import held_out_metrics
from urm_ray.models.registry import build_model, family, family_of
from urm_ray.models.task import TaskSpec
from urm_ray.optim import EMA
from urm_ray.progress import Progress
from urm_ray.train import checkpoint
from urm_ray.train.step import local_device, to_device


def load_checkpoint(folder: str | Path, temperature: Optional[float] = None) -> tuple[RunConfig, torch.nn.Module]:
    """The run config and the evaluation model (EMA weights when the run kept an EMA); a
    ``temperature`` replaces the checkpoint's ``model.sample_temperature`` (GRAM only).

    ``folder`` may be a URI (``s3://bucket/.../checkpoint_...``): it is downloaded first.
    """
    cfg, model, _ = _load(folder)
    if temperature is not None:
        check_temperature(cfg, temperature)
        model.sample_temperature = temperature
    return cfg, model


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a loaded model's weights are (``_load`` chose it): its batches go there too."""
    return next(model.parameters()).device


def check_temperature(cfg: RunConfig, temperature: Optional[float]) -> None:
    """A sampling temperature given for ``cfg``'s model (None = its own) is >= 0, for GRAM."""
    if temperature is None:
        return
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature}: expected a value >= 0")
    if not family(cfg.model.name).samples:
        raise ConfigError(f"--temperature: {cfg.model.name} draws no samples (a GRAM model does)")


def check_checkpoint(folder: str | Path) -> None:
    """Refuse, before any Ray work, a local folder that is no checkpoint or whose ``state.pt``
    does not load as data (``CheckpointError``); a URI is checked as it is read."""
    if "://" not in str(folder):
        config_of(folder)
        checkpoint.load_state(Path(folder))


def _load(folder: str | Path, shown_as: str = "") -> tuple[RunConfig, torch.nn.Module, int]:
    """(config, evaluation model, optimizer step of the checkpoint); ``folder`` may be a URI."""
    if "://" in str(folder):
        import ray.train

        with ray.train.Checkpoint(str(folder)).as_directory() as local:
            return _load(local, str(folder))
    folder = Path(folder)
    cfg = config_of(folder)
    state = checkpoint.load_state(folder, shown_as)  # refused before any dataset is read
    meta = stream.load_meta(cfg.data)
    table_size = stream.puzzle_table_size(meta, cfg.data)
    model = build_model(cfg.model, TaskSpec(meta.vocab_size, meta.seq_len, table_size))
    model.load_state_dict(state["model"])
    if state["ema"] is not None:
        ema = EMA(model, state["ema"]["decay"])
        ema.load_state_dict(state["ema"])
        ema.copy_to(model)
    # the GPU when this process sees one, whichever device the run trained on
    return cfg, model.to(local_device()).eval(), int(state.get("position", {}).get("step", 0))


def evaluate_checkpoint(folder: str | Path, split: str = "", max_rows: int = 0, live: bool = False,
                        temperature: Optional[float] = None) -> dict[str, Any]:
    """Exact/token accuracy and segments of a checkpoint on a split of its dataset; a GRAM run's
    ``train.eval_samples`` prior samples per row drawn at ``temperature`` (default: its own).

    Progress over the rows: a bar on stderr when ``live``, else a log line every few seconds."""
    cfg, model = load_checkpoint(folder, temperature)
    data_cfg = replace(cfg.data, eval_split=split or cfg.data.eval_split)
    dataset = stream.eval_dataset(data_cfg)
    if max_rows:
        dataset = dataset.limit(max_rows)
    meta = stream.load_meta(cfg.data)
    rows = _split_rows(meta, data_cfg.eval_split, max_rows)
    passes = 2 if cfg.train.eval_samples else 1  # the sampled answers take a second pass
    progress = Progress(f"eval {data_cfg.eval_split}", rows * passes, unit="rows", every_s=5.0,
                        live=live)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        for batch in stream.iter_torch_batches(
            dataset, cfg.train.eval_batch_size, epoch=0, seed=0, shuffle=False, drop_last=False,
            buffer_rows=0,
        ):
            progress.update(progress.done + len(batch["inputs"]))
            yield to_device(batch, device_of(model))

    metrics = held_out_metrics(model, batches, cfg.train.eval_samples,
                               optional_verifier(meta.task, meta.seq_len))
    progress.finish()
    temperature = family_of(model).sample_temperature(model)
    drawn = {"temperature": temperature} if temperature is not None else {}
    return {"split": data_cfg.eval_split, **drawn, **metrics}


def evaluate_testtime_checkpoint(folder: str | Path, settings: EvalConfig, split: str = "",
                                 max_rows: int = 0, live: bool = False) -> dict[str, Any]:
    """A checkpoint under test-time ``settings`` (``eval.testtime``) on a split of its dataset:
    accuracies by each selection, passes and seconds per puzzle, the depth and width curves."""
    cfg, model, step = _load(folder)
    meta = stream.load_meta(cfg.data)
    task = registry.of(meta)
    settings.check_task(task)
    with testtime.applied(model, settings):  # fails on settings the model cannot take, before the data
        data_cfg = replace(cfg.data, eval_split=split or cfg.data.eval_split)
        dataset = stream.eval_dataset(data_cfg)
        if max_rows:
            dataset = dataset.limit(max_rows)
        progress = Progress(f"eval {data_cfg.eval_split} width {settings.width}",
                            _split_rows(meta, data_cfg.eval_split, max_rows), unit="rows", every_s=5.0, live=live)
        batch_size = max(1, cfg.train.eval_batch_size // settings.width)  # rows x width per forward

        def batches() -> Iterator[dict[str, torch.Tensor]]:
            for batch in stream.iter_torch_batches(dataset, batch_size, epoch=0, seed=0, shuffle=False,
                                                   drop_last=False, buffer_rows=0):
                progress.update(progress.done + len(batch["inputs"]))
                yield to_device(batch, device_of(model))

        sums = testtime.accumulate(batches(), model, settings, optional_verifier(meta.task, meta.seq_len),
                                   task.augment)
        progress.finish()
    return {"split": data_cfg.eval_split, "step": step, **testtime.summarize(sums, settings)}


def log_testtime(folder: str | Path, report: dict[str, Any], tracking_uri: str = "") -> str | None:
    """Logs a test-time evaluation as ``<run>/eval-<split>-w<width>-n<noise>[-views]-<select>-s<segments>``:
    its numbers, the curves as metric histories (``eval/testtime/width_exact`` at step = width,
    ``depth_exact`` at step = segments), their plot (testtime.png) and the report (JSON)."""
    views = "-views" if report.get("views") else ""
    suffix = f"-w{report['width']}-n{report['noise']:g}{views}-{report['select']}-s{report['segments']}"
    with tempfile.TemporaryDirectory() as tmp:
        plot = Path(testtime.plot_curves(report, str(Path(tmp) / "testtime.png"), suffix[1:]))
        return log_to_mlflow(folder, report["split"], testtime.scalar_metrics(report), report["step"], report,
                             tracking_uri, suffix, testtime.curve_metrics(report), [plot])


def _split_rows(meta: DatasetMeta, split: str, max_rows: int) -> int:
    """Rows of ``split`` (at most ``max_rows`` when > 0); 0 when the metadata has no such split."""
    rows = meta.splits[split].num_rows if split in meta.splits else 0
    return min(rows, max_rows) if max_rows else rows


def config_of(folder: str | Path) -> RunConfig:
    """The run config a local checkpoint folder holds."""
    return build_config(checkpoint.load_config_dict(Path(folder)))


def task_of(folder: str | Path) -> PuzzleTask:
    """The task of the dataset a checkpoint was trained on."""
    return registry.of(stream.load_meta(config_of(folder).data))


def evaluate_arc_checkpoint(folder: str | Path, split: str = "", num_augmentations: int = 0,
                            halt_early: bool = False, pass_ks: Sequence[int] = (),
                            max_pairs: int = 0, batch_size: int = 0,
                            live: bool = False) -> dict[str, Any]:
    """The task's own score (ARC: pass@k by augmentation voting, ``pass_ks`` () = the task's);
    {"split", "metrics", "tasks"} (see ``PuzzleTask.scoring``)."""
    cfg, model, step = _load(folder)
    scoring = registry.of(stream.load_meta(cfg.data)).scoring
    assert scoring is not None, "a task scored on one view: evaluate_checkpoint"
    split = split or cfg.data.eval_split
    report = scoring.score(model, cfg.data, split, views=num_augmentations,
                           batch_size=batch_size or cfg.train.eval_batch_size, halt_early=halt_early,
                           pass_ks=tuple(pass_ks) or scoring.pass_ks, max_rows=max_pairs, device=device_of(model),
                           live=live)
    return {"split": split, "step": step, **report}


def log_to_mlflow(folder: str | Path, split: str, metrics: dict[str, float], step: int = 0,
                  details: dict[str, Any] | None = None, tracking_uri: str = "", suffix: str = "",
                  series: Sequence[tuple[dict[str, float], int]] = (),
                  plots: Sequence[Path] = ()) -> str | None:
    """Logs an evaluation into MLflow; returns the run id (None when tracking is disabled).

    The run is ``<run_name>/eval-<split><suffix>`` in the training run's experiment, tagged as a
    child of the training run when it exists; metrics at the checkpoint's step, ``series`` as
    metric histories ((metrics, step) pairs), ``details`` as JSON, ``plots`` as artifacts."""
    from urm_ray import tracking

    cfg = config_of(folder)
    if not cfg.tracking.enabled and not tracking_uri:
        return None
    uri = tracking.resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri)
    run_name = cfg.train.run_name or Path(folder).resolve().parent.name
    parent = tracking.find_run_id(uri, cfg.tracking.experiment, run_name)
    tags = {tracking.PARENT_TAG: parent} if parent else {}
    run_id = tracking.open_run(uri, cfg.tracking.experiment, f"{run_name}/eval-{split}{suffix}",
                               {"checkpoint": str(Path(folder).resolve()), "split": split}, tags)
    tracking.log_metrics(uri, run_id, {k: v for k, v in metrics.items()
                                       if isinstance(v, (int, float))}, step)
    for values, at in series:
        tracking.log_metrics(uri, run_id, values, at)
    for plot in plots:
        tracking.log_artifact(uri, run_id, plot)
    if details is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"eval-{split}.json"
            path.write_text(json.dumps(details, indent=1))
            tracking.log_artifact(uri, run_id, path)
    tracking.close_run(uri, run_id)
    return run_id
