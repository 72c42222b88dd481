"""Task verifiers on predicted token boards, as torch functions, from the task registry.

A verifier maps (answers, inputs, labels), each [N, L] token ids on any device, to [N] bool on the
answers' device: True when the answer is a valid solution of the input, whichever solution it is.
Each task's module holds its numpy check (`PuzzleTask.verifier`); this wraps it for tensors (one
copy to the host and back per call: a host sync where the tensors are on a GPU). Uses:
GRAM's halting target (``model.halt_target: verifier``), the validity / coverage counts of
sampled evaluation, ``eval/valid_accuracy`` and ``urm-ray sample``.

    accepts = verifier_for("maze", seq_len=900)
    ok = accepts(logits.argmax(-1), batch["inputs"], batch["labels"])     # [B] bool

``nearest_for`` wraps a task's search for the valid answer nearest to an answer the same way.

ARC has one right answer per input, so it has no verifier: its answers are checked against the
label (`tasks.arc.evaluate.exact_match`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from urm_ray.data.tasks import registry
from urm_ray.data.tasks.task import NumpyCheck
from urm_ray.errors import ConfigError

Verifier = Callable[[Tensor, Tensor, Tensor], Tensor]


def to_host(*boards: Tensor) -> list[np.ndarray]:
    """Token boards [N, L] (any integer dtypes) as int64 numpy arrays, in ONE copy from the device:
    a host check waits for the device once, not once per board."""
    return list(torch.stack([t.detach().long() for t in boards]).cpu().numpy())


def _on_numpy(check: NumpyCheck) -> Verifier:
    def verify(answers: Tensor, inputs: Tensor, labels: Tensor) -> Tensor:
        ok = check(*to_host(answers, inputs, labels))
        return torch.from_numpy(np.asarray(ok, dtype=bool)).to(answers.device)

    return verify


def verifier_for(task: str, seq_len: int) -> Verifier:
    """The verifier of ``task`` for boards of ``seq_len`` tokens; ConfigError if there is none."""
    factory = registry.get(task).verifier
    if factory is None:
        having = sorted(name for name, t in registry.TASKS.items() if t.verifier is not None)
        raise ConfigError(f"task {task!r} has one right answer per input and no verifier (its"
                          f" answers are checked against the label); tasks with one: {having}")
    return _on_numpy(factory(seq_len))


# (answers, inputs, labels) [N, L] tensors -> [N, L] targets on the labels' device
Search = Callable[[Tensor, Tensor, Tensor], Tensor]


def nearest_for(task: str, seq_len: int, vocab_size: int) -> Search:
    """``task``'s search for the valid answer nearest to each answer, as a torch function (GRAM's
    ``model.prior_match_targets: nearest``); ConfigError if the task has none or it is too large."""
    factory = registry.get(task).nearest
    if factory is None:
        having = sorted(name for name, t in registry.TASKS.items() if t.nearest is not None)
        raise ConfigError(f"task {task!r} has no search for the nearest valid answer; tasks with one: {having}")
    search = factory(seq_len, vocab_size)

    def nearest(answers: Tensor, inputs: Tensor, labels: Tensor) -> Tensor:
        targets = search(*to_host(answers, inputs, labels))
        return torch.from_numpy(np.asarray(targets)).to(labels.device, labels.dtype)

    return nearest


def optional_verifier(task: str, seq_len: int) -> Verifier | None:
    """``task``'s verifier, or None where it has none (answers then count as valid only when
    they equal the label)."""
    return None if registry.get(task).verifier is None else verifier_for(task, seq_len)
