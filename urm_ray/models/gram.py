"""Generative Recursive Reasoning (GRAM): TRM's recursion with learned Gaussian guidance on z_H.

One ACT segment is one supervision step of h_cycles (T) transitions. With x the input
embeddings [B, T_pos, D] and TRM's ``cycle`` (l_cycles (K) z_L updates, then a z_H update):

    u, z_L = cycle(z_H, z_L, x)              # deterministic proposal u_t
    eps ~ N(mu, diag(exp(logvar)))           # prior head p(eps | u) or posterior q(eps | u, y)
    z_H = u + noise_scale * proj(eps)        # reparameterised; proj = identity if latent_dim = 0

Only the high level is perturbed (noise on z_L fails in the paper's ablation). In training the
posterior, which also sees the embedded labels y, guides every transition, the no-gradient ones
included; at inference the prior does. Gradients flow through the last transition of the
segment only, as in TRM. The KL (balanced, see ``losses.gaussian_kl``) is charged

- ``kl_transitions: all`` (default): at every posterior-guided transition. In the no-gradient
  ones the two heads run with gradient on the detached proposal, so only they learn from it and
  memory stays at one transition. The paper charges only the last (``last``), which lets the
  posterior write the answer into z_H at the transitions nobody pays for: the prior then learns
  to copy it out of u instead of finding it.
- ``kl_reduction: token_mean`` (default): a row's summed KL over its supervised tokens, the
  scale of the per-token-mean lm_loss, so kl_coef = 1 is an ELBO; ``sum`` is the paper's.

    outputs["aux_loss"] = kl_coef * sum_b (sum_t KL_t[b]) / scale_b    (added by losses.guided_loss)
    outputs["kl"], ["kl_first"], ["kl_last"] = summed KL over rows (all, first, last), nats

``halt_decode: prior`` (default) takes the Q-halt label from a prior-guided draw at the last
transition (``outputs["halt_logits"]``): the posterior-guided answer is always right, so as a
label it teaches the Q-head to halt at once, and deep supervision never sees later segments.

``prior_match`` (off by default) adds a second training pass of the segment, guided by the prior
and with gradient (``transitions`` with no target): its decode ``prior_logits`` is trained
towards the batch's labels for the same input, matched one to one to the draws
(``losses.matched_answers``), so the core learns to decode the states inference reaches. That
matching, like ``halt_target: verifier``, runs on the host once per step (objectives.py, "Host
work"); everything else here stays on the device.

``noise_scale = 0`` builds no guidance modules: the model is then exactly TRM (same weights, so
a TRM state dict loads). Samples differ only through the global torch RNG; N trajectories run
as one batch (see urm_ray.eval.heldout.evaluate_sampled).

Multi-solution tasks (``latent_scope: row``): with one latent per position the posterior writes
the answer cell by cell, and the prior, which draws each cell's noise alone, cannot make the
cells agree. With one latent per row (the heads read their hidden features averaged over
positions, and each position reads the draw through a linear map of its own) the posterior can
only name which answer; the core decodes it. Under RoPE a blank board reads alike at every
position, so this scope also adds learned absolute positions to the input.

What was measured for each of these choices: docs/experiments/gram-guidance.md.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from collections.abc import Callable
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from urm_ray.losses import IGNORE_LABEL_ID, gaussian_kl
from urm_ray.models.act import State
from urm_ray.models.layers import Rope, ffn_width, lecun_linear, trunc_normal_
from urm_ray.models.recurrent import require
from urm_ray.models.task import TaskSpec
from urm_ray.models.trm import TRM, TRMConfig

# Predicted log-variances are clamped to this range: the KL divides by exp(logvar_prior), so an
# unbounded prior variance collapse would blow it up (std range ~0.02 .. ~7.4).
LOGVAR_MIN, LOGVAR_MAX = -8.0, 4.0

Gaussian = tuple[Tensor, Tensor]  # (mean, logvar), each float32 [B, T, latent]


@dataclass
class GuidanceConfig:
    """The guidance fields, shared by GRAM on TRM's core (``gram``) and on URM's (``gram_urm``).
    Where a default departs from the paper, the runs that chose it are in
    docs/experiments/gram-guidance.md."""

    # width of the Gaussian latent, projected to hidden_size by a linear layer (official code:
    # 256); 0 = the noise lives in the hidden width itself (the paper's text)
    latent_dim: int = 256
    # multiplies the guidance proj(eps): 1 = GRAM; 0 = guidance off, the model is exactly its core
    noise_scale: float = 1.0
    # beta, the weight of KL(posterior, prior), reduced per row as kl_reduction says (paper: 1e-3
    # on the sum)
    kl_coef: float = 1.0
    # start of a linear KL schedule that reaches kl_coef after kl_ramp_steps: low so the latent is
    # taken up, then higher so the code shrinks; null = kl_coef throughout (paper)
    kl_coef_start: Optional[float] = None
    # training steps of the KL schedule from kl_coef_start to kl_coef; 0 = no schedule
    kl_ramp_steps: int = 0
    # KL balancing: share of the KL gradient that trains the prior, the rest the posterior (paper
    # 0.8); null = plain KL
    kl_balance: Optional[float] = 0.8
    # transitions whose KL is charged: all = every posterior-guided one (the no-gradient ones train
    # only the two heads); last = only those with gradient (paper), which leaves the others a free
    # channel for the answer
    kl_transitions: Literal["all", "last"] = "all"
    # token_mean = a row's KL over its supervised tokens, lm_loss's scale (kl_coef 1 is then an
    # ELBO); sum = summed over positions and latent dims (paper)
    kl_reduction: Literal["token_mean", "sum"] = "token_mean"
    # the state the Q-halt head and its label see in training: prior = a prior-guided draw at the
    # last transition, what inference decodes; posterior = the training state, always right (paper)
    halt_decode: Literal["prior", "posterior"] = "prior"
    # Q-halt label: label = the answer equals the label; verifier = the dataset task's verifier
    # accepts the answer (tasks with several valid answers)
    halt_target: Literal["label", "verifier"] = "label"
    # one latent per position (paper) or per row: a row's latent can only name which answer, the
    # core decodes it (tasks with several valid answers); row also adds learned absolute positions
    latent_scope: Literal["position", "row"] = "position"
    # weight of the prior match: a second, prior-guided pass of the segment with gradient, its decode
    # trained towards targets matched one to one to the draws (losses.matched_answer_loss), so the
    # decoder learns the states inference reaches; costs a second forward and backward. 0 = off (paper)
    prior_match: float = 0.0
    # training step from which the prior match runs: started before the posterior uses the latent,
    # it collapses the latent
    prior_match_start: int = 0
    # the prior match's targets: label = the batch's labels of the same input; nearest = the task's
    # valid answers from an exhaustive search (small colouring, N-Queens up to 10x10, 4x4 Sudoku)
    prior_match_targets: Literal["label", "nearest"] = "label"
    # where a prior sample (eval.samples, `urm-ray sample`) stops: limit = at the ACT limit
    # (max_segments); q = at the first segment whose halt head says halt (the paper's inference)
    sample_halt: Literal["limit", "q"] = "limit"
    # multiplies the prior's standard deviation when sampling (eval only; training draws keep 1):
    # below 1 trades coverage for valid samples; 1 = paper
    sample_temperature: float = 1.0

    def check_guidance(self) -> None:
        """Validates the guidance fields; each config's __post_init__ calls it."""
        require(getattr(self, "state_noise", 0.0) == 0,
                f"model.state_noise={getattr(self, 'state_noise', 0.0)}: GRAM draws its own noise from its "
                "prior (model.noise_scale; --temperature at evaluation)")
        require(self.latent_dim >= 0, f"model.latent_dim={self.latent_dim} must be >= 0")
        require(self.noise_scale >= 0, f"model.noise_scale={self.noise_scale} must be >= 0")
        require(self.sample_temperature >= 0, f"model.sample_temperature={self.sample_temperature} must be >= 0")
        require(self.kl_coef >= 0, f"model.kl_coef={self.kl_coef} must be >= 0")
        require(self.prior_match >= 0, f"model.prior_match={self.prior_match} must be >= 0")
        require(self.prior_match_start >= 0, f"model.prior_match_start={self.prior_match_start} must be >= 0")
        require(self.kl_coef_start is None or (self.kl_coef_start >= 0 and self.kl_ramp_steps >= 1),
                f"model.kl_coef_start={self.kl_coef_start} needs a value >= 0 and model.kl_ramp_steps >= 1 "
                f"(got {self.kl_ramp_steps})")
        require(self.kl_ramp_steps == 0 or self.kl_coef_start is not None,
                f"model.kl_ramp_steps={self.kl_ramp_steps} needs model.kl_coef_start (the ramp's start)")
        require(
            self.kl_balance is None or 0.0 <= self.kl_balance <= 1.0,
            f"model.kl_balance={self.kl_balance} must be in [0, 1] or null",
        )
        if self.prior_match_start and not self.prior_match:
            warnings.warn(f"model.prior_match_start={self.prior_match_start} has no effect with model.prior_match=0 "
                          "(the prior match is off)")
        if self.prior_match_targets != "label" and not self.prior_match:
            warnings.warn(f"model.prior_match_targets={self.prior_match_targets!r} has no effect with model.prior_match=0 "
                          "(the prior match is off)")
        if self.noise_scale == 0:
            warnings.warn("model.noise_scale=0: guidance is off (the model is its deterministic core); model.kl_coef, "
                          "model.kl_balance, model.latent_dim and model.prior_match have no effect")


