"""The run config: model / data / optim / train / resources / checkpoint / tracking / eval, loaded
from YAML with dotted overrides.

    cfg = load_config("sudoku4-urm", ["model.loops=8", "train.steps=500"])

CONFIG is a YAML path or the name of a preset shipped in ``urm_ray/presets``. The model section's
class is chosen by ``model.name`` through the model registry. Every key is checked: unknown keys,
wrong types and impossible combinations raise ``ConfigError`` before any work starts.
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from urm_ray import redact
from urm_ray.data.config import DataConfig
from urm_ray.errors import ConfigError
from urm_ray.eval.config import EvalConfig
from urm_ray.models.registry import config_class
from urm_ray.optim import OptimConfig
from urm_ray.names import check_name
from urm_ray.typed import convert, did_you_mean, excerpt, from_dict, to_dict

UNSET = object()  # a key one side of ``differences`` does not have


@dataclass
class TrainConfig:
    """The schedule and the numerics of training; per-worker settings are derived, never configured."""

    steps: int = 2000  # optimizer steps (one ACT segment each)
    global_batch_size: int = 256  # rows per step summed over all workers
    # rows per forward/backward pass on a worker (gradient accumulation: the worker's share of
    # the global batch in micro-batches of this size, one optimizer step); 0 = the whole share.
    # `urm-ray plan` prints the largest that fits a GPU
    micro_batch_size: int = 0
    # checkpoint the looped transformer blocks: each keeps its input only and is recomputed in the
    # backward (train/activations.py): about a third more compute, far less activation memory
    activation_checkpointing: bool = False
    # the answer loss's cross-entropy: stablemax or softmax
    loss: Literal["stablemax", "softmax"] = "stablemax"
    # the answer loss's targets: label = the dataset's label; nearest = the valid answer nearest to
    # the row's own decode, from the task's exhaustive search, so a valid answer other than the
    # label is not pulled towards it (small colouring, N-Queens and 4x4 Sudoku)
    label_targets: Literal["label", "nearest"] = "label"
    # the model's initialisation and each worker's random draws (ACT exploration, GRAM noise); the
    # data order and augmentations follow data.shuffle_seed
    seed: int = 0
    log_every: int = 20  # steps between metric reports
    # bf16 autocast: auto = on GPU only; true = on GPU and on CPU (worth it where the CPU has
    # native bf16, AVX512-BF16 or AMX: bench/throughput.py --precisions fp32 bf16); false = off
    bf16: bool | Literal["auto"] = "auto"
    # torch.compile the segment core and the loss (urm_ray.train.compiled): true, false, or
    # auto = on CUDA only (on CPU, compiling costs more than a short run saves)
    compile: bool | Literal["auto"] = "auto"
    run_name: str = ""  # stable name; reusing it resumes. "" = derived from model and time

    def __post_init__(self) -> None:
        for key in ("steps", "global_batch_size", "log_every"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key}={getattr(self, key)} must be >= 1")
        if self.micro_batch_size < 0:
            raise ConfigError(f"train.micro_batch_size={self.micro_batch_size} must be >= 0 (0 = no accumulation)")
        if self.run_name:  # a folder under checkpoint.storage_path and an MLflow name
            check_name("train.run_name", self.run_name)


@dataclass
class ResourcesConfig:
    """Where and on what a run trains: its workers, what each reserves, and restarts after a crash."""

    num_workers: int = 1  # Ray Train workers (DDP ranks)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto = GPU when the cluster has one
    cpus_per_worker: float = 1.0  # CPUs each worker reserves from Ray (fractions allowed)
    gpus_per_worker: float = 1.0  # used only when training on GPU
    # custom Ray resources each worker asks for on top of CPU/GPU, e.g. {"ondemand_gpu": 1} to
    # keep a run on the node type that offers it (cluster/gpu.yaml)
    worker_resources: dict = field(default_factory=dict)
    # intra-op threads per worker; 0 = the CPUs it is given: this machine's for a run in the
    # command's own process, else resources.cpus_per_worker rounded down (min 1)
    torch_threads: int = 0
    # where a run's one worker trains: true = in the command's own process; false = in a Ray Train
    # worker actor; auto = in the process when nothing else changes (one worker, no restarts, no
    # custom worker resources, local storage, a private local Ray instance). A sweep's one-worker
    # trial trains in its Tune trial actor either way
    in_process: bool | Literal["auto"] = "auto"
    max_failures: int = 0  # worker-group restarts from the latest checkpoint after a crash
    # whether every node of the cluster mounts this machine's folders at the same paths (NFS, EFS):
    # on a cluster of several nodes a local data.path, checkpoint.storage_path or sweep folder is
    # refused unless this is true; false expects s3:// URLs there
    shared_fs: bool = False

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"resources.num_workers={self.num_workers} must be >= 1")
        if self.cpus_per_worker <= 0:
            raise ConfigError(f"resources.cpus_per_worker={self.cpus_per_worker} must be > 0")
        if self.num_workers > 1 and self.device != "cpu" and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ConfigError(
                f"resources.gpus_per_worker={self.gpus_per_worker} with resources.num_workers={self.num_workers}: "
                "DDP's NCCL needs a whole GPU per worker (two ranks on one GPU fail); expected 1, 2, ... "
                "(a fraction suits one-worker runs sharing a GPU)")
        if self.torch_threads < 0:
            raise ConfigError(f"resources.torch_threads={self.torch_threads} must be >= 0")
        if self.max_failures < 0:
            raise ConfigError(f"resources.max_failures={self.max_failures} must be >= 0")
        for name, amount in self.worker_resources.items():
            if name in ("CPU", "GPU", "cpu", "gpu") or not isinstance(amount, (int, float)) or amount <= 0:
                raise ConfigError(
                    f"resources.worker_resources.{name}={amount!r}: expected a custom resource name "
                    "(CPU and GPU come from resources.cpus_per_worker / gpus_per_worker) and an amount > 0"
                )


@dataclass
class CheckpointConfig:
    """Where a run's checkpoints go, how often, and how many are kept."""

    # Ray Train storage: a local folder, or s3://bucket/prefix (multi-node clusters need one that
    # every node reaches; a custom S3 endpoint such as MinIO comes from $AWS_ENDPOINT_URL)
    storage_path: str = "runs"
    every: int = 500  # steps between checkpoints (0 = end only)
    keep: int = 2  # newest checkpoints kept; older ones are deleted

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ConfigError(f"checkpoint.every={self.every} must be >= 0 (0 = end only)")
        if self.keep < 1:
            raise ConfigError(f"checkpoint.keep={self.keep} must be >= 1")


