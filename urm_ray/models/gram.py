"""Generative Recursive Reasoning (GRAM): TRM's recursion with learned Gaussian guidance on z_H.

One ACT segment is one supervision step of h_cycles (T) transitions. With x the input
embeddings [B, T_pos, D] and TRM's ``cycle`` (l_cycles (K) z_L updates, then a z_H update):

    u, z_L = cycle(z_H, z_L, x)              # deterministic proposal u_t
    eps ~ N(mu, diag(exp(logvar)))           # prior head p(eps | u) or posterior q(eps | u, y)
    z_H = u + noise_scale * proj(eps)        # reparameterised; proj = identity if latent_dim = 0

Only the high level is perturbed (noise on z_L fails in the paper's ablation). In training the
posterior, which also sees the embedded labels y, guides every transition, the no-gradient ones
included; at inference the prior does. Gradients flow only through the last transition of the
segment, as in TRM, and the segment returns the KL of that transition:

    outputs["aux_loss"] = kl_coef * sum_b KL_balanced(q || p)    (added to the loss by act_loss)
    outputs["kl"]       = sum_b KL(q || p), detached

``noise_scale = 0`` skips the guidance entirely: the model is then exactly TRM (same weight
names, so a TRM state dict loads with ``strict=False``). Samples differ only through the global
torch RNG; N trajectories run as one batch (see urm_ray.train.evaluate.evaluate_sampled).

Small-scale caveat: the guidance is per position and is decoded by the per-position lm_head in
the same transition, and no gradient reaches earlier transitions, so a briefly trained tiny
model learns a per-cell posterior code that its prior cannot coordinate: on 6x6 N-Queens a
CPU-minute model reconstructs from the posterior but its prior samples are not yet valid boards.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from urm_ray.losses import gaussian_kl
from urm_ray.models.act import State
from urm_ray.models.layers import Rope, ffn_width, lecun_linear, trunc_normal_
from urm_ray.models.recurrent import require
from urm_ray.models.trm import TRM, TRMConfig

if TYPE_CHECKING:
    from urm_ray.models.registry import TaskSpec

# Predicted log-variances are clamped to this range: the KL divides by exp(logvar_prior), so an
# unbounded prior variance collapse would blow it up (std range ~0.02 .. ~7.4).
LOGVAR_MIN, LOGVAR_MAX = -8.0, 4.0

Gaussian = tuple[Tensor, Tensor]  # (mean, logvar), each float32 [B, T, latent]


@dataclass
class GRAMConfig(TRMConfig):
    """GRAM hyperparameters: TRM's core (num_layers, h_cycles = T, l_cycles = K) plus guidance."""

    name: Literal["gram"] = "gram"  # type: ignore[assignment]
    # width of the Gaussian guidance per position, projected to hidden_size by a linear layer
    # (official code: 256); 0 = the noise lives directly in the hidden width (paper's text)
    latent_dim: int = 256
    # multiplies the whole guidance proj(eps); 1 = GRAM, 0 = guidance off (exactly TRM)
    noise_scale: float = 1.0
    # beta: weight of KL(posterior || prior), summed over positions and latent dims per row
    kl_coef: float = 1e-3
    # KL balancing: share of the KL gradient that trains the prior (paper 0.8); null = plain KL
    kl_balance: Optional[float] = 0.8
    # Q-halt label: "label" = the answer equals the label (act_loss's default); "verifier" = a
    # task verifier accepts the answer. The training loop passes the dataset task's verifier.
    halt_target: Literal["label", "verifier"] = "label"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.latent_dim >= 0, f"model.latent_dim={self.latent_dim} must be >= 0")
        require(self.noise_scale >= 0, f"model.noise_scale={self.noise_scale} must be >= 0")
        require(self.kl_coef >= 0, f"model.kl_coef={self.kl_coef} must be >= 0")
        require(
            self.kl_balance is None or 0.0 <= self.kl_balance <= 1.0,
            f"model.kl_balance={self.kl_balance} must be in [0, 1] or null",
        )
        if self.noise_scale == 0:
            warnings.warn("model.noise_scale=0: guidance is off (the model is TRM); model.kl_coef, "
                          "model.kl_balance and model.latent_dim have no effect")


