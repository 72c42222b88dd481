"""Building blocks: init statistics, RMSNorm, RoPE, attention, (Conv)SwiGLU causality, puzzle embedding,
and the hand-written backward passes of ``urm_ray.models.fused``."""

import pytest
import torch
import torch.nn.functional as F

from urm_ray.models.layers import (
    Attention,
    ConvSwiGLU,
    PLAIN_ATTENTION_BELOW,
    PuzzleEmbedding,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
    attend,
    ffn_width,
    trunc_normal_,
)
from urm_ray.models import fused


@pytest.mark.parametrize(("hidden", "expansion", "width"), [(32, 4.0, 256), (64, 4.0, 256), (512, 4.0, 1536),
                                                            (384, 4.0, 1024), (512, 2.0, 768)])
def test_ffn_width_rounds_up_to_256(hidden, expansion, width):
    assert ffn_width(hidden, expansion) == width


def test_trunc_normal_has_the_requested_std_and_bounds():
    torch.manual_seed(0)
    x = trunc_normal_(torch.empty(200_000), std=0.5)
    assert x.std().item() == pytest.approx(0.5, rel=0.01)
    assert x.abs().max().item() <= 2 * 0.5 / 0.8796 + 1e-6
    assert not trunc_normal_(torch.empty(10), std=0.0).any()


def test_rms_norm_is_parameter_free_and_keeps_dtype():
    norm = RMSNorm(1e-5)
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    y = norm(x)
    assert list(norm.parameters()) == [] and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float().square().mean(-1), torch.ones(3, 5), rtol=2e-2, atol=2e-2)


def test_rope_is_a_half_split_rotation_and_not_saved():
    rope = RotaryEmbedding(head_dim=8, max_positions=6, theta=10000.0)
    assert rope.state_dict() == {}
    x = torch.randn(1, 6, 2, 8)  # [B, T, H, E]
    pairs = torch.complex(x[..., :4], x[..., 4:])  # dims i and i + E/2 form one rotating pair
    angles = torch.arange(6.0)[:, None] / 10000.0 ** (torch.arange(0, 8, 2) / 8)  # [T, E/2]
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)[:, None]
    torch.testing.assert_close(apply_rope(x, rope()), torch.cat([rotated.real, rotated.imag], -1))


def test_attention_is_bidirectional():
    torch.manual_seed(0)
    attn = Attention(hidden_size=16, num_heads=2)
    rope = RotaryEmbedding(8, 5, 10000.0)()
    x = torch.randn(1, 5, 16)
    y = x.clone()
    y[:, -1] += 1.0
    assert not torch.allclose(attn(x, rope)[:, 0], attn(y, rope)[:, 0])


@pytest.mark.parametrize("position", ["after_gate", "before_gate"])
@pytest.mark.parametrize("kernel", [2, 3])
def test_conv_swiglu_is_causal(position, kernel):
    torch.manual_seed(0)
    mlp = ConvSwiGLU(16, 4.0, kernel, position)
    x = torch.randn(2, 7, 16)
    y = x.clone()
    y[:, 4:] += torch.randn(2, 3, 16)
    torch.testing.assert_close(mlp(x)[:, :4], mlp(y)[:, :4])
    assert not torch.allclose(mlp(x)[:, 4], mlp(y)[:, 4])


def test_conv_swiglu_matches_the_two_tap_formula():
    torch.manual_seed(0)
    mlp = ConvSwiGLU(16, 4.0, 2, "after_gate")
    x = torch.randn(2, 5, 16)
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    u = torch.nn.functional.silu(gate) * up  # [B, T, F]
    previous = torch.nn.functional.pad(u, (0, 0, 1, 0))[:, :-1]  # u[t-1], zero at t = 0
    w = mlp.dwconv.weight[:, 0]  # [F, 2]
    conv = w[:, 0] * previous + w[:, 1] * u + mlp.dwconv.bias
    torch.testing.assert_close(mlp(x), mlp.down_proj(torch.nn.functional.silu(conv)), rtol=1e-5, atol=1e-5)


def test_puzzle_embedding_train_copy_and_eval_table():
    emb = PuzzleEmbedding(num_ids=4, dim=3)
    emb.weights.copy_(torch.arange(12.0).view(4, 3))
    ids = torch.tensor([2, 0, 2], dtype=torch.int32)
    emb.eval()
    assert torch.equal(emb(ids), emb.weights[[2, 0, 2]]) and emb.local_weights is None
    emb.train()
    out = emb(ids)
    assert out is emb.local_weights and out.is_leaf and out.requires_grad
    assert torch.equal(emb.local_ids, ids.long())
    out.sum().backward()
    assert torch.equal(emb.local_weights.grad, torch.ones(3, 3)) and emb.weights.grad is None
    with torch.no_grad():  # e.g. HRM's target pass: must not replace the rows holding the gradient
        emb(torch.tensor([1, 1, 1]))
    assert out is emb.local_weights
    assert set(emb.state_dict()) == {"weights"}


