"""Building blocks shared by the recurrent models: norm, RoPE, attention, (Conv)SwiGLU, blocks.

The numerics follow the official HRM / TRM / URM code, so that their checkpoints load and give the
same outputs: parameter-free RMSNorm in float32, half-split RoPE, post-norm blocks, bias-free
linears, the MLP width rounded up to a multiple of 256, and truncated LeCun-normal init.
Shapes: B batch, T sequence positions (puzzle prefix included), D hidden, H heads, E head dim.
"""

import math
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from urm_ray.models import fused

FFNKind = Literal["swiglu", "conv_swiglu"]
# Where ConvSwiGLU's depthwise causal conv sits: on the gated product (official URM) or on
# the gate/up expansion before gating.
ConvPosition = Literal["after_gate", "before_gate"]
Rope = tuple[Tensor, Tensor]  # (cos, signed sin) tables, each [T, H, E] (or [T, 1, E])

# Truncating a unit normal to [-2, 2] leaves this standard deviation (JAX/Flax convention:
# the requested std is the std of the truncated distribution, not of the untruncated one).
_TRUNC2_STD = math.sqrt(
    1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2))
)


def trunc_normal_(tensor: Tensor, std: float) -> Tensor:
    """Fill with a normal truncated at +-2 sigma whose actual std is ``std`` (0 gives zeros)."""
    if std == 0:
        return nn.init.zeros_(tensor)
    scale = std / _TRUNC2_STD
    return nn.init.trunc_normal_(tensor, mean=0.0, std=scale, a=-2 * scale, b=2 * scale)


def lecun_linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    """nn.Linear with truncated LeCun-normal weight (std 1/sqrt(fan_in)) and zero bias."""
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        trunc_normal_(layer.weight, std=in_features**-0.5)
        if bias:
            layer.bias.zero_()
    return layer


def ffn_width(hidden_size: int, expansion: float) -> int:
    """SwiGLU intermediate width: 2/3 of expansion*hidden, rounded up to a multiple of 256."""
    return 256 * math.ceil(round(expansion * hidden_size * 2 / 3) / 256)


class RMSNorm(nn.Module):
    """Parameter-free RMS normalisation over the last axis, computed in float32."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return fused.rms_norm(x, self.eps)


class RotaryEmbedding(nn.Module):
    """RoPE tables for the half-split layout (dims i and i + E/2 rotate together by angle
    position * theta^(-2i/E)); non-persistent, so rebuilt rather than saved.

    ``sin`` is stored with the rotation's sign folded in ([-sin, sin] over the two halves), so
    that the rotation needs a swap of the halves and no negation. Both tables are stored repeated
    over the heads, [T, H, E]: with a table broadcast over the head axis, CPU multiplies run E
    elements at a time instead of H * E.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, num_heads: int = 1) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [T, E/2]
        angles = angles.unsqueeze(1).expand(-1, num_heads, -1)  # [T, H, E/2]
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([-angles.sin(), angles.sin()], -1), persistent=False)

    def forward(self) -> Rope:
        return self.cos, self.sin


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate [B, T, H, E] queries or keys: the half-split rotation x * cos + [-x2, x1] * sin,
    math in the tables' dtype (float32), three passes each way (``fused.rope``)."""
    return fused.rope(x, *rope)


class Attention(nn.Module):
    """Bidirectional multi-head self-attention with a fused qkv projection and RoPE."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        # Output rows: all query heads, then all key heads, then all value heads.
        self.qkv_proj = lecun_linear(hidden_size, 3 * hidden_size)
        self.o_proj = lecun_linear(hidden_size, hidden_size)

    def forward(self, x: Tensor, rope: Rope) -> Tensor:
        batch, length, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, length, 3 * self.num_heads, self.head_dim)
        q, k, v = qkv.chunk(3, dim=2)  # [B, T, H, E] each
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))  # [B, T, D]


# On CPU, sequences shorter than this run plain attention (two batched matrix products around a
# softmax): PyTorch's CPU flash-attention kernel is slower on short sequences and faster on long
# ones, and this is where they cross (docs/benchmarks.md, "Training throughput").
PLAIN_ATTENTION_BELOW = 128


def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Scaled dot-product attention of [B, H, T, E] tensors.

    On CPU: plain attention below ``PLAIN_ATTENTION_BELOW`` positions (it keeps the [B, H, T, T]
    probabilities for backward, which flash attention recomputes); and under bf16 autocast, in
    float32: PyTorch's CPU flash attention is slower in bf16 than in float32, while the matmuls
    around it are faster in bf16 (docs/benchmarks.md, "Training throughput"). Elsewhere PyTorch's
    fused kernels (flash or memory-efficient).
    """
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v)
    if torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return _cpu_attention(q.float(), k.float(), v.float())
    return _cpu_attention(q, k, v)


def _cpu_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    if q.shape[-2] < PLAIN_ATTENTION_BELOW:
        scores = (q @ k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)
        return torch.softmax(scores, dim=-1) @ v
    return F.scaled_dot_product_attention(q, k, v)


