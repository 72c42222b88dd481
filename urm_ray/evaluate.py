"""Evaluate a saved checkpoint outside Ray Train: the one entry of ``urm-ray eval``, ``urm-ray
sample`` and an evaluation sweep's trial.

    report = evaluate("runs/x/checkpoint_000002", EvalConfig(width=8, select="q"), Request("testtime"))
    report.metrics["eval/testtime/exact_accuracy"]
    log(report)   # MLflow run <run_name>/eval-<split><suffix>, a child of the training run

The checkpoint loads as a resumed run loads it: ``checkpoint.load_state`` reads it as data, the
model comes from ``step.build_state`` (what training builds) with the saved weights put back by
``checkpoint.restore_weights``, and every mode runs inside ``step.evaluation_model``: the EMA
weights applied where the run kept an EMA, eval mode, the run's autocast.

Modes (``Request.mode``):

- ``plain``: exact and token accuracy, segments, validity by the task's verifier; a GRAM run's
  ``eval.samples`` prior samples per row, voted (``eval.heldout``);
- ``testtime``: under the settings' width, depth, noise and selection, with the depth and width
  curves (``eval.testtime``);
- ``score``: the task's own score (ARC's pass@k by voting over augmented versions);
- ``sample``: ``Request.num`` boards drawn from the blank input, judged by the task's verifier.

Every mode reports its numbers under the names MLflow logs them by (docs/testtime.md, "Metric
names"): ``eval/*`` for the plain evaluation (as a run logs it at each evaluation),
``eval/testtime/*`` under test-time settings with the curves as histories
(``eval/testtime/depth_exact`` at step = segments), the task's prefix for its own score
(``arc/*``), ``sample/*`` for drawn boards.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from torch import nn

from urm_ray.config import RunConfig, build_config, resolve_tracking_uri
from urm_ray.data import originals, stream
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.task import PuzzleTask
from urm_ray.data.tasks.verify import optional_verifier
from urm_ray.errors import ConfigError
from urm_ray.eval import sampling, testtime
from urm_ray.eval.config import EvalConfig
from urm_ray.eval.heldout import held_out_metrics
from urm_ray.models.family import TestTime
from urm_ray.models.registry import family, family_of
from urm_ray.objectives import objective_for
from urm_ray.progress import Progress
from urm_ray.train import checkpoint
from urm_ray.train.loop import task_spec
from urm_ray.train.step import TrainState, build_state, evaluation_model, local_device, to_device

Mode = Literal["plain", "testtime", "score", "sample"]
MODES: tuple[Mode, ...] = ("plain", "testtime", "score", "sample")
Series = list[tuple[dict[str, float], int]]  # metric histories: (metrics, step) pairs


@dataclass(frozen=True)
class Request:
    """What to evaluate beyond the ``eval`` settings: the mode, the rows, and each mode's own knobs."""

    mode: Mode = "plain"
    split: str = ""  # "" = the run's data.eval_split
    max_rows: int = 0  # the first rows (test pairs for a task's own score) only; 0 = all
    batch_size: int = 0  # rows per forward; 0 = the run's eval.batch_size
    live: bool = False  # progress as a bar on stderr, else a log line every few seconds
    temperature: Optional[float] = None  # GRAM's sampling temperature; None = the checkpoint's
    views: int = 0  # score: versions voted over per test input (0 = all the run trained with)
    pass_ks: tuple[int, ...] = ()  # score: the k of pass@k (() = the task's)
    num: int = 0  # sample: boards to draw

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"evaluation mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if self.mode == "sample" and self.num < 1:
            raise ConfigError(f"--num {self.num}: expected at least 1 sample")
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError(f"--temperature {self.temperature}: expected a value >= 0")


@dataclass
class EvalReport:
    """One evaluation of a checkpoint: its numbers under their MLflow names, and what they came from."""

    checkpoint: str
    mode: Mode
    split: str
    step: int  # the optimizer step the checkpoint was saved at
    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)  # settings, curves, per-task scores, boards
    series: Series = field(default_factory=list)  # metric histories (the test-time curves)
    suffix: str = ""  # its MLflow run is <run_name>/eval-<split><suffix>

    def as_dict(self, *leave_out: str) -> dict[str, Any]:
        """What ``urm-ray eval`` prints and ``--out`` writes, less the ``leave_out`` details."""
        details = {k: v for k, v in self.details.items() if k not in leave_out}
        return {"mode": self.mode, "split": self.split, "step": self.step, **details, **self.metrics}


@dataclass
class Loaded:
    """A checkpoint as training would resume it: its config, dataset metadata and built state."""

    cfg: RunConfig
    meta: DatasetMeta
    state: TrainState
    step: int

    @property
    def task(self) -> PuzzleTask:
        return registry.of(self.meta)


