"""Optimizers, learning-rate schedule and EMA for training the recurrent models.

- `AdamAtan2`: pure-PyTorch port of the update of the `adam-atan2` CUDA package
  (imoneoi/adam-atan2) that the official HRM / TRM / URM code trains with.
- `Muon` (+ `build_muon`): orthogonalised momentum for 2-D weights, AdamW for the rest;
  the URM paper's optimizer ablation.
- `SignSGDPuzzleEmbedding`: sparse sign-SGD for the puzzle-embedding table (a buffer).
- `lr_at` / `apply_scheduled_lr`: linear warm-up, then constant or cosine.
- `EMA`: exponential moving average of the parameters, for evaluation.
- `OptimConfig` / `build_optimizers`: the `optim` section of a run config and the optimizers it
  builds for a model.
"""

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.optim import Optimizer

from urm_ray.errors import ConfigError


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model under DDP / DataParallel / torch.compile wrappers (in any nesting)."""
    if isinstance(model, (DistributedDataParallel, DataParallel)):
        return unwrap_model(model.module)
    original = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
    if isinstance(original, nn.Module):
        return unwrap_model(original)
    return model


def _check_hparams(lr: float, weight_decay: float, betas: tuple[float, ...] = ()) -> None:
    """Raise ValueError for values no optimizer here accepts."""
    if lr < 0.0:
        raise ValueError(f"lr={lr} must be >= 0")
    if not all(0.0 <= beta < 1.0 for beta in betas):
        raise ValueError(f"betas={betas} must each be in [0, 1)")
    if weight_decay < 0.0:
        raise ValueError(f"weight_decay={weight_decay} must be >= 0")


def _opmath(t: Tensor) -> Tensor:
    """Half / bfloat16 tensors as a float32 copy (the official kernel's math type); others as-is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _GroupOptimizer(Optimizer):
    """An Optimizer whose ``step`` hands each param group's parameters that have a gradient to
    ``_update_group``; parameters without one are skipped entirely (no decay either)."""

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Tensor]] = None) -> Optional[Tensor]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update_group(params, group)
        return loss

    def _update_group(self, params: list[Tensor], group: dict[str, Any]) -> None:
        raise NotImplementedError


class AdamAtan2(_GroupOptimizer):
    """Adam with atan2 in place of division by sqrt(v) + eps (Everett et al. 2024, arXiv:2407.05872).

    The update of the `adam-atan2` CUDA kernel (`AdamATan2`, used by the official HRM/TRM/URM),
    per parameter p with gradient g and step counter t (per parameter, starting at 1):

        p <- p * (1 - lr * weight_decay)                 decoupled decay, before the moments
        m <- lerp(m, g, 1 - beta1)
        v <- lerp(v, g^2, 1 - beta2)
        p <- p - (lr / (1 - beta1^t)) * atan2(m, sqrt(v) / sqrt(1 - beta2^t))

    No epsilon and no extra scale constants. The bias correction of m scales the step, outside
    atan2, so the first step moves a weight by lr * atan2(1 - beta1, 1) / (1 - beta1)
    (0.997 lr for beta1 = 0.9), and no step moves it by more than lr * pi / 2 / (1 - beta1^t).
    Half / bfloat16 parameters are updated in float32 and stored back.

    Multi-tensor (``torch._foreach_*``) and free of host syncs: the step counters are float32
    tensors on the parameters' device and the bias corrections are computed there.
    State per parameter: `step`, `exp_avg`, `exp_avg_sq` (the official package's keys, so its
    optimizer state dicts load).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 1e-2,
    ):
        _check_hparams(lr, weight_decay, betas)
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def _state_lists(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """Each parameter's (step, exp_avg, exp_avg_sq), created on first use and kept on its device."""
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device != p.device:  # a state dict saved with CPU step counters
                state["step"] = state["step"].to(p.device)
        return tuple([self.state[p][key] for p in params] for key in ("step", "exp_avg", "exp_avg_sq"))

    def _update_group(self, params: list[Tensor], group: dict[str, Any]) -> None:
        lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
        steps, stored_m, stored_v = self._state_lists(params)
        param, exp_avg, exp_avg_sq, grad = ([_opmath(t) for t in ts] for ts in (params, stored_m, stored_v,
                                                                                [p.grad for p in params]))
        torch._foreach_add_(steps, 1.0)
        torch._foreach_mul_(param, 1 - lr * wd)
        torch._foreach_lerp_(exp_avg, grad, 1 - beta1)
        torch._foreach_lerp_(exp_avg_sq, torch._foreach_mul(grad, grad), 1 - beta2)
        # per parameter: -lr / (1 - beta1^t) and sqrt(1 - beta2^t), in float64 as the kernel
        # computes them, as [] tensors on its device
        steps64 = [t.double() for t in steps]
        step_size = torch._foreach_reciprocal(torch._foreach_sub(torch._foreach_pow(beta1, steps64), 1.0))
        torch._foreach_mul_(step_size, lr)
        bias_correction2_sqrt = torch._foreach_sqrt(torch._foreach_neg(torch._foreach_sub(
            torch._foreach_pow(beta2, steps64), 1.0)))
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        update = [torch.atan2(m, d) for m, d in zip(exp_avg, denom)]  # no foreach atan2 in torch
        torch._foreach_mul_(update, step_size)
        torch._foreach_add_(param, update)
        for stored, computed in zip((*params, *stored_m, *stored_v), (*param, *exp_avg, *exp_avg_sq)):
            if stored is not computed:
                stored.copy_(computed)


