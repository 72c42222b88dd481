"""Training losses: stablemax / softmax cross-entropy, the ACT loss head, GRAM's objective and its
Gaussian KL.

`act_loss` reproduces the official HRM/TRM/URM `ACTLossHead` term by term, so losses and
metrics are comparable with the papers' numbers:

    lm_loss     = sum_b (sum_t token_loss[b, t] / max(#valid[b], 1))
    q_halt_loss = sum_b BCE(q_halt_logits[b], sequence b exactly correct)
    q_continue  = sum_b BCE(q_continue_logits[b], target_q_continue[b])   (when the model gives it)
    total       = lm_loss + 0.5 * (q_halt_loss + q_continue_loss)

`guided_loss` is GRAM's: the same terms, its Q-halt label judged on a prior-guided decode, plus
the model's KL term (`aux_loss`) and its prior match (`prior_weight * matched_answer_loss`).

Every loss and metric is a SUM over rows (not a mean) so that a data-parallel caller can
all-reduce them and divide once: loss metrics by the global batch size, the other metrics by
the all-reduced `count`.
"""

from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from urm_ray.errors import ConfigError

IGNORE_LABEL_ID = -100

# Guards 1 / (1 - x) in stablemax; same constant as the official code so losses match bitwise.
_STABLEMAX_EPS = 1e-30


def _stablemax_s(x: Tensor) -> Tensor:
    """s(x) = x + 1 for x >= 0, 1 / (1 - x) for x < 0: a positive, linearly growing softmax substitute."""
    return torch.where(x < 0, 1 / (1 - x + _STABLEMAX_EPS), x + 1)


def _gather_label_logprobs(logprobs: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """Pick log p[label] per token; 0 where the label is ignored.  [B, L, V] -> [B, L]."""
    valid = labels != ignore_index  # [B, L]
    safe_labels = torch.where(valid, labels, 0).to(torch.long)
    picked = torch.gather(logprobs, -1, safe_labels.unsqueeze(-1)).squeeze(-1)  # [B, L]
    return torch.where(valid, picked, 0)


def stablemax_cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = IGNORE_LABEL_ID) -> Tensor:
    """Per-token stablemax cross-entropy [B, L] in float64 (0 at ignored tokens).

    log p_c = log(s(x_c) / sum_j s(x_j)), computed on logits cast to float64 as the official code does.
    """
    s_x = _stablemax_s(logits.to(torch.float64))  # [B, L, V]
    logprobs = torch.log(s_x / s_x.sum(dim=-1, keepdim=True))
    return -_gather_label_logprobs(logprobs, labels, ignore_index)


def softmax_cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int = IGNORE_LABEL_ID) -> Tensor:
    """Per-token softmax cross-entropy [B, L] in float32 (0 at ignored tokens)."""
    flat_logits = logits.to(torch.float32).reshape(-1, logits.shape[-1])  # [B*L, V]
    flat_labels = labels.to(torch.long).reshape(-1)
    losses = F.cross_entropy(flat_logits, flat_labels, ignore_index=ignore_index, reduction="none")
    return losses.view(labels.shape)


LOSS_FUNCTIONS: dict[str, Callable[..., Tensor]] = {
    "stablemax": stablemax_cross_entropy,
    "softmax": softmax_cross_entropy,
}


def token_loss_fn(loss_type: str) -> Callable[..., Tensor]:
    """Look up a per-token loss by name ("stablemax" or "softmax")."""
    if loss_type not in LOSS_FUNCTIONS:
        raise ConfigError(f"loss_type={loss_type!r} must be one of {sorted(LOSS_FUNCTIONS)}")
    return LOSS_FUNCTIONS[loss_type]