@dataclass
class GRAMConfig(TRMConfig, GuidanceConfig):
    """GRAM hyperparameters: TRM's core (num_layers, h_cycles = T, l_cycles = K) plus guidance."""

    name: Literal["gram"] = "gram"  # type: ignore[assignment]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_guidance()


class GaussianHead(nn.Module):
    """SwiGLU head: features [B, T, in_dim] -> (mean, clamped log-variance), each [B, T, latent]
    float32, or [B, 1, latent] with ``pooled`` (the hidden activations averaged over positions:
    their products of linear forms keep which feature sat at which position, a plain mean would not)."""

    def __init__(self, in_dim: int, width: int, latent: int, pooled: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = lecun_linear(in_dim, 2 * width)
        self.down_proj = lecun_linear(width, 2 * latent)
        self.pooled = pooled

    def forward(self, features: Tensor) -> Gaussian:
        gate, up = self.gate_up_proj(features).chunk(2, dim=-1)
        hidden = F.silu(gate) * up
        if self.pooled:
            hidden = hidden.mean(dim=-2, keepdim=True)
        mean, logvar = self.down_proj(hidden).float().chunk(2, dim=-1)
        return mean, logvar.clamp(LOGVAR_MIN, LOGVAR_MAX)


class PositionwiseProjection(nn.Module):
    """A row's latent [B, 1, latent] -> [B, T, hidden] through a linear map of its own at each
    position (LeCun-normal init): from the first step the code moves each cell differently, so the
    lm loss reaches the latent directly, not only through the core's attention."""

    def __init__(self, latent: int, hidden: int, positions: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(trunc_normal_(torch.empty(positions, latent, hidden), std=latent**-0.5))

    def forward(self, eps: Tensor) -> Tensor:
        return torch.einsum("bol,tlh->bth", eps, self.weight.to(eps.dtype))


def prior_match_on(config: GuidanceConfig, step: int) -> bool:
    """Whether training step ``step`` runs the prior match's second pass."""
    return config.prior_match > 0 and step >= config.prior_match_start


def kl_coef_at(config: GuidanceConfig, step: int) -> float:
    """The KL coefficient at a training step: kl_coef, or on the ramp from kl_coef_start."""
    if config.kl_coef_start is None:
        return config.kl_coef
    done = min(step / config.kl_ramp_steps, 1.0)
    return config.kl_coef_start + done * (config.kl_coef - config.kl_coef_start)


class Guided(nn.Module):
    """The guidance of a GRAM model on any deterministic core: the prior and posterior heads, the
    latent projection, the label embedding, and what a segment outputs from them."""

    config: GuidanceConfig
    embed_scale: float
    prefix_len: int
    heads: Callable[[Tensor], dict[str, Tensor]]

    def __init__(self, config: GuidanceConfig, task: TaskSpec) -> None:
        super().__init__(config, task)  # the core's (TRM, URM): Guided comes first in the bases
        # read at every call, so a built model can be switched to its deterministic core (0)
        self.noise_scale = config.noise_scale
        self.sample_halt = config.sample_halt  # read by heldout.sample_answers
        self.sample_temperature = config.sample_temperature  # read at every prior draw in eval mode
        # the KL's weight now (a tensor, so a compiled graph reads it rather than baking it in)
        self.register_buffer("kl_weight", torch.tensor(kl_coef_at(config, 0)), persistent=False)
        self.register_buffer("prior_weight", torch.tensor(config.prior_match), persistent=False)
        self.prior_match_on = prior_match_on(config, 0)  # set by schedule() at every training step
        if config.noise_scale:  # else none: weights without gradient, which DDP rejects
            self.build_guidance(config, task)

    def build_guidance(self, config: GRAMConfig, task: TaskSpec) -> None:
        """The prior and posterior heads, the latent projection and the label embedding."""
        hidden = config.hidden_size
        latent = config.latent_dim or hidden
        width = ffn_width(hidden, config.expansion)
        pooled = config.latent_scope == "row"
        self.prior_head = GaussianHead(hidden, width, latent, pooled)  # p(eps | u)
        self.posterior_head = GaussianHead(2 * hidden, width, latent, pooled)  # q(eps | [u; repr(y)])
        if not config.latent_dim:
            self.noise_proj: nn.Module = nn.Identity()
        elif pooled:
            self.noise_proj = PositionwiseProjection(latent, hidden, self.prefix_len + task.seq_len)
        else:
            self.noise_proj = lecun_linear(latent, hidden)
        self.label_embed = nn.Embedding(task.vocab_size, hidden)  # repr(y), posterior only
        with torch.no_grad():
            trunc_normal_(self.label_embed.weight, std=1 / self.embed_scale)
        if config.latent_scope == "row":  # a code added at every position needs them told apart
            positions = torch.empty(self.prefix_len + task.seq_len, hidden)
            self.position_embed = nn.Parameter(trunc_normal_(positions, std=1 / self.embed_scale))

    def embed_input(self, inputs: Tensor, puzzle_ids: Tensor) -> Tensor:
        """The core's input embeddings, plus learned absolute positions with ``latent_scope: row``:
        RoPE sees only offsets, so on a blank board every position would otherwise read alike."""
        x = super().embed_input(inputs, puzzle_ids)
        if self.noise_scale and self.config.latent_scope == "row":
            return x + self.embed_scale * self.position_embed.to(x.dtype)
        return x

    def embed_labels(self, labels: Tensor) -> Tensor:
        """repr(y): sqrt(D) * label embeddings behind a zero prefix -> [B, T, D]; ignored labels read as PAD 0."""
        tokens = self.label_embed(labels.clamp_min(0).long())  # [B, L, D]
        return self.embed_scale * F.pad(tokens, (0, 0, self.prefix_len, 0))

    def training_target(self, labels: Tensor, x: Tensor) -> Optional[Tensor]:
        """repr(y) in training (the posterior's input), None at inference (the prior guides)."""
        return self.embed_labels(labels).to(x.dtype) if self.training else None

    def free_transition(self, u: Tensor, target: Optional[Tensor], kls: list[Tensor]) -> Tensor:
        """The guided state after a no-gradient proposal u. With ``kl_transitions: all`` in
        training its KL is charged (appended to ``kls``): u has no history, so only the heads
        learn from it and memory stays at one transition."""
        charge = target is not None and self.config.kl_transitions == "all"
        with torch.set_grad_enabled(charge and torch.is_grad_enabled()):
            z, kl = self.guide(u, target, charge)
        kls += [kl] if kl is not None else []
        return z.detach()

    def graded_transition(self, u: Tensor, target: Optional[Tensor], kls: list[Tensor]) -> Tensor:
        """The guided state after a proposal u with gradient; in training its KL joins ``kls``."""
        z, kl = self.guide(u, target, target is not None)
        kls += [kl] if kl is not None else []
        return z

    def guided_outputs(self, z: Tensor, u: Tensor, target: Optional[Tensor], kls: list[Tensor],
                       labels: Tensor) -> dict[str, Tensor]:
        """The heads on the last guided state z; in training also the Q-halt decode (prior-guided
        from the last proposal u, with ``halt_decode: prior``) and the KL terms."""
        outputs = self.heads(z)
        if target is None:
            return outputs
        if self.config.halt_decode == "prior" and not self.prior_match_on:  # else prior_match_outputs
            with torch.no_grad():
                outputs["halt_logits"] = self.heads(self.perturb(u, self.prior_head(u)))["logits"]
        outputs.update(self.kl_outputs(torch.stack(kls), labels))
        return outputs

    def prior_match_outputs(self, z: Tensor) -> dict[str, Tensor]:
        """The decode of a prior-guided training pass's last state z, with gradient, for
        ``losses.matched_answer_loss``; it is also the Q-halt decode with ``halt_decode: prior``."""
        logits = self.heads(z)["logits"]
        # copies, not aliases: a compiled core rebuilds an output that aliases another output or a
        # buffer by replaying its views, which failed in CI with a garbage shape (torch 2.13, CPU
        # inductor, the replay of `_unsafe_view, detach` for halt_logits)
        outputs = {"prior_logits": logits, "prior_weight": self.prior_weight.clone()}
        if self.config.halt_decode == "prior":
            outputs["halt_logits"] = logits.detach().clone()
        return outputs

    def guide(self, u: Tensor, target: Optional[Tensor], charge: bool) -> tuple[Tensor, Optional[Tensor]]:
        """z_H = u + noise_scale * proj(eps), eps from the posterior with a target (training) or
        the prior; with ``charge``, also the per-row balanced KL(q || p) [B]."""
        posterior = None if target is None else self.posterior_head(torch.cat([u, target], dim=-1))
        prior = self.prior_head(u) if posterior is None or charge else None
        if posterior is None:  # a sample: in eval mode at the sampling temperature
            return self.perturb(u, prior, 1.0 if self.training else self.sample_temperature), None
        z_H = self.perturb(u, posterior)
        if not charge:
            return z_H, None
        return z_H, gaussian_kl(*posterior, *prior, balance=self.config.kl_balance)

    def perturb(self, u: Tensor, gaussian: Gaussian, temperature: float = 1.0) -> Tensor:
        """u + noise_scale * proj(eps) with eps a reparameterised draw from ``gaussian``, its
        standard deviation times ``temperature``."""
        mean, logvar = gaussian
        eps = mean + temperature * torch.exp(0.5 * logvar) * torch.randn_like(mean)  # [B, T or 1, latent] float32
        return u + self.noise_scale * self.noise_proj(eps.to(u.dtype))

    def schedule(self, step: int) -> None:
        """Sets the KL's weight and whether the prior match runs, for training step ``step`` (the
        training loop calls it)."""
        self.kl_weight.fill_(kl_coef_at(self.config, step))
        self.prior_match_on = prior_match_on(self.config, step)

    def kl_outputs(self, kls: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """The loss term and the logged KLs from the charged transitions' KLs [N, B] (nats).

        ``aux_loss`` = kl_coef * sum_b (sum_n KL[n, b]) / scale_b, where scale_b is 1 ("sum") or
        row b's supervised tokens ("token_mean", the per-token scale of lm_loss)."""
        per_row = kls.sum(0)  # [B]
        if self.config.kl_reduction == "token_mean":
            per_row = per_row / (labels != IGNORE_LABEL_ID).sum(-1).clamp_min(1)
        return {
            "aux_loss": self.kl_weight * per_row.sum(),
            "kl": kls.detach().sum(),  # summed over transitions and rows
            "kl_first": kls[0].detach().sum(),
            "kl_last": kls[-1].detach().sum(),
        }


class GRAM(Guided, TRM):
    """GRAM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    def core(self, state: State, x: Tensor, labels: Tensor) -> tuple[State, dict[str, Tensor]]:
        if self.noise_scale == 0:
            return super().core(state, x, labels)
        rope = self.rope(x.shape[1])
        target = self.training_target(labels, x)
        kls: list[Tensor] = []  # per-row balanced KL [B] of each charged transition
        z_H, z_L, u = self.transitions(state["z_H"], state["z_L"], x, rope, target, kls)
        outputs = self.guided_outputs(z_H, u, target, kls, labels)
        if target is not None and self.prior_match_on:
            prior_z_H = self.transitions(state["z_H"], state["z_L"], x, rope, None, [])[0]
            outputs.update(self.prior_match_outputs(prior_z_H))
        return {"z_H": z_H, "z_L": z_L}, outputs

    def transitions(self, z_H: Tensor, z_L: Tensor, x: Tensor, rope: Rope, target: Optional[Tensor],
                    kls: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """One segment's h_cycles guided transitions: posterior-guided with a target, else the
        prior; returns z_H, z_L and the last proposal u."""
        for _ in range(self.config.h_cycles - 1):
            with torch.no_grad():
                u, z_L = self.cycle(z_H, z_L, x, rope)
            z_H = self.free_transition(u, target, kls)
        u, z_L = self.cycle(z_H, z_L, x, rope)
        return self.graded_transition(u, target, kls), z_L, u