# Quintic Newton-Schulz coefficients (Keller Jordan's Muon): they push every singular value of
# the normalised input into roughly [0.7, 1.2] in five steps, which is all Muon needs.
_NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz_orthogonalize(update: Tensor, steps: int = 5) -> Tensor:
    """Approximately U V^T for update = U S V^T, by quintic Newton-Schulz iterations in float32."""
    a, b, c = _NS_COEFFS
    x = update.float()  # [rows, cols]
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T  # iterate on the wide orientation: the Gram matrix is the smaller one
    x = x / (x.norm() + 1e-7)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T  # [rows, rows]
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


class Muon(_GroupOptimizer):
    """Momentum orthogonalised by Newton-Schulz, for 2-D weights only.

    For a weight W [out, in] with gradient G and momentum buffer B:

        B <- momentum * B + G
        U  = G + momentum * B   (Nesterov)   or   U = B
        W <- W * (1 - lr * weight_decay) - lr * rms_scale * sqrt(max(out, in)) * NS(U)

    NS(U) ~ the orthogonal factor of U (all singular values ~ 1). The sqrt(max(out, in)) *
    rms_scale factor (Moonlight's "match AdamW update RMS", rms_scale = 0.2) lets Muon share
    AdamW's learning rate and weight decay, which is how the official URM ablation runs it.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        rms_scale: float = 0.2,
    ):
        _check_hparams(lr, weight_decay)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum} must be in [0, 1)")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov)
        super().__init__(params, dict(defaults, ns_steps=ns_steps, rms_scale=rms_scale))
        shapes = [tuple(p.shape) for group in self.param_groups for p in group["params"] if p.ndim != 2]
        if shapes:
            raise ValueError(f"Muon only updates 2-D weights; got shapes {shapes} (use build_muon to split)")

    def _update_group(self, params: list[Tensor], group: dict[str, Any]) -> None:
        for p in params:
            self._update(p, group)

    def _update(self, p: Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf, mu = state["momentum_buffer"], group["momentum"]
        buf.mul_(mu).add_(p.grad)
        update = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
        ortho = newton_schulz_orthogonalize(update, group["ns_steps"]).to(p.dtype)
        scale = group["rms_scale"] * math.sqrt(max(p.shape))
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(ortho, alpha=-group["lr"] * scale)


def build_muon(
    params: Iterable[Tensor],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    momentum: float = 0.95,
    ns_steps: int = 5,
) -> list[Optimizer]:
    """Muon for 2-D weights, AdamW (eps 1e-8) for every other parameter, as the official URM splits.

    Like the official split, 2-D means every matrix, the token embedding and LM head included;
    biases, norms' gains and the depthwise conv kernels [C, 1, K] go to AdamW.
    """
    params = [p for p in params if p.requires_grad]
    matrices = [p for p in params if p.ndim == 2]
    others = [p for p in params if p.ndim != 2]
    optimizers: list[Optimizer] = []
    if matrices:
        optimizers.append(Muon(matrices, lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps))
    if others:
        optimizers.append(torch.optim.AdamW(others, lr=lr, betas=betas, eps=1e-8, weight_decay=weight_decay))
    return optimizers


def _all_gather_rows(ids: Tensor, grads: Tensor) -> tuple[Tensor, Tensor]:
    """Concatenate every rank's ids [B] and grads [B, D] (same B on every rank); identity when not distributed."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return ids, grads
    world_size = dist.get_world_size()
    id_parts = [torch.empty_like(ids) for _ in range(world_size)]
    grad_parts = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(id_parts, ids.contiguous())
    dist.all_gather(grad_parts, grads.contiguous())
    return torch.cat(id_parts), torch.cat(grad_parts)  # [world*B], [world*B, D]