def config_of(folder: str | Path) -> RunConfig:
    """The run config a local checkpoint folder holds."""
    return build_config(checkpoint.load_config_dict(Path(folder)))


def task_of(folder: str | Path) -> PuzzleTask:
    """The task of the dataset a checkpoint was trained on."""
    return registry.of(stream.load_meta(config_of(folder).data))


def check_checkpoint(folder: str | Path) -> None:
    """Refuse, before any Ray work, a local folder that is no checkpoint or whose ``state.pt``
    does not load as data (``CheckpointError``); a URI is checked as it is read."""
    if "://" not in str(folder):
        config_of(folder)
        checkpoint.load_state(Path(folder))


def check_temperature(cfg: RunConfig, temperature: Optional[float]) -> None:
    """A sampling temperature given for ``cfg``'s model (None = its own) is >= 0, for GRAM."""
    if temperature is None:
        return
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature}: expected a value >= 0")
    if not family(cfg.model.name).samples:
        raise ConfigError(f"--temperature: {cfg.model.name} draws no samples (a GRAM model does)")


def load(folder: str | Path, shown_as: str = "") -> Loaded:
    """The checkpoint in ``folder`` (a URI such as ``s3://bucket/.../checkpoint_...`` is
    downloaded first), its model on this process's device: the GPU when it sees one."""
    if "://" in str(folder):
        import ray.train

        with ray.train.Checkpoint(str(folder)).as_directory() as local:
            return load(local, str(folder))
    cfg = config_of(folder)
    saved = checkpoint.load_state(Path(folder), shown_as)  # refused before any dataset is read
    meta = stream.load_meta(cfg.data)
    # evaluation runs each batch shape once or twice: compiling would cost more than it saves
    built = replace(cfg, train=replace(cfg.train, compile=False))
    state = build_state(built, task_spec(cfg, meta), local_device(), objective=objective_for(cfg, meta))
    checkpoint.restore_weights(saved, state.model, state.ema)
    if saved["ema"] is None:
        state.ema = None  # a run without an EMA evaluates its own weights
    return Loaded(cfg, meta, state, int(saved.get("position", {}).get("step", 0)))


def load_checkpoint(folder: str | Path) -> tuple[RunConfig, nn.Module]:
    """The run config and the model to keep (to register, to serve): the EMA weights where the
    run kept an EMA, in eval mode."""
    loaded = load(folder)
    if loaded.state.ema is not None:
        loaded.state.ema.copy_to(loaded.state.model)
    return loaded.cfg, loaded.state.model.eval()


def evaluate(folder: str | Path, settings: EvalConfig, request: Request = Request()) -> EvalReport:
    """``request.mode``'s evaluation of the checkpoint in ``folder`` under the test-time ``settings``."""
    loaded = load(folder)
    check_temperature(loaded.cfg, request.temperature)
    _check_mode(loaded.task, settings, request)
    split = request.split or loaded.cfg.data.eval_split
    at = TestTime(temperature=request.temperature)
    with evaluation_model(loaded.state) as model, family_of(model).running_with(model, at) as running:
        metrics, details, series = RUNS[request.mode](loaded, running, settings, replace(request, split=split))
    suffix = _suffix(details) if request.mode == "testtime" else ""
    return EvalReport(str(folder), request.mode, split, loaded.step, metrics, details, series, suffix)


def _check_mode(task: PuzzleTask, settings: EvalConfig, request: Request) -> None:
    """ConfigError for a mode the checkpoint's task cannot take, before any data is read."""
    if request.mode == "score" and task.scoring is None:
        raise ConfigError(f"the {task.name} task has no score of its own (ARC's pass@k by voting)")
    if request.mode == "testtime":
        settings.check_task(task)


Outcome = tuple[dict[str, float], dict[str, Any], Series]


def _batches(loaded: Loaded, request: Request, rows_per_batch: int, label: str,
             passes: int = 1) -> tuple[Callable[[], Iterator[dict[str, torch.Tensor]]], Progress]:
    """The split's rows in stored order, on the model's device, and the progress over ``passes``
    of them (finished by the caller)."""
    rows = originals.read_originals(replace(loaded.cfg.data, eval_split=request.split), loaded.meta,
                                    request.max_rows)
    progress = Progress(label, len(rows["inputs"]) * passes, unit="rows", every_s=5.0, live=request.live)

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        for batch in originals.batches(rows, rows_per_batch):
            progress.update(progress.done + len(batch["inputs"]))
            yield to_device(batch, loaded.state.device)

    return batches, progress


def _plain(loaded: Loaded, model: nn.Module, settings: EvalConfig, request: Request) -> Outcome:
    samples = loaded.cfg.eval.samples  # a GRAM run's voted samples: a second pass over the rows
    batches, progress = _batches(loaded, request, request.batch_size or loaded.cfg.eval.batch_size,
                                 f"eval {request.split}", 2 if samples else 1)
    metrics = held_out_metrics(model, batches, samples, optional_verifier(loaded.meta.task, loaded.meta.seq_len))
    progress.finish()
    temperature = family_of(model).sample_temperature(model)
    return metrics, {} if temperature is None else {"temperature": temperature}, []


