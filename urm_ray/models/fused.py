"""Hand-written backward passes for the blocks' elementwise parts: RMSNorm, RoPE, SwiGLU's gate
and ConvSwiGLU's gate + causal conv.

Autograd of the plain formulas runs each elementwise step as its own pass over a [B, T, C]
tensor, keeps most intermediates for backward, and joins the gradients of chunked tensors with a
concatenation. In eager mode on CPU, at URM's sizes, those passes took as long as the block's
matrix products. Each Function here computes the plain formula in fewer passes, keeps only what
its backward reads, and writes the gradient of a chunked input straight into one buffer.

Under torch.compile the public functions (``rms_norm``, ``rope``, ``swiglu_gate``,
``causal_conv``, ``gated_conv``) run the plain formulas instead: Inductor fuses those itself and
picks what to keep for backward, and Dynamo cannot trace the Functions' writes into views
(``out=`` a non-contiguous tensor is a graph break). tests/test_models_layers.py checks each
Function's values and gradients against its plain formula.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx

silu_backward = torch.ops.aten.silu_backward


def rms_norm(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32 (or x's wider dtype), cast back
    to x's dtype."""
    if torch.compiler.is_compiling():
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)
    return RMSNormFunction.apply(x, eps)


def rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Half-split RoPE of x [B, T, H, E]: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), x1 and x2
    the halves of the last axis, computed as x * cos + [x2, x1] * signed_sin; cos = [cos, cos] and
    signed_sin = [-sin, sin] over the halves, [T, H, E] or [T, 1, E]; math in the tables' dtype."""
    if torch.compiler.is_compiling():
        return _rotate(x, cos, signed_sin).to(x.dtype)
    return RopeFunction.apply(x, cos, signed_sin)


def swiglu_gate(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of gate_up [..., 2F] (gate, up its halves) -> [..., F]."""
    if torch.compiler.is_compiling():
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    return GateFunction.apply(gate_up)


def causal_conv(u: Tensor, taps: Tensor, bias: Tensor) -> Tensor:
    """Depthwise causal conv along T of u [B, T, C]: out[t] = bias + sum_j taps[:, j] * u[t - (k-1) + j]
    with u = 0 before the start; taps [C, k], bias [C]."""
    if torch.compiler.is_compiling():
        return _causal_conv_formula(u, taps, bias)
    return CausalConvFunction.apply(u, taps, bias)


def gated_conv(gate_up: Tensor, taps: Tensor, bias: Tensor, dtype: torch.dtype) -> Tensor:
    """URM's ConvSwiGLU core: silu(causal_conv(silu(gate) * up)) of gate_up [B, T, 2F] -> [B, T, F].
    The convolution is computed in the taps' dtype and its output kept in ``dtype`` (the residual
    stream's: a bf16 stream keeps it in bf16, half the memory of float32)."""
    if torch.compiler.is_compiling():
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(_causal_conv_formula(F.silu(gate) * up, taps, bias).to(dtype))
    return GatedConvFunction.apply(gate_up, taps, bias, dtype)


def _causal_conv_formula(u: Tensor, taps: Tensor, bias: Tensor) -> Tensor:
    """``causal_conv`` as k multiply-adds of shifted, zero-filled copies (for autograd / Inductor)."""
    kernel, length = taps.shape[1], u.shape[1]
    out = torch.addcmul(bias, u, taps[:, kernel - 1])
    for j in range(kernel - 1):
        shift = min(kernel - 1 - j, length)
        out = out.addcmul(F.pad(u[:, : length - shift], (0, 0, shift, 0)), taps[:, j])
    return out


class RMSNormFunction(torch.autograd.Function):
    """y = x / sqrt(mean(x^2) + eps) over the last axis, in float32 (or x's wider dtype), cast
    back to x's dtype.

    Backward: dx = (g - y * mean(g * y)) / rms, in float32; keeps the output y (in x's dtype: the
    tensor the next layer also keeps, so a bf16 stream holds one bf16 copy) and 1 / rms [..., 1].
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, eps: float) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)  # [..., 1]
        y = (x32 * rstd).to(x.dtype)
        ctx.save_for_backward(y, rstd)
        return y

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        y, rstd = ctx.saved_tensors
        y = y.to(rstd.dtype)
        g = grad.to(y.dtype)
        dot = (g * y).mean(-1, keepdim=True)  # [..., 1]
        return torch.addcmul(g, y, dot, value=-1).mul_(rstd).to(grad.dtype), None


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor, sign: float = 1.0) -> Tensor:
    """x * cos + sign * [x2, x1] * signed_sin in the tables' dtype; sign -1 is the inverse
    rotation (the transpose: swapping the halves of signed_sin negates it)."""
    x = x.to(cos.dtype)
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # [x2, x1]
    return torch.mul(x, cos).addcmul_(swapped, signed_sin, value=sign)


class RopeFunction(torch.autograd.Function):
    """``rope`` in three passes (swap, multiply, multiply-add); backward is the inverse rotation
    and keeps no activation (autograd of the formula keeps x and the swapped copy)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, signed_sin)
        return _rotate(x, cos, signed_sin).to(x.dtype)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, signed_sin = ctx.saved_tensors
        return _rotate(grad, cos, signed_sin, -1.0).to(grad.dtype), None, None


