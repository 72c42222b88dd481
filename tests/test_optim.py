"""Tests for urm_ray.optim: AdamAtan2 vs its formula, Muon, puzzle-embedding sign-SGD, lr schedule, EMA, config."""

import math
import warnings

import pytest
import torch
from torch import nn

from urm_ray.errors import ConfigError
from urm_ray.models.layers import PuzzleEmbedding
from urm_ray.optim import (
    EMA,
    AdamAtan2,
    Muon,
    OptimConfig,
    SignSGDPuzzleEmbedding,
    apply_scheduled_lr,
    build_muon,
    build_optimizers,
    lr_at,
    newton_schulz_orthogonalize,
    unwrap_model,
)

from ranks import run_ranks


def _adam_atan2_reference(p0, grads, lrs, beta1, beta2, wd):
    """The adam-atan2 CUDA kernel's update written out element by element in Python floats
    (float64): the bias correction of m scales the step, outside atan2."""
    p, m, v = list(p0), [0.0] * len(p0), [0.0] * len(p0)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        for i in range(len(p)):
            p[i] *= 1 - lr * wd
            m[i] = beta1 * m[i] + (1 - beta1) * g[i]
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] ** 2
            step_size = lr / (1 - beta1**t)
            denom = math.sqrt(v[i]) / math.sqrt(1 - beta2**t)
            p[i] -= step_size * math.atan2(m[i], denom)
    return p