class SwiGLU(nn.Module):
    """down(silu(gate) * up) with gate and up the two halves of one fused projection."""

    def __init__(self, hidden_size: int, expansion: float) -> None:
        super().__init__()
        width = ffn_width(hidden_size, expansion)
        self.gate_up_proj = lecun_linear(hidden_size, 2 * width)
        self.down_proj = lecun_linear(width, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(fused.swiglu_gate(self.gate_up_proj(x)))  # silu(gate) * up [B, T, F]


def causal_depthwise_conv(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """``conv``'s depthwise causal convolution along the sequence of x [B, T, C] -> [B, T, C].

    Equal to running ``conv`` (padding k-1 on both sides, first T outputs kept) on x transposed:
    out[t] = bias + sum_j w[j] * x[t - (k-1) + j], with x = 0 before the start. Computed as k
    multiply-adds of shifted views in the [B, T, C] layout (``fused.causal_conv``): no transposes,
    no padded copy or output, and backward keeps only x, as Conv1d keeps its input.
    """
    return fused.causal_conv(x, conv.weight[:, 0, :], conv.bias)


class ConvSwiGLU(nn.Module):
    """SwiGLU with a depthwise causal conv over the sequence (URM's short convolution).

    after_gate (official URM): down(silu(conv(silu(gate) * up))).
    before_gate: down(silu(g) * u) with (g, u) = conv(gate_up(x)).
    """

    def __init__(
        self, hidden_size: int, expansion: float, kernel: int = 2, position: ConvPosition = "after_gate"
    ) -> None:
        super().__init__()
        width = ffn_width(hidden_size, expansion)
        self.position = position
        channels = width if position == "after_gate" else 2 * width
        self.gate_up_proj = lecun_linear(hidden_size, 2 * width)
        self.dwconv = nn.Conv1d(channels, channels, kernel, padding=kernel - 1, groups=channels)
        self.down_proj = lecun_linear(width, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up_proj(x)  # [B, T, 2F]
        if self.position == "before_gate":
            return self.down_proj(fused.swiglu_gate(causal_depthwise_conv(self.dwconv, gate_up)))
        taps = self.dwconv.weight[:, 0, :]  # [F, k]
        return self.down_proj(fused.gated_conv(gate_up, taps, self.dwconv.bias, x.dtype))


def make_ffn(
    kind: FFNKind, hidden_size: int, expansion: float, conv_kernel: int, conv_position: ConvPosition
) -> nn.Module:
    """The MLP of a block, chosen by config."""
    if kind == "conv_swiglu":
        return ConvSwiGLU(hidden_size, expansion, conv_kernel, conv_position)
    return SwiGLU(hidden_size, expansion)


class Block(nn.Module):
    """Post-norm transformer block: h = norm(h + attn(h)); h = norm(h + mlp(h))."""

    def __init__(self, hidden_size: int, num_heads: int, mlp: nn.Module, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads)
        self.mlp = mlp
        self.norm = RMSNorm(eps)

    def forward(self, h: Tensor, rope: Rope) -> Tensor:
        h = self.norm(h + self.self_attn(h, rope))
        return self.norm(h + self.mlp(h))


class Stack(nn.Module):
    """A list of blocks applied in order after adding an injected input: f(h, u) = blocks(h + u)."""

    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(blocks)

    def forward(self, h: Tensor, injection: Tensor, rope: Rope) -> Tensor:
        h = h + injection  # [B, T, D]
        for layer in self.layers:
            h = layer(h, rope)
        return h


class PuzzleEmbedding(nn.Module):
    """Per-puzzle vectors trained by a sparse sign-SGD optimizer, not by autograd on the table.

    ``weights`` [num_ids, dim] is a persistent buffer. In training with grad enabled, forward
    copies the batch's rows into a fresh leaf ``local_weights`` [B, dim] (requires grad) and keeps
    ``local_ids`` [B]; the optimizer reads ``local_weights.grad`` and writes the table. Otherwise
    (eval, or no-grad passes such as HRM's target-Q pass) it reads the table directly, so a
    second no-grad pass cannot replace the rows that the loss's gradient lands on.
    A step of several micro-batches (``train.micro_batch_size``) runs forward and backward once per
    micro-batch: a forward that finds the previous leaf's gradient filled keeps those rows, and
    ``trained_rows`` gives the optimizer every micro-batch's rows, in order.
    The locals are plain attributes: they are never saved, moved by ``.to()`` or broadcast by DDP.
    """

    def __init__(self, num_ids: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("weights", torch.zeros(num_ids, dim), persistent=True)
        self.local_weights: Optional[Tensor] = None
        self.local_ids: Optional[Tensor] = None
        self.earlier: list[tuple[Tensor, Tensor]] = []  # (ids [b], grads [b, dim]) of this step

    def forward(self, ids: Tensor) -> Tensor:
        ids = ids.long()
        if not (self.training and torch.is_grad_enabled()):
            return self.weights[ids]  # [B, dim]
        if self.local_weights is not None and self.local_weights.grad is not None:
            self.earlier.append((self.local_ids, self.local_weights.grad))
        self.local_ids = ids
        self.local_weights = self.weights[ids].detach().requires_grad_()
        return self.local_weights

    def trained_rows(self) -> tuple[Tensor, Tensor] | None:
        """The ids [N] and gradient rows [N, dim] of this step's backward passes; None: none."""
        rows = list(self.earlier)
        if self.local_weights is not None and self.local_weights.grad is not None:
            rows.append((self.local_ids, self.local_weights.grad))
        if not rows:
            return None
        if len(rows) == 1:
            return rows[0]
        return torch.cat([ids for ids, _ in rows]), torch.cat([grads for _, grads in rows])

    def clear_rows(self) -> None:
        """After the optimizer's step: no row is trained until the next backward."""
        self.earlier = []
        if self.local_weights is not None:
            self.local_weights.grad = None