@dataclass
class TrackingConfig:
    """Where MLflow records the run (rank 0 only)."""

    enabled: bool = True  # false = no MLflow run at all
    experiment: str = "urm-ray"  # MLflow experiment name (created when missing)
    # "" = $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db (made absolute on the driver)
    tracking_uri: str = ""
    log_checkpoint: bool = True  # upload the final checkpoint as an artifact

    def __post_init__(self) -> None:
        check_name("tracking.experiment", self.experiment)


def resolve_tracking_uri(configured: str) -> str:
    """``tracking.tracking_uri`` as MLflow is given it: the configured URI, else
    $MLFLOW_TRACKING_URI, else an SQLite store in the working folder.

    Ray moves workers' working directories, so relative local URIs are made absolute here, on
    the driver, before the config travels to the workers.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        return f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    if "://" not in uri:
        return Path(uri).resolve().as_uri()
    return uri


@dataclass
class RunConfig:
    """One training run."""

    model: Any  # the config class registered for model.name (URMConfig, HRMConfig, ...)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        self.eval.check_model(self.model)
        self._check_placement()
        # keys of one section that another section makes useless (each section warns about its own)
        if self.model.puzzle_emb_dim == 0:
            for key in ("puzzle_emb_lr", "puzzle_emb_weight_decay"):
                value = getattr(self.optim, key)
                if value != OptimConfig.__dataclass_fields__[key].default:
                    warnings.warn(f"optim.{key}={value} has no effect with model.puzzle_emb_dim=0 "
                                  "(no puzzle embedding to train)", stacklevel=3)
        if self.model.bf16_states and self.train.bf16 is False:
            warnings.warn("model.bf16_states=true has no effect with train.bf16=false (no bf16 autocast)",
                          stacklevel=3)

    def _check_placement(self) -> None:
        """ConfigError where the batch does not split over the workers, or an in-process run was
        asked of a placement that needs Ray Train."""
        train, res = self.train, self.resources
        if train.global_batch_size % res.num_workers:
            raise ConfigError(
                f"train.global_batch_size={train.global_batch_size} is not divisible by "
                f"resources.num_workers={res.num_workers}"
            )
        local = train.global_batch_size // res.num_workers
        if train.micro_batch_size and local % train.micro_batch_size:
            raise ConfigError(
                f"train.micro_batch_size={train.micro_batch_size} must be 0 (no accumulation) or divide the "
                f"rows per worker, train.global_batch_size / resources.num_workers = {local}"
            )
        storage = self.checkpoint.storage_path
        if res.in_process is True and (res.num_workers != 1 or res.max_failures or res.worker_resources
                                       or "://" in storage):
            raise ConfigError(
                "resources.in_process=true runs one worker in the command's process: it needs "
                f"resources.num_workers=1 (got {res.num_workers}), resources.max_failures=0 (got "
                f"{res.max_failures}), no resources.worker_resources (got {res.worker_resources}) and a "
                f"local checkpoint.storage_path (got {storage!r})")

    def warn_unused_on_cpu(self, native_bf16: bool) -> None:
        """The GPU-only keys a run on CPU was given, and bf16 asked of a CPU without native bf16
        (``native_bf16``: this machine's); the driver calls it once it knows the run trains on CPU
        (resources.device=cpu, or auto on a cluster without GPUs)."""
        default_gpus = ResourcesConfig.__dataclass_fields__["gpus_per_worker"].default
        if self.resources.gpus_per_worker != default_gpus:
            warnings.warn(f"resources.gpus_per_worker={self.resources.gpus_per_worker} has no effect: the run "
                          "trains on CPU", stacklevel=2)
        if self.train.bf16 is True and not native_bf16:
            warnings.warn("train.bf16=true on a CPU without native bf16 (AVX512-BF16 or AMX): "
                          "expect it to be slower than fp32", stacklevel=2)


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig, "resources": ResourcesConfig,
            "checkpoint": CheckpointConfig, "tracking": TrackingConfig, "eval": EvalConfig}
# keys that were renamed: old dotted key -> new one. A config a user writes (YAML, overrides, a
# search space, a sweep's saved base) with an old key is refused with the new name; a checkpoint's
# own saved config.yaml is read with its old keys mapped (``renamed``)
RENAMED = {
    **{f"train.{key}": f"resources.{key}" for key in (
        "num_workers", "device", "cpus_per_worker", "gpus_per_worker", "worker_resources", "torch_threads",
        "in_process", "max_failures", "shared_fs")},
    "train.storage_path": "checkpoint.storage_path",
    "train.checkpoint_every": "checkpoint.every",
    "train.keep_checkpoints": "checkpoint.keep",
    "train.eval_every": "eval.every",
    "train.eval_batch_size": "eval.batch_size",
    "train.eval_max_rows": "eval.max_rows",
    "train.eval_samples": "eval.samples",
    "train.eval_curves": "eval.curves",
}
# keys that moved: (section, key) -> (the value that meant "off", what to write instead). A saved
# config (a checkpoint's) holding the key at that value loads; any other value is refused
MOVED = {
    ("train", "eval_arc_views"): (0, "eval.views=true with eval.width=<views> (ARC's pass@k voted over "
                                     "eval.width views at each evaluation)"),
}


def _without_moved(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the moved keys left at their "off" value; ConfigError naming the new key
    for any other value."""
    out = dict(data)
    for (section, key), (off, instead) in MOVED.items():
        values = out.get(section)
        if not isinstance(values, dict) or key not in values:
            continue
        if values[key] != off:
            raise ConfigError(f"{section}.{key}={values[key]!r} has moved: write {instead}")
        out[section] = {k: v for k, v in values.items() if k != key}
    return out


def refuse_renamed(data: dict[str, Any]) -> None:
    """ConfigError naming the new key for the first renamed key that nested ``data`` holds."""
    for old, new in RENAMED.items():
        section, key = old.split(".")
        values = data.get(section)
        if isinstance(values, dict) and key in values:
            raise ConfigError(f"{old} was renamed {new}: write {new}={excerpt(values[key])}")


def renamed(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a checkpoint's saved config with its renamed keys under their new names."""
    out = copy.deepcopy(data)
    for old, new in RENAMED.items():
        section, key = old.split(".")
        values = out.get(section)
        if isinstance(values, dict) and key in values:
            new_section, new_key = new.split(".")
            out.setdefault(new_section, {})[new_key] = values.pop(key)
    return out


def preset_names() -> list[str]:
    """Names of the configs shipped in ``urm_ray/presets``."""
    folder = resources.files("urm_ray") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_yaml(source: str) -> dict[str, Any]:
    """Read a config from a YAML path or a preset name."""
    # imported here, not at the top: the training step (train/step.py) imports this module on
    # machines that may lack PyYAML
    import yaml

    path = Path(source)
    if not path.is_file():
        if source not in preset_names():
            raise ConfigError(f"config {source!r} is neither a YAML file nor a preset"
                              f"{did_you_mean(source, preset_names())}; presets: {', '.join(preset_names())}")
        path = Path(str(resources.files("urm_ray") / "presets" / f"{source}.yaml"))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def parse_overrides(overrides: list[str], example: str = "model.loops=8") -> dict[str, Any]:
    """``key.sub=value`` strings -> {dotted key: value parsed as a YAML scalar}, in order."""
    import yaml

    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. {example}")
        try:
            out[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or type(err).__name__
            raise ConfigError(f"override {key}={excerpt(raw)}: not a valid YAML value ({problem})") from None
    return out


def with_values(data: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a nested dict with dotted ``values`` set, keeping key order (params are ordered)."""
    out = copy.deepcopy(data)
    for key, value in values.items():
        if isinstance(value, dict) and "." not in str(key):  # would replace the whole section
            raise ConfigError(f"{key}: give dotted keys (train.steps: 600), not a nested section")
        node = out
        *parents, leaf = str(key).split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node[leaf] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML scalars) to a nested dict copy."""
    return with_values(data, parse_overrides(overrides))


def build_config(data: dict[str, Any]) -> RunConfig:
    """Typed, validated RunConfig from a nested dict."""
    data = _without_moved(data)
    refuse_renamed(data)
    unknown = sorted(set(data) - {"model", *SECTIONS})
    if unknown:
        hint = did_you_mean(str(unknown[0]), ["model", *SECTIONS])
        raise ConfigError(f"unknown section {unknown[0]!r}{hint}; sections: model, {', '.join(SECTIONS)}")
    model = data.get("model")
    if not isinstance(model, dict) or "name" not in model:
        raise ConfigError("model.name is required (urm, hrm, trm, gram, transformer)")
    kwargs: dict[str, Any] = {"model": from_dict(config_class(model["name"]), model, "model")}
    for name, cls in SECTIONS.items():
        kwargs[name] = convert(cls, data.get(name, {}), name)
    return RunConfig(**kwargs)


def load_config(source: str, overrides: list[str] | None = None) -> RunConfig:
    """Load a preset or YAML file, apply overrides, validate."""
    return build_config(apply_overrides(read_yaml(source), overrides or []))


def flatten(cfg: RunConfig) -> dict[str, Any]:
    """Dotted-key view of the config, e.g. {'model.loops': 8}, for MLflow params."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else k)
        else:
            out[prefix] = node

    walk(to_dict(cfg), "")
    return out


def differences(saved: dict[str, Any], cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (saved value, new value)} for every key whose values differ between a saved
    config (as ``config.yaml`` records it: no secret) and ``cfg``; a key one side lacks has
    ``UNSET`` there. The saved config is built as a new one is, so defaults and types match
    (ConfigError: it no longer builds)."""
    with warnings.catch_warnings():  # its own warnings were shown when it ran
        warnings.simplefilter("ignore")
        before = flatten(build_config(saved))
    values = flatten(cfg)
    after = redact.strip(values)
    return {key: (before.get(key, UNSET), after.get(key, UNSET)) for key in {*before, *after}
            if before.get(key, UNSET) != after.get(key, UNSET)}


def overridden(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """A new validated config with dotted overrides applied."""
    return build_config(apply_overrides(to_dict(cfg), overrides))


def dump_yaml(cfg: RunConfig) -> str:
    """The config as ``config.yaml`` records it: no secret (``redact.strip``)."""
    import yaml

    data = to_dict(cfg)
    return yaml.safe_dump(redact.strip(data), sort_keys=False)