def _testtime(loaded: Loaded, model: nn.Module, settings: EvalConfig, request: Request) -> Outcome:
    with testtime.applied(model, settings) as running:  # fails on settings it cannot take, before the data
        rows = max(1, (request.batch_size or loaded.cfg.eval.batch_size) // settings.width)  # x width per forward
        batches, progress = _batches(loaded, request, rows, f"eval {request.split} width {settings.width}")
        sums = testtime.accumulate(batches(), running, settings,
                                   optional_verifier(loaded.meta.task, loaded.meta.seq_len), loaded.task.augment)
        progress.finish()
    summary = testtime.summarize(sums, settings)
    details = {k: v for k, v in summary.items() if k not in testtime.SCALARS}
    return testtime.scalar_metrics(summary), details, testtime.curve_metrics(summary)


def _score(loaded: Loaded, model: nn.Module, settings: EvalConfig, request: Request) -> Outcome:
    scoring = loaded.task.scoring
    assert scoring is not None, "checked by _check_mode"
    report = scoring.score(model, loaded.cfg.data, request.split, views=request.views,
                           batch_size=request.batch_size or loaded.cfg.eval.batch_size,
                           halt_early=settings.halt_early, pass_ks=request.pass_ks or scoring.pass_ks,
                           max_rows=request.max_rows, device=loaded.state.device, live=request.live)
    return report["metrics"], {"tasks": report["tasks"]}, []


def _sample(loaded: Loaded, model: nn.Module, settings: EvalConfig, request: Request) -> Outcome:
    drawn = sampling.sample_boards(model, loaded.meta, request.num, settings.seed)
    metrics = {f"sample/{k}": float(drawn.pop(k)) for k in ("valid", "distinct", "distinct_valid")}
    return metrics, drawn, []


RUNS: dict[Mode, Callable[[Loaded, nn.Module, EvalConfig, Request], Outcome]] = {
    "plain": _plain, "testtime": _testtime, "score": _score, "sample": _sample}


def _suffix(details: dict[str, Any]) -> str:
    """A test-time evaluation's run-name suffix: ``-w<width>-n<noise>[-views]-<select>-s<segments>``."""
    views = "-views" if details.get("views") else ""
    return f"-w{details['width']}-n{details['noise']:g}{views}-{details['select']}-s{details['segments']}"


def log_into(run: Any, report: EvalReport, step: int) -> None:
    """Logs ``report`` into an open MLflow ``run`` (``tracking.Run``): its numbers at ``step``, the
    curves as metric histories with their plot (testtime.png), the whole report as JSON."""
    run.log_metrics(report.metrics, step)
    for values, at in report.series:
        run.log_metrics(values, at)
    with tempfile.TemporaryDirectory() as tmp:
        if report.mode == "testtime":
            summary = {**report.details, **{k.removeprefix(testtime.PREFIX): v for k, v in report.metrics.items()}}
            run.log_artifact(testtime.plot_curves(summary, str(Path(tmp) / "testtime.png"), report.suffix[1:]))
        path = Path(tmp) / f"eval-{report.split}.json"
        path.write_text(json.dumps(report.as_dict(), indent=1))
        run.log_artifact(path)


def log(report: EvalReport, tracking_uri: str = "") -> str | None:
    """Logs an evaluation into MLflow; returns the run id (None when tracking is disabled).

    The run is ``<run_name>/eval-<split><suffix>`` in the training run's experiment, tagged as a
    child of the training run when it exists; its numbers at the checkpoint's step."""
    from urm_ray import tracking

    folder = report.checkpoint
    cfg = _config_of_report(folder)
    if not cfg.tracking.enabled and not tracking_uri:
        return None
    uri = resolve_tracking_uri(tracking_uri or cfg.tracking.tracking_uri)
    run_name = cfg.train.run_name or Path(folder).resolve().parent.name
    parent = tracking.Run.find(uri, cfg.tracking.experiment, run_name)
    tags = {tracking.PARENT_TAG: parent.id} if parent else {}
    run = tracking.Run.open(uri, cfg.tracking.experiment, f"{run_name}/eval-{report.split}{report.suffix}",
                            {"checkpoint": str(Path(folder).resolve()), "split": report.split}, tags)
    log_into(run, report, report.step)
    run.close()
    return run.id


def _config_of_report(folder: str) -> RunConfig:
    """The run config of an evaluated checkpoint (a URI is downloaded for it)."""
    if "://" in folder:
        import ray.train

        with ray.train.Checkpoint(folder).as_directory() as local:
            return config_of(local)
    return config_of(folder)
