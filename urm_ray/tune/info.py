"""Where a sweep's pieces live (``sweeps/<name>/sweep.json``): a leaf module, read by the sweep
entry point, its report, ``best`` and ``final``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from urm_ray import redact

INFO_FILE = "sweep.json"


@dataclass
class SweepInfo:
    """Where a sweep's pieces live; written at creation, read by resume, best and final."""

    name: str
    folder: str  # absolute
    storage: str  # Optuna storage URL (study name = sweep name)
    tracking_uri: str
    experiment: str  # one MLflow experiment per sweep
    source: str = ""  # the space file it was created from
    parent_run_id: str = ""
    # dotted keys every trial (and the best config) gets: planned resources, resolved data path
    trial_overrides: dict[str, Any] = field(default_factory=dict)
    # Ray Train storage of the trials' and final runs: the base config's checkpoint.storage_path when
    # that is a URI (s3://..., which every node of a cluster reaches) plus /<name>; else the folder
    run_storage: str = ""
    # caps (0 = none; see tune/cost.py) and the wall time spent: seconds of the sweep's earlier
    # runs, plus the time since ``started_at`` (epoch seconds; 0 while it does not run)
    max_hours: float = 0.0
    max_device_hours: float = 0.0
    price_per_hour: float = 0.0  # per device-hour, for ``cost/usd``
    spent_s: float = 0.0
    started_at: float = 0.0

    @classmethod
    def load(cls, folder: Path) -> SweepInfo:
        """As saved: without secrets (see ``save``)."""
        return cls(**json.loads((folder / INFO_FILE).read_text()))

    def elapsed_s(self) -> float:
        """Wall seconds the sweep has run, over all its runs (a resume's too)."""
        return self.spent_s + (time.time() - self.started_at if self.started_at else 0.0)

    @property
    def path(self) -> Path:
        return Path(self.folder)

    @property
    def tune_storage(self) -> str:
        """Tune's storage: its experiment state and the one-worker trials' checkpoints, beside the
        trials' Train runs (on S3 when ``run_storage`` is a URI, else in the sweep folder)."""
        return self.run_storage or self.folder

    @property
    def tune_path(self) -> str:
        return f"{self.tune_storage}/tune"

    def runs_path(self, kind: str) -> str:
        """Where the Train runs of ``kind`` ("trials", "final") keep their checkpoints."""
        return f"{self.run_storage or self.folder}/{kind}"

    def save(self) -> None:
        """Written without secrets (``redact.strip``): a resume takes them from the environment
        or ``--storage`` again (``redact.recall``)."""
        (self.path / INFO_FILE).write_text(json.dumps(redact.strip(asdict(self)), indent=2))

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=self.name, storage=storage(self.storage))


def storage(url: str) -> optuna.storages.RDBStorage:
    # a database server may drop a pooled connection during an hours-long sweep (a restart, an
    # idle timeout): checked before use, it is replaced instead of failing the next call
    engine = {} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return _Storage(url, engine_kwargs=engine)


class _Storage(optuna.storages.RDBStorage):
    """Optuna's RDB storage, pickled without the URL's password: Tune saves the searcher that
    holds it to the sweep folder. Read back, it takes the password from ``redact.recall`` (the
    resuming command's ``--storage``), else from PGPASSWORD or ~/.pgpass."""

    def __getstate__(self) -> dict[Any, Any]:
        return {**super().__getstate__(), "url": redact.strip(self.url)}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__({**state, "url": redact.recall(state["url"])})