class GaussianHead(nn.Module):
    """SwiGLU head: features [..., in_dim] -> (mean, clamped log-variance), each [..., latent] float32."""

    def __init__(self, in_dim: int, width: int, latent: int) -> None:
        super().__init__()
        self.gate_up_proj = lecun_linear(in_dim, 2 * width)
        self.down_proj = lecun_linear(width, 2 * latent)

    def forward(self, features: Tensor) -> Gaussian:
        gate, up = self.gate_up_proj(features).chunk(2, dim=-1)
        mean, logvar = self.down_proj(F.silu(gate) * up).float().chunk(2, dim=-1)
        return mean, logvar.clamp(LOGVAR_MIN, LOGVAR_MAX)


class GRAM(TRM):
    """GRAM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    def __init__(self, config: GRAMConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        hidden = config.hidden_size
        latent = config.latent_dim or hidden
        width = ffn_width(hidden, config.expansion)
        # read at every call, so a built model can be switched to its deterministic core (0)
        self.noise_scale = config.noise_scale
        self.prior_head = GaussianHead(hidden, width, latent)  # p(eps | u)
        self.posterior_head = GaussianHead(2 * hidden, width, latent)  # q(eps | [u; repr(y)])
        self.noise_proj = lecun_linear(latent, hidden) if config.latent_dim else nn.Identity()
        self.label_embed = nn.Embedding(task.vocab_size, hidden)  # repr(y), posterior only
        with torch.no_grad():
            trunc_normal_(self.label_embed.weight, std=1 / self.embed_scale)

    def embed_labels(self, labels: Tensor) -> Tensor:
        """repr(y): sqrt(D) * label embeddings behind a zero prefix -> [B, T, D]; ignored labels read as PAD 0."""
        tokens = self.label_embed(labels.clamp_min(0).long())  # [B, L, D]
        return self.embed_scale * F.pad(tokens, (0, 0, self.prefix_len, 0))

    def core(self, state: State, x: Tensor, labels: Tensor) -> tuple[State, dict[str, Tensor]]:
        rope = self.rope(x.shape[1])
        guided = self.noise_scale > 0
        target = self.embed_labels(labels).to(x.dtype) if guided and self.training else None
        z_H, z_L = state["z_H"], state["z_L"]
        with torch.no_grad():
            for _ in range(self.config.h_cycles - 1):
                z_H, z_L, _ = self.transition(z_H, z_L, x, rope, target, last=False)
        z_H, z_L, kl = self.transition(z_H, z_L, x, rope, target, last=True)
        outputs = self.heads(z_H)
        if kl is not None:
            outputs["aux_loss"] = self.config.kl_coef * kl.sum()
            outputs["kl"] = kl.detach().sum()
        return {"z_H": z_H, "z_L": z_L}, outputs

    def transition(
        self, z_H: Tensor, z_L: Tensor, x: Tensor, rope: Rope, target: Optional[Tensor], last: bool
    ) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """One transition -> (z_H, z_L, per-row balanced KL [B] or None).

        The KL is computed only on the ``last`` transition and only with a target (training).
        """
        u, z_L = self.cycle(z_H, z_L, x, rope)  # u: the deterministic proposal [B, T, D]
        if self.noise_scale == 0:
            return u, z_L, None
        posterior = None if target is None else self.posterior_head(torch.cat([u, target], dim=-1))
        mean, logvar = posterior if posterior is not None else self.prior_head(u)
        eps = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)  # [B, T, latent] float32
        z_H = u + self.noise_scale * self.noise_proj(eps.to(u.dtype))
        if posterior is None or not last:
            return z_H, z_L, None
        return z_H, z_L, gaussian_kl(*posterior, *self.prior_head(u), balance=self.config.kl_balance)