def test_attention_runs_in_float32_under_cpu_bf16_autocast():
    """CPU bf16 autocast would run attention (and its slow backward) in bf16; attend keeps it float32."""
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(q, k, v)
        in_bf16 = F.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.float32 and in_bf16.dtype == torch.bfloat16
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert q.grad.dtype == torch.bfloat16 and q.grad.abs().sum() > 0


@pytest.mark.parametrize("length", [5, 82, PLAIN_ATTENTION_BELOW - 1, PLAIN_ATTENTION_BELOW, 200])
def test_cpu_attention_equals_sdpa_plain_below_the_threshold_and_sdpa_itself_from_it(length: int):
    """Below ``PLAIN_ATTENTION_BELOW`` positions attend computes plain attention on CPU: SDPA's
    values and gradients up to float rounding, not bit for bit; from it on, SDPA itself."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, length, 16, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 4, length, 16)
    out = attend(q, k, v)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    expected = F.scaled_dot_product_attention(q, k, v)
    theirs = torch.autograd.grad(expected, (q, k, v), grad)
    exact = length >= PLAIN_ATTENTION_BELOW
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out, expected, **tol)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **tol)


# The hand-written Functions of urm_ray.models.fused against autograd of their plain formulas
def _rms_formula(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope_formula(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return (torch.cat([x1, x2], -1) * cos + torch.cat([x2, x1], -1) * signed_sin).to(x.dtype)


def _conv_formula(u: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """nn.functional.conv1d, depthwise, padded k-1 on the left, in the promoted dtype."""
    kernel = taps.shape[1]
    padded = F.pad(u.to(torch.promote_types(u.dtype, taps.dtype)).transpose(1, 2), (kernel - 1, 0))
    return F.conv1d(padded, taps.unsqueeze(1), bias, groups=taps.shape[0]).transpose(1, 2)


def _gated_conv_formula(gate_up: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(_conv_formula(F.silu(gate) * up, taps, bias).to(dtype))


def _gate_formula(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _fused_cases(dtype: torch.dtype) -> list:
    """(name, Function, formula, inputs) with inputs that need gradients; the rope input is a
    strided view, as queries and keys are views of the qkv projection."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()

    rope = RotaryEmbedding(8, 5, 10000.0, num_heads=3)
    cos, sin = (t.to(torch.float64 if dtype == torch.float64 else torch.float32) for t in rope())
    cases = [
        ("rms_norm", fused.RMSNormFunction, _rms_formula, (rand(2, 5, 8), 1e-5)),
        ("rope", fused.RopeFunction, _rope_formula, (rand(2, 5, 9, 8)[:, :, 3:6], cos, sin)),
        ("gate", fused.GateFunction, _gate_formula, (rand(2, 5, 12),)),
    ]
    for kernel in (1, 2, 3, 7):  # 7 > T: the oldest taps see only the zeros before the start
        cases += [
            (f"conv{kernel}", fused.CausalConvFunction, _conv_formula, (rand(2, 5, 6), rand(6, kernel), rand(6))),
            (f"gated_conv{kernel}", fused.GatedConvFunction, _gated_conv_formula,
             (rand(2, 5, 12), rand(6, kernel), rand(6), dtype)),  # the output in the stream's dtype
        ]
    return cases


@pytest.mark.parametrize("case", _fused_cases(torch.float64), ids=lambda case: case[0])
def test_fused_function_gradients_are_exact(case):
    _, function, _, inputs = case
    assert torch.autograd.gradcheck(function.apply, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(_fused_cases(torch.float32))))
def test_fused_function_matches_its_formula(case: int, dtype: torch.dtype):
    """Values and gradients as autograd of the formula gives them, in the formula's dtypes
    (bf16 inputs with float32 conv weights or RoPE tables compute in float32; the gated conv's
    output is in the stream's dtype, bf16 for a bf16 stream)."""
    name, function, formula, inputs = _fused_cases(dtype)[case]
    if name.startswith("conv") or name.startswith("gated_conv"):  # weights stay float32 under autocast
        inputs = (inputs[0], *(t.detach().float().requires_grad_() if isinstance(t, torch.Tensor) else t
                               for t in inputs[1:]))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    out = function.apply(*inputs)
    expected = formula(*inputs)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, **tol)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grad = torch.randn_like(expected)
    actual_grads = torch.autograd.grad(out, tensors, grad)
    for actual, wanted in zip(actual_grads, torch.autograd.grad(expected, tensors, grad)):
        assert actual.dtype == wanted.dtype
        torch.testing.assert_close(actual, wanted, **tol)