def _answer_exact(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """[B] bool: the argmax answer equals the label at every supervised token."""
    return ((logits.argmax(-1) == labels) | (labels == ignore_index)).all(-1)


def _act_metrics(
    outputs: dict[str, Tensor], labels: Tensor, halted: Tensor, steps: Tensor, ignore_index: int
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence correctness [B] bool and the row-summed metrics over halted rows with a target."""
    logits = outputs["logits"]
    valid = labels != ignore_index  # [B, L]
    num_valid = valid.sum(-1)  # [B]
    is_correct = valid & (logits.argmax(-1) == labels)  # [B, L]
    seq_is_correct = is_correct.sum(-1) == num_valid  # [B]; rows without targets count as correct
    counted = halted & (num_valid > 0)  # [B] rows whose episode ended this segment
    token_acc = is_correct.to(torch.float32).sum(-1) / num_valid.clamp_min(1)  # [B]
    q_halt_right = (outputs["q_halt_logits"] >= 0) == seq_is_correct
    metrics = {
        "count": counted.sum(),
        "accuracy": torch.where(counted, token_acc, 0).sum(),
        "exact_accuracy": (counted & seq_is_correct).sum(),
        "q_halt_accuracy": (counted & q_halt_right).sum(),
        # ACT segments each finished episode ran (train/act_segments: their mean over those episodes)
        "act_segments": torch.where(counted, steps, 0).sum(),
    }
    return seq_is_correct, {k: v.to(torch.float32) for k, v in metrics.items()}


def per_row(metric: str) -> bool:
    """Whether the loss's ``metric`` is a sum over every row of the batch (the losses, GRAM's KL
    and prior match), rather than over the rows that halted this segment (the accuracies, the
    segments): how a training report averages it."""
    return metric.endswith("_loss") or metric.startswith(("kl", "prior_"))


def act_loss(
    outputs: dict[str, Tensor],
    labels: Tensor,
    halted: Tensor,
    steps: Tensor,
    loss_type: str = "stablemax",
    ignore_index: int = IGNORE_LABEL_ID,
    halt_target: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one ACT segment and its metrics, exactly as the official ACTLossHead.

    outputs: the model's dict (`logits` [B, L, V], `q_halt_logits` [B], `q_continue_logits` [B],
        optional `target_q_continue` [B]). labels: [B, L] with `ignore_index` for no target.
    halted, steps: the new carry's flags [B] bool and step counters [B]; metrics cover only
        halted rows (finished episodes) that have at least one target token.
    halt_target: optional [B] bool to replace "sequence exactly correct" as the Q-halt label
        (e.g. a verifier that accepts any valid solution).

    Returns (total loss scalar, metrics). Metrics are detached float32 sums over rows:
    `count`, `accuracy` (sum of per-row token accuracy), `exact_accuracy`, `q_halt_accuracy`,
    `act_segments`, `lm_loss`, `q_halt_loss`, and when the target is present `q_continue_loss`.
    """
    with torch.no_grad():
        seq_is_correct, metrics = _act_metrics(outputs, labels, halted, steps, ignore_index)
        divisor = (labels != ignore_index).sum(-1).clamp_min(1).unsqueeze(-1)  # [B, 1]
    target = seq_is_correct if halt_target is None else halt_target
    q_halt_logits = outputs["q_halt_logits"]
    lm_loss = (token_loss_fn(loss_type)(outputs["logits"], labels, ignore_index=ignore_index) / divisor).sum()
    q_halt_loss = F.binary_cross_entropy_with_logits(q_halt_logits, target.to(q_halt_logits.dtype), reduction="sum")
    metrics["lm_loss"] = lm_loss.detach().to(torch.float32)
    metrics["q_halt_loss"] = q_halt_loss.detach().to(torch.float32)
    q_loss = q_halt_loss
    if "target_q_continue" in outputs:
        q_continue_loss = F.binary_cross_entropy_with_logits(
            outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum"
        )
        metrics["q_continue_loss"] = q_continue_loss.detach().to(torch.float32)
        q_loss = q_loss + q_continue_loss
    return lm_loss + 0.5 * q_loss, metrics


def guided_loss(
    outputs: dict[str, Tensor],
    labels: Tensor,
    halted: Tensor,
    steps: Tensor,
    loss_type: str = "stablemax",
    ignore_index: int = IGNORE_LABEL_ID,
    halt_target: Optional[Tensor] = None,
    prior_targets: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRAM's objective of one ACT segment: ``act_loss`` plus the model's KL term and its prior match.

    outputs: ``act_loss``'s, plus `aux_loss` (kl_coef * balanced KL, summed over rows, added as
        is) with its detached `kl*` scalars; optional `halt_logits` [B, L, V], the prior-guided
        decode the Q-halt label judges where no ``halt_target`` is given; optional
        `prior_logits` [B, L, V] with `prior_weight`: ``prior_weight * matched_answer_loss``
        towards ``prior_targets`` [B, L] (a task's search, or the matched labels; required then).

    Returns (total, metrics): ``act_loss``'s metrics, `aux_loss` and the `kl*` sums (over ALL
    rows, like the losses), and with a prior match `prior_match_loss` and `prior_exact`.
    """
    if halt_target is None and "halt_logits" in outputs:  # the Q-head judges the prior's decode
        with torch.no_grad():
            halt_target = _answer_exact(outputs["halt_logits"], labels, ignore_index)
    total, metrics = act_loss(outputs, labels, halted, steps, loss_type, ignore_index, halt_target)
    if "aux_loss" in outputs:  # none where the model's guidance is off (model.noise_scale=0)
        total = total + outputs["aux_loss"]
        metrics["aux_loss"] = outputs["aux_loss"].detach().to(torch.float32)
        for key in (k for k in outputs if k.startswith("kl")):  # kl, kl_first, kl_last
            metrics[key] = outputs[key].detach().to(torch.float32)
    if "prior_logits" in outputs:
        if prior_targets is None:
            raise ValueError("a prior_logits output needs its targets (guided_loss(..., prior_targets=...))")
        prior_loss, exact = matched_answer_loss(outputs["prior_logits"], prior_targets, loss_type, ignore_index)
        total = total + outputs["prior_weight"] * prior_loss
        metrics["prior_match_loss"] = prior_loss.detach().to(torch.float32)
        metrics["prior_exact"] = exact.to(torch.float32)
    return total, metrics


def matched_answers(answers: Tensor, inputs: Tensor, labels: Tensor,
                    ignore_index: int = IGNORE_LABEL_ID) -> tuple[Tensor, Tensor]:
    """Each row's target: a label of the batch rows with the same input, matched one to one.

    answers, inputs, labels: [B, L]. Within each group of rows with the same input, answers and
    labels are paired by a minimum-cost perfect matching (cost = supervised tokens that differ;
    a row's own label is preferred among equals). On a multi-solution task (the blank board with
    many labels) every sampled answer moves towards a solution it is close to, and the samples
    together towards all the group's solutions: nearest-label targets alone let them all settle
    on one. A row alone with its input gets its own label.
    Returns (targets [B, L], distance [B] of each answer to its target: 0 where they are equal).
    The matching runs on the host (scipy): the costs and the inputs come over in one copy, so a
    step on a GPU waits for it once.
    """
    from scipy.optimize import linear_sum_assignment  # on first use: most processes never match

    rows = len(labels)
    supervised = labels != ignore_index  # [B, L]
    distance = ((answers.unsqueeze(1) != labels.unsqueeze(0)) & supervised.unsqueeze(0)).sum(-1)  # [B, B]
    cost = 2 * distance - torch.eye(rows, dtype=distance.dtype, device=distance.device)
    host = torch.cat([cost.long(), inputs.long()], dim=1).cpu().numpy()  # [B, B + L]
    cost_np, group_np = host[:, :rows], np.unique(host[:, rows:], axis=0, return_inverse=True)[1].reshape(-1)
    match = np.arange(rows)
    for members in (np.flatnonzero(group_np == g) for g in np.unique(group_np)):
        if len(members) > 1:
            pairs, cols = linear_sum_assignment(cost_np[np.ix_(members, members)])
            match[members[pairs]] = members[cols]
    matched = torch.as_tensor(match, device=labels.device)
    return labels[matched], distance.gather(1, matched.unsqueeze(1)).squeeze(1)


def matched_answer_loss(logits: Tensor, targets: Tensor, loss_type: str,
                        ignore_index: int = IGNORE_LABEL_ID) -> tuple[Tensor, Tensor]:
    """Per-token-mean loss of ``logits`` [B, L, V] towards each row's target [B, L] (a task's
    search, or ``matched_answers``), summed over rows, and the count of rows whose argmax equals
    it at every supervised token."""
    targets = targets.to(logits.device, torch.long)
    with torch.no_grad():
        exact = _answer_exact(logits, targets, ignore_index).sum()
    divisor = (targets != ignore_index).sum(-1).clamp_min(1)
    loss = (token_loss_fn(loss_type)(logits, targets, ignore_index=ignore_index).sum(-1) / divisor).sum()
    return loss, exact


def _diag_gaussian_kl(mu_q: Tensor, logvar_q: Tensor, mu_p: Tensor, logvar_p: Tensor) -> Tensor:
    """Elementwise KL(N(mu_q, e^logvar_q) || N(mu_p, e^logvar_p)), same shape as the inputs."""
    var_ratio = torch.exp(logvar_q - logvar_p)
    mean_term = (mu_q - mu_p).square() * torch.exp(-logvar_p)
    return 0.5 * (var_ratio + mean_term - 1 - (logvar_q - logvar_p))


def gaussian_kl(
    mu_q: Tensor, logvar_q: Tensor, mu_p: Tensor, logvar_p: Tensor, balance: Optional[float] = None,
) -> Tensor:
    """Per-row KL(q || p) [B] of diagonal Gaussians, summed over every non-batch axis.

    All inputs are [B, ...] (e.g. [B, L, latent_dim]); computed in float32.
    balance=None: the plain KL, whose gradient reaches both q and p.
    balance=alpha in [0, 1] (KL balancing, DreamerV2 / GRAM's kl_balance=0.8):
        alpha * KL(sg(q) || p) + (1 - alpha) * KL(q || sg(p)),
    the same value, but a fraction alpha of the gradient trains the prior towards the
    posterior and only 1 - alpha pulls the posterior towards the prior (against collapse).
    """
    mu_q, logvar_q, mu_p, logvar_p = (t.to(torch.float32) for t in (mu_q, logvar_q, mu_p, logvar_p))
    if balance is None:
        return _diag_gaussian_kl(mu_q, logvar_q, mu_p, logvar_p).flatten(1).sum(-1)
    if not 0.0 <= balance <= 1.0:
        raise ConfigError(f"kl balance={balance} must be in [0, 1]")
    to_prior = _diag_gaussian_kl(mu_q.detach(), logvar_q.detach(), mu_p, logvar_p).flatten(1).sum(-1)
    to_posterior = _diag_gaussian_kl(mu_q, logvar_q, mu_p.detach(), logvar_p.detach()).flatten(1).sum(-1)
    return balance * to_prior + (1 - balance) * to_posterior