class GateFunction(torch.autograd.Function):
    """SwiGLU's gating silu(gate) * up of gate_up [..., 2F] (gate, up its halves) -> [..., F].

    Keeps gate_up only; backward writes both halves' gradients into one [..., 2F] tensor.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, gate_up: Tensor) -> Tensor:
        ctx.save_for_backward(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:
        (gate_up,) = ctx.saved_tensors
        return _gate_backward(gate_up, grad)


def _gate_backward(gate_up: Tensor, grad: Tensor, gated_silu: Tensor | None = None) -> Tensor:
    """d(silu(gate) * up) / d(gate_up) applied to grad [..., F] -> [..., 2F]. ``gated_silu`` is
    silu(gate) when the caller has it already."""
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.empty_like(gate_up)
    grad_gate, grad_up = out.chunk(2, dim=-1)
    torch.mul(grad, F.silu(gate) if gated_silu is None else gated_silu, out=grad_up)
    silu_backward(grad * up, gate, grad_input=grad_gate)
    return out


def _causal_conv_forward(u: Tensor, taps: Tensor, bias: Tensor) -> Tensor:
    """``causal_conv`` in one pass per tap: multiply-adds into shifted views of the output."""
    kernel, length = taps.shape[1], u.shape[1]
    out = torch.addcmul(bias, u, taps[:, kernel - 1])
    for j in range(kernel - 1):
        shift = kernel - 1 - j
        if shift < length:
            out[:, shift:].addcmul_(u[:, : length - shift], taps[:, j])
    return out


def _causal_conv_backward(grad: Tensor, u: Tensor, taps: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``causal_conv`` w.r.t. u [B, T, C], taps [C, k] and bias [C]."""
    kernel, length = taps.shape[1], u.shape[1]
    grad_u = grad * taps[:, kernel - 1]
    grad_taps = [(grad * u).sum((0, 1))]  # tap k-1 first, reversed below
    for j in reversed(range(kernel - 1)):
        shift = kernel - 1 - j
        if shift >= length:
            grad_taps.append(torch.zeros_like(grad_taps[0]))
            continue
        grad_u[:, : length - shift].addcmul_(grad[:, shift:], taps[:, j])
        grad_taps.append((grad[:, shift:] * u[:, : length - shift]).sum((0, 1)))
    grad_taps = torch.stack(grad_taps[::-1], dim=1).to(taps.dtype)
    return grad_u, grad_taps, grad.sum((0, 1)).to(taps.dtype)


class CausalConvFunction(torch.autograd.Function):
    """``causal_conv`` with its own backward: keeps only u (as a conv layer keeps its input)."""

    @staticmethod
    def forward(ctx: FunctionCtx, u: Tensor, taps: Tensor, bias: Tensor) -> Tensor:
        ctx.save_for_backward(u, taps)
        return _causal_conv_forward(u, taps, bias)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        u, taps = ctx.saved_tensors
        grad_u, grad_taps, grad_bias = _causal_conv_backward(grad, u, taps)
        return grad_u.to(u.dtype), grad_taps, grad_bias


class GatedConvFunction(torch.autograd.Function):
    """URM's ConvSwiGLU core: silu(causal_conv(silu(gate) * up)) of gate_up [B, T, 2F] -> [B, T, F].

    Keeps gate_up and the conv output (in the stream's dtype). Backward recomputes silu(gate) * up
    instead of keeping it (it needs silu(gate) for up's gradient anyway, so that costs one
    multiply) and writes gate's and up's gradients into one [B, T, 2F] tensor.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, gate_up: Tensor, taps: Tensor, bias: Tensor, dtype: torch.dtype
                ) -> Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        conv = _causal_conv_forward(F.silu(gate).mul_(up), taps, bias).to(dtype)
        ctx.save_for_backward(gate_up, taps, conv)
        return F.silu(conv)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        gate_up, taps, conv = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        conv = conv.to(torch.promote_types(conv.dtype, taps.dtype))
        grad_conv = silu_backward(grad.to(conv.dtype), conv)
        gated_silu = F.silu(gate)
        grad_u, grad_taps, grad_bias = _causal_conv_backward(grad_conv, gated_silu * up, taps)
        return _gate_backward(gate_up, grad_u, gated_silu), grad_taps, grad_bias, None