def _summed_by_id(ids: Tensor, grads: Tensor) -> tuple[Tensor, Tensor]:
    """ids [N] and gradient rows [N, D] -> (the ids, sorted [N]; at each, the sum of every row with
    that id [N, D]). Shapes stay N whatever the ids, so nothing waits for the device to count the
    distinct ids (``unique`` would). The stable sort adds a repeated id's rows in their order, as
    ``index_add_`` in the batch's order does."""
    sorted_ids, order = ids.sort(stable=True)  # [N], [N]
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    segment = starts.cumsum(0) - 1  # [N]: which distinct id, 0-based
    summed = torch.zeros_like(grads).index_add_(0, segment, grads[order])  # [N, D]: first rows used
    return sorted_ids, summed[segment]


class SignSGDPuzzleEmbedding:
    """Sparse sign-SGD with decoupled weight decay for a `PuzzleEmbedding` table.

    The table `module.weights` [num_ids, D] is a buffer. In train mode the module copies the
    batch's rows into the leaf `module.local_weights` [B, D] and records `module.local_ids` [B];
    backward fills `local_weights.grad`; `module.trained_rows()` gives them (every micro-batch's,
    with gradient accumulation). One step (ids and grads all-gathered over ranks first
    when torch.distributed is initialized) touches only the ids seen in the global batch:

        g[id]  = sum of the gradient rows with that id
        w[id] <- w[id] * (1 - lr * weight_decay) - lr * sign(g[id])

    The step waits for nothing on the host: its shapes are those of the gathered rows, whatever
    the ids (``_summed_by_id``).

    Not a torch Optimizer (the table is no parameter), but it has `param_groups` (one group with
    `lr`, `weight_decay`), `step`, `zero_grad`, `state_dict` and `load_state_dict`, so a
    scheduler and a checkpoint treat it like the others.
    """

    def __init__(self, module: nn.Module, lr: float = 1e-2, weight_decay: float = 0.1):
        _check_hparams(lr, weight_decay)
        self.module = module
        self.param_groups: list[dict[str, Any]] = [dict(lr=lr, weight_decay=weight_decay)]

    @torch.no_grad()
    def step(self) -> None:
        rows = self.module.trained_rows()
        if rows is None:
            return
        ids, grads = _all_gather_rows(rows[0].to(torch.long), rows[1])
        ids, summed = _summed_by_id(ids, grads)
        weights = self.module.weights
        lr, wd = self.param_groups[0]["lr"], self.param_groups[0]["weight_decay"]
        rows = weights[ids].mul_(1 - lr * wd).add_(torch.sign(summed).to(weights.dtype), alpha=-lr)
        weights[ids] = rows  # a repeated id writes the same row each time

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.clear_rows()

    def state_dict(self) -> dict[str, Any]:
        return {"param_groups": [dict(group) for group in self.param_groups]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.param_groups = [dict(group) for group in state_dict["param_groups"]]


def lr_at(
    step: int,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    kind: Literal["cosine", "constant"] = "cosine",
    min_ratio: float = 0.0,
) -> float:
    """Learning rate at optimizer step `step` (0-based).

    Linear warm-up from 0 (step 0) to base_lr (step warmup_steps), then either constant, or a
    half cosine from base_lr down to min_ratio * base_lr at total_steps (held there after).
    Official HRM/TRM/URM: cosine with min_ratio 1.0, i.e. constant after warm-up.
    """
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    if kind == "constant":
        return base_lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class EMA:
    """Exponential moving average of a model's trainable parameters (shadow <- d * shadow + (1 - d) * p).

    Keyed by parameter name of the unwrapped model, so it works the same under DDP and
    torch.compile. Buffers are not averaged or stored (the puzzle-embedding table alone can be
    gigabytes): ``applied`` evaluates with the live buffers, as the official code does.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay={decay} must be in (0, 1)")
        self.decay = decay
        self.shadow = {name: p.detach().clone() for name, p in self._params(model)}

    @staticmethod
    def _params(model: nn.Module) -> list[tuple[str, Tensor]]:
        return [(name, p) for name, p in unwrap_model(model).named_parameters() if p.requires_grad]

    def _pairs(self, model: nn.Module) -> tuple[list[Tensor], list[Tensor]]:
        """(the model's parameters, their averages), in the same order."""
        named = self._params(model)
        return [p.detach() for _, p in named], [self.shadow[name] for name, _ in named]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold the model's current parameters into the average (call after each optimizer step)."""
        params, shadows = self._pairs(model)
        torch._foreach_lerp_(shadows, params, 1 - self.decay)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Overwrite the model's parameters with the averages, in place."""
        params, shadows = self._pairs(model)
        torch._foreach_copy_(params, shadows)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """The unwrapped model with the averages in place of its parameters, inside the block;
        its own parameters are put back after, bit for bit. Costs one copy of the parameters
        (never of the buffers, which a deep copy of the model would duplicate)."""
        params, _ = self._pairs(model)
        with torch.no_grad():
            saved = [p.clone() for p in params]
            self.copy_to(model)
        try:
            yield unwrap_model(model)
        finally:
            with torch.no_grad():
                torch._foreach_copy_(params, saved)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "shadow": dict(self.shadow)}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        shadow = state_dict["shadow"]
        if set(shadow) != set(self.shadow):
            missing, unexpected = sorted(set(self.shadow) - set(shadow)), sorted(set(shadow) - set(self.shadow))
            raise KeyError(f"EMA state does not match the model: missing {missing}, unexpected {unexpected}")
        self.decay = state_dict["decay"]
        for name, value in shadow.items():
            self.shadow[name].copy_(value)


@dataclass
class OptimConfig:
    """The `optim` section of a run config. Defaults: the official URM ARC-AGI-1 setup."""

    # Network optimizer: "adam_atan2" (official) or "muon" (2-D weights; AdamW for the rest).
    optimizer: Literal["adam_atan2", "muon"] = "adam_atan2"
    # Peak learning rate of the network (URM: 1e-4 on ARC-AGI-1, 3e-4 on ARC-AGI-2).
    lr: float = 1e-4
    # Decoupled weight decay of the network, applied as p *= 1 - lr * weight_decay (1.0 for Sudoku).
    weight_decay: float = 0.1
    # Adam first-moment decay (AdamAtan2, and AdamW under muon).
    beta1: float = 0.9
    # Adam second-moment decay.
    beta2: float = 0.95
    # Muon momentum (optimizer="muon" only).
    muon_momentum: float = 0.95
    # Peak learning rate of the sign-SGD puzzle-embedding table (1e-4 for Sudoku).
    puzzle_emb_lr: float = 1e-2
    # Decoupled weight decay of the puzzle-embedding table (1.0 for Sudoku).
    puzzle_emb_weight_decay: float = 0.1
    # Optimizer steps of linear warm-up from 0, for every optimizer.
    warmup_steps: int = 2000
    # After warm-up: "constant" (official: cosine with min ratio 1.0, the same thing) or "cosine".
    schedule: Literal["constant", "cosine"] = "constant"
    # Final lr as a fraction of the peak at the end of a cosine schedule (schedule="cosine" only).
    min_lr_ratio: float = 0.0
    # Keep an exponential moving average of the weights and evaluate with it.
    ema: bool = True
    # EMA decay per optimizer step (ema=True only).
    ema_decay: float = 0.999
    # Max global gradient norm of the network; 0 = no clipping (the official code does not clip).
    grad_clip: float = 0.0

    def __post_init__(self) -> None:
        self._check_ranges()
        self._warn_unused()

    def _check_ranges(self) -> None:
        checks = [
            ("lr", self.lr > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "must be in [0, 1)"),
            ("muon_momentum", 0 <= self.muon_momentum < 1, "must be in [0, 1)"),
            ("puzzle_emb_lr", self.puzzle_emb_lr > 0, "must be > 0"),
            ("puzzle_emb_weight_decay", self.puzzle_emb_weight_decay >= 0, "must be >= 0"),
            ("warmup_steps", self.warmup_steps >= 0, "must be >= 0"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "must be in [0, 1]"),
            ("ema_decay", 0 < self.ema_decay < 1, "must be in (0, 1)"),
            ("grad_clip", self.grad_clip >= 0, "must be >= 0 (0 = off)"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise ConfigError(f"optim.{key}={getattr(self, key)} {expected}")
        if self.optimizer not in ("adam_atan2", "muon"):
            raise ConfigError(f"optim.optimizer={self.optimizer!r} must be 'adam_atan2' or 'muon'")
        if self.schedule not in ("constant", "cosine"):
            raise ConfigError(f"optim.schedule={self.schedule!r} must be 'constant' or 'cosine'")

    def _warn_unused(self) -> None:
        defaults = OptimConfig.__dataclass_fields__
        unused = [
            ("muon_momentum", self.optimizer != "muon", "optim.optimizer is not 'muon'"),
            ("min_lr_ratio", self.schedule != "cosine", "optim.schedule is not 'cosine'"),
            ("ema_decay", not self.ema, "optim.ema is False"),
        ]
        for key, is_unused, reason in unused:
            if is_unused and getattr(self, key) != defaults[key].default:
                warnings.warn(f"optim.{key}={getattr(self, key)} has no effect: {reason}", stacklevel=3)


def _puzzle_embedding(model: nn.Module) -> Optional[nn.Module]:
    """The model's `puzzle_emb` module when it has a non-empty table, else None."""
    module = unwrap_model(model).puzzle_emb  # every family has one: None where puzzle_emb_dim = 0
    if module is None or module.weights.ndim != 2 or module.weights.shape[-1] == 0:
        return None
    return module


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> list[Any]:
    """The optimizers for `model`: the network ones first, then the puzzle-embedding sign-SGD if any.

    Each param group records its peak lr as `base_lr`; `apply_scheduled_lr` sets `lr` from it.
    """
    params = [p for p in unwrap_model(model).parameters() if p.requires_grad]
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "muon":
        optimizers: list[Any] = build_muon(params, cfg.lr, cfg.weight_decay, betas, momentum=cfg.muon_momentum)
    else:
        optimizers = [AdamAtan2(params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay)]
    puzzle_emb = _puzzle_embedding(model)
    if puzzle_emb is not None:
        optimizers.append(SignSGDPuzzleEmbedding(puzzle_emb, cfg.puzzle_emb_lr, cfg.puzzle_emb_weight_decay))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def apply_scheduled_lr(optimizers: list[Any], cfg: OptimConfig, step: int, total_steps: int) -> float:
    """Set every param group's `lr` for optimizer step `step`; returns the network's lr (for logging)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, group["base_lr"], cfg.warmup_steps, total_steps, cfg.schedule, cfg.min_lr_ratio)
    return optimizers[0].param_groups[0]["lr"]