def test_adam_atan2_matches_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(6, generator=gen, dtype=torch.float64)
    grads = [torch.randn(6, generator=gen, dtype=torch.float64) * 1e-3 for _ in range(5)]
    grads[2][0] = 0.0  # atan2(0, 0) = 0 on a zero history would be wrong; here m, v are non-zero
    lrs = [1e-2, 2e-2, 3e-2, 3e-2, 1e-2]  # a schedule changes lr between steps
    param = nn.Parameter(p0.clone())
    opt = AdamAtan2([param], lr=lrs[0], betas=(0.9, 0.95), weight_decay=0.1)
    for g, lr in zip(grads, lrs):
        opt.param_groups[0]["lr"] = lr
        param.grad = g.clone()
        opt.step()
    expected = _adam_atan2_reference(p0.tolist(), [g.tolist() for g in grads], lrs, 0.9, 0.95, 0.1)
    torch.testing.assert_close(param.detach(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-14)
    assert opt.state[param]["step"].item() == 5


def test_adam_atan2_first_step_is_the_kernels() -> None:
    """Step 1: m = 0.1 g, sqrt(v) / sqrt(1 - beta2) = |g|, so the move is lr * atan2(0.1, 1) / 0.1
    = 0.997 lr against the sign of g, whatever its size (0.785 lr if m were corrected inside)."""
    param = nn.Parameter(torch.zeros(4))
    param.grad = torch.tensor([3.0, -1e-6, 0.0, 5e4])
    AdamAtan2([param], lr=0.1, betas=(0.9, 0.95), weight_decay=0.0).step()
    move = 0.1 * math.atan2(0.1, 1.0) / 0.1
    expected = -move * torch.tensor([1.0, -1.0, 0.0, 1.0])
    torch.testing.assert_close(param.detach(), expected)
    assert 0.996 < move / 0.1 < 0.998


def test_adam_atan2_minimises_quadratic_and_handles_bfloat16() -> None:
    target = torch.tensor([1.0, -2.0, 0.5])
    x = nn.Parameter(torch.zeros(3))
    y = nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    opt = AdamAtan2([x, y], lr=0.05, weight_decay=0.0)
    for _ in range(300):
        opt.zero_grad()
        ((x - target) ** 2).sum().backward()
        ((y.float() - target) ** 2).sum().backward()
        opt.step()
    assert (x - target).abs().max() < 0.05
    assert y.dtype == torch.bfloat16 and (y.float() - target).abs().max() < 0.1


def test_newton_schulz_orthogonalises() -> None:
    g = torch.randn(8, 20, generator=torch.Generator().manual_seed(0))
    for update in (g, g.T):
        singular_values = torch.linalg.svdvals(newton_schulz_orthogonalize(update))
        assert singular_values.min() > 0.5 and singular_values.max() < 1.3


def test_muon_reduces_loss_and_rejects_vectors() -> None:
    target = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    w = nn.Parameter(torch.zeros(8, 16))
    opt = Muon([w], lr=0.1, weight_decay=0.0)
    for _ in range(80):
        w.grad = 2 * (w.detach() - target)  # gradient of ||w - target||^2
        opt.step()
    assert ((w - target) ** 2).sum() < 0.1 * (target**2).sum()
    with pytest.raises(ValueError, match="2-D"):
        Muon([nn.Parameter(torch.zeros(3))])


def test_build_muon_splits_matrices_from_the_rest() -> None:
    model = nn.Sequential(nn.Linear(4, 5), nn.Conv1d(5, 5, 2, groups=5))
    muon, adamw = build_muon(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    assert [p.shape for p in muon.param_groups[0]["params"]] == [(5, 4)]
    assert len(adamw.param_groups[0]["params"]) == 3  # linear bias, conv weight [5, 1, 2], conv bias


def random_embedding(num_ids: int, dim: int) -> PuzzleEmbedding:
    """A real PuzzleEmbedding with a random table (a fresh one is all zeros)."""
    emb = PuzzleEmbedding(num_ids, dim)
    emb.weights.copy_(torch.randn(num_ids, dim, generator=torch.Generator().manual_seed(0)))
    return emb


def test_sign_sgd_updates_only_touched_rows() -> None:
    emb = random_embedding(6, 3)
    before = emb.weights.clone()
    ids = torch.tensor([1, 4, 1, 3])
    coeffs = torch.tensor([[1.0, -2.0, 0.0], [0.5, 0.5, -1.0], [-3.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    (emb(ids) * coeffs).sum().backward()  # grad of row b is coeffs[b]
    opt = SignSGDPuzzleEmbedding(emb, lr=0.1, weight_decay=0.5)
    opt.step()
    sign = torch.zeros(6, 3)
    sign[1] = torch.tensor([-1.0, -1.0, 0.0])  # rows 0 and 2 summed: [-2, -1, 0]
    sign[4] = torch.tensor([1.0, 1.0, -1.0])
    sign[3] = torch.tensor([0.0, 0.0, 1.0])
    touched = torch.tensor([False, True, False, True, True, False])
    expected = torch.where(touched.unsqueeze(-1), before * (1 - 0.1 * 0.5) - 0.1 * sign, before)
    torch.testing.assert_close(emb.weights, expected)
    opt.zero_grad()
    assert emb.local_weights.grad is None
    opt.step()  # no gradient: nothing changes
    torch.testing.assert_close(emb.weights, expected)


def _sign_sgd_by_unique(weights: torch.Tensor, ids: torch.Tensor, grads: torch.Tensor, lr: float,
                        wd: float) -> torch.Tensor:
    """The update written with ``unique`` (a host sync on CUDA: its output size is the data's)."""
    unique_ids, inverse = ids.unique(return_inverse=True)
    summed = torch.zeros(len(unique_ids), grads.shape[-1], dtype=grads.dtype).index_add_(0, inverse, grads)
    out = weights.clone()
    out[unique_ids] = out[unique_ids].mul_(1 - lr * wd).add_(torch.sign(summed).to(out.dtype), alpha=-lr)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sign_sgd_equals_the_update_by_unique_ids_bit_for_bit(dtype: torch.dtype) -> None:
    """Random ids with many repeats, and gradient rows of which many nearly cancel (where two meet
    on an id, the sign of the sum depends on the order the rows are added in)."""
    gen = torch.Generator().manual_seed(4)
    for trial in range(5):
        emb = random_embedding(60, 8)
        table = emb.weights.to(dtype)
        ids = torch.randint(0, 12 + 10 * trial, (64,), generator=gen)
        grads = torch.randn(64, 8, generator=gen, dtype=dtype)
        grads[1::2] = -grads[::2] + torch.randn(32, 8, generator=gen, dtype=dtype) * 1e-6
        emb.local_ids, emb.local_weights = ids, torch.zeros(64, 8, dtype=dtype, requires_grad=True)
        emb.local_weights.grad = grads
        emb.weights = table.clone()
        SignSGDPuzzleEmbedding(emb, lr=0.1, weight_decay=0.5).step()
        assert torch.equal(emb.weights, _sign_sgd_by_unique(table, ids, grads, 0.1, 0.5))


def _sign_sgd_and_ddp_rank(rank: int, world_size: int) -> tuple:
    emb = random_embedding(5, 2)
    ids = torch.tensor([[0, 2], [2, 3]])[rank]
    grads = torch.tensor([[[1.0, -1.0], [1.0, 1.0]], [[-3.0, 1.0], [1.0, 0.0]]])[rank]
    (emb(ids) * grads).sum().backward()
    SignSGDPuzzleEmbedding(emb, lr=0.1, weight_decay=0.0).step()
    model = nn.Linear(2, 2)
    ddp = nn.parallel.DistributedDataParallel(model)
    ema = EMA(ddp, decay=0.5)
    return emb.weights.clone(), unwrap_model(ddp) is model, sorted(ema.shadow)


def test_sign_sgd_all_gathers_across_ranks_and_ema_unwraps_ddp(tmp_path) -> None:
    results = run_ranks(_sign_sgd_and_ddp_rank, world_size=2, folder=tmp_path)
    before = random_embedding(5, 2).weights
    step = torch.zeros(5, 2)
    step[0] = torch.tensor([1.0, -1.0])  # only rank 0 saw id 0
    step[2] = torch.tensor([-1.0, 1.0])  # [1, 1] + [-3, 1] summed over both ranks
    step[3] = torch.tensor([1.0, 0.0])
    for rank in range(2):
        weights, unwrapped, names = results[rank]
        torch.testing.assert_close(weights, before - 0.1 * step)
        assert unwrapped and names == ["bias", "weight"]


def test_lr_schedule() -> None:
    kwargs = dict(base_lr=1.0, warmup_steps=10, total_steps=110)
    assert lr_at(0, **kwargs) == 0.0
    assert lr_at(5, **kwargs) == 0.5
    assert lr_at(10, **kwargs) == 1.0
    assert lr_at(60, **kwargs, kind="cosine") == pytest.approx(0.5)
    assert lr_at(110, **kwargs, kind="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_at(500, **kwargs, kind="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_at(60, **kwargs, kind="cosine", min_ratio=1.0) == 1.0
    assert lr_at(500, **kwargs, kind="constant") == 1.0
    assert lr_at(0, 1.0, 0, 100) == 1.0  # no warm-up


def test_ema_math_copy_and_state_dict() -> None:
    model = nn.Linear(2, 1)
    nn.init.constant_(model.weight, 1.0)
    ema = EMA(model, decay=0.9)
    for value in (2.0, 3.0):
        nn.init.constant_(model.weight, value)
        ema.update(model)
    expected = 0.9 * (0.9 * 1.0 + 0.1 * 2.0) + 0.1 * 3.0
    torch.testing.assert_close(ema.shadow["weight"], torch.full((1, 2), expected))
    bias = model.bias.detach().clone()
    with ema.applied(nn.DataParallel(model)) as averaged:
        assert averaged is model  # no copy of the model (nor of its buffers)
        torch.testing.assert_close(model.weight, torch.full((1, 2), expected))
    assert (model.weight == 3.0).all() and torch.equal(model.bias, bias)  # training weights back
    with pytest.raises(RuntimeError, match="inside"), ema.applied(model):
        raise RuntimeError("inside")
    assert (model.weight == 3.0).all()  # put back after an error too
    restored = EMA(nn.Linear(2, 1), decay=0.5)
    restored.load_state_dict(ema.state_dict())
    assert restored.decay == 0.9
    restored.copy_to(model)
    torch.testing.assert_close(model.weight, torch.full((1, 2), expected))
    with pytest.raises(KeyError, match="missing"):
        EMA(nn.Bilinear(2, 2, 1)).load_state_dict({"decay": 0.9, "shadow": {"weight": torch.zeros(1, 2)}})


def test_config_errors_and_warnings() -> None:
    with pytest.raises(ConfigError, match=r"optim\.lr=-1 must be > 0"):
        OptimConfig(lr=-1)
    with pytest.raises(ConfigError, match=r"optim\.beta2=1\.0"):
        OptimConfig(beta2=1.0)
    with pytest.raises(ConfigError, match=r"optim\.optimizer='sgd'"):
        OptimConfig(optimizer="sgd")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="min_lr_ratio=0.5 has no effect"):
        OptimConfig(min_lr_ratio=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OptimConfig(schedule="cosine", min_lr_ratio=0.5, optimizer="muon", muon_momentum=0.9)


class TinyModel(nn.Module):
    def __init__(self, puzzle_dim: int = 3):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.puzzle_emb = random_embedding(4, puzzle_dim)


def test_build_optimizers_and_schedule() -> None:
    cfg = OptimConfig(warmup_steps=10)
    optimizers = build_optimizers(TinyModel(), cfg)
    assert [type(o) for o in optimizers] == [AdamAtan2, SignSGDPuzzleEmbedding]
    assert apply_scheduled_lr(optimizers, cfg, step=5, total_steps=100) == pytest.approx(0.5 * cfg.lr)
    assert optimizers[1].param_groups[0]["lr"] == pytest.approx(0.5 * cfg.puzzle_emb_lr)
    muon_cfg = OptimConfig(optimizer="muon")
    assert [type(o) for o in build_optimizers(TinyModel(puzzle_dim=0), muon_cfg)] == [Muon, torch.optim.AdamW]
