"""What URM, TRM and HRM share: the config fields, the input embedding and the output heads.

A family subclasses ``RecurrentConfig`` (adding its loop structure) and ``RecurrentModel``
(declaring its state names and implementing ``recur``). Inputs are embedded as
``sqrt(D) * concat(puzzle prefix, token embeddings)``; the prefix holds the puzzle vector
zero-padded to ``prefix_len * D`` values. Logits drop the prefix positions; the Q head reads
position 0. Init-state vectors ``init_<state>`` [D] are persistent buffers, as in the official code.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from urm_ray.errors import ConfigError
from urm_ray.models.act import ACTModel, Batch, State
from urm_ray.models.layers import (
    Block,
    ConvPosition,
    FFNKind,
    PuzzleEmbedding,
    Rope,
    RotaryEmbedding,
    Stack,
    lecun_linear,
    make_ffn,
    trunc_normal_,
)
from urm_ray.models.task import TaskSpec


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless condition holds."""
    if not condition:
        raise ConfigError(message)


@dataclass
class RecurrentConfig:
    """Fields common to the recurrent families; keys are reported as ``model.<field>``."""

    # model family: selects the config class and the model (urm_ray/models/registry.py)
    name: str = ""
    # residual stream width D
    hidden_size: int = 512
    # attention heads; hidden_size / num_heads must be even (RoPE)
    num_heads: int = 8
    # MLP width factor before the 2/3 SwiGLU scaling and rounding up to a multiple of 256
    expansion: float = 4.0
    # MLP kind: plain SwiGLU or SwiGLU with a depthwise causal short convolution
    ffn: FFNKind = "swiglu"
    # taps of the short convolution (conv_swiglu only)
    conv_kernel: int = 2
    # where the short convolution sits in the MLP (conv_swiglu only)
    conv_position: ConvPosition = "after_gate"
    # width of the learned per-puzzle vector; 0 disables the puzzle embedding
    puzzle_emb_dim: int = 512
    # prefix positions holding the puzzle vector; 0 = ceil(puzzle_emb_dim / hidden_size)
    puzzle_emb_len: int = 0
    # RoPE base
    rope_theta: float = 10000.0
    # RMSNorm epsilon
    rms_norm_eps: float = 1e-5
    # ACT: most segments (outer deep-supervision steps) before a sequence must halt
    max_segments: int = 16
    # ACT: probability that a row gets a random minimum of 2..max_segments segments (train only)
    halt_exploration_prob: float = 0.1
    # ACT: halt when q_halt > q_continue and learn q_continue from a bootstrapped target
    # (HRM); false = halt when q_halt > 0 and leave q_continue untrained (URM, TRM)
    q_continue_target: bool = False
    # test-time exploration: std of the Gaussian noise added to the recurrent state after each
    # loop or cycle (the state is RMS-normalized, so 0.1 is 10 % of its scale); 0 = deterministic
    state_noise: float = 0.0
    # under bf16 autocast: carry the recurrent states and run the residual stream in bf16, as the
    # official code does (forward_dtype), which halves their memory; false = float32, the
    # autocast default. No effect without autocast (float32 on CPU unless train.bf16 is true)
    bf16_states: bool = False

    def __post_init__(self) -> None:
        require(self.hidden_size >= 1, f"model.hidden_size={self.hidden_size} must be >= 1")
        require(self.num_heads >= 1, f"model.num_heads={self.num_heads} must be >= 1")
        require(
            self.hidden_size % self.num_heads == 0 and (self.hidden_size // self.num_heads) % 2 == 0,
            f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads="
            f"{self.num_heads} into an even head dimension",
        )
        require(self.expansion > 0, f"model.expansion={self.expansion} must be > 0")
        require(self.conv_kernel >= 1, f"model.conv_kernel={self.conv_kernel} must be >= 1")
        require(self.puzzle_emb_dim >= 0, f"model.puzzle_emb_dim={self.puzzle_emb_dim} must be >= 0")
        require(self.puzzle_emb_len >= 0, f"model.puzzle_emb_len={self.puzzle_emb_len} must be >= 0")
        require(
            self.prefix_len * self.hidden_size >= self.puzzle_emb_dim,
            f"model.puzzle_emb_len={self.puzzle_emb_len} positions of model.hidden_size="
            f"{self.hidden_size} cannot hold model.puzzle_emb_dim={self.puzzle_emb_dim}",
        )
        require(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be > 0")
        require(self.rms_norm_eps > 0, f"model.rms_norm_eps={self.rms_norm_eps} must be > 0")
        require(self.max_segments >= 1, f"model.max_segments={self.max_segments} must be >= 1")
        require(
            0.0 <= self.halt_exploration_prob <= 1.0,
            f"model.halt_exploration_prob={self.halt_exploration_prob} must be in [0, 1]",
        )
        require(self.state_noise >= 0, f"model.state_noise={self.state_noise} must be >= 0")
        if self.ffn == "swiglu" and (self.conv_kernel != 2 or self.conv_position != "after_gate"):
            warnings.warn("model.conv_kernel / model.conv_position have no effect with model.ffn=swiglu")
        # the family's default is no choice of the user's, and 0 is "off": neither warns
        default = type(self).__dataclass_fields__["halt_exploration_prob"].default
        if self.max_segments == 1 and self.halt_exploration_prob not in (0.0, default):
            warnings.warn(f"model.halt_exploration_prob={self.halt_exploration_prob} has no effect with "
                          "model.max_segments=1: every row halts after its one segment")

    @property
    def prefix_len(self) -> int:
        """Number of puzzle-prefix positions in front of the tokens."""
        return self.puzzle_emb_len or math.ceil(self.puzzle_emb_dim / self.hidden_size)


class RecurrentModel(ACTModel):
    """Embedding, RoPE, heads and init states around a family's ``recur`` step."""

    # names of the recurrent states, e.g. ("z_H", "z_L"); buffers are called init_<name>
    state_names: tuple[str, ...] = ()
    # the state the heads read
    output_state: str = ""

    def __init__(self, config: RecurrentConfig, task: TaskSpec) -> None:
        super().__init__()
        self.config = config
        self.task = task
        self.max_segments = config.max_segments
        self.halt_exploration_prob = config.halt_exploration_prob
        self.q_continue_target = config.q_continue_target
        self.prefix_len = config.prefix_len
        self.embed_scale = math.sqrt(config.hidden_size)
        hidden, dim = config.hidden_size, config.puzzle_emb_dim
        self.embed_tokens = nn.Embedding(task.vocab_size, hidden)
        self.puzzle_emb = PuzzleEmbedding(task.num_puzzle_identifiers, dim) if dim else None
        head_dim = hidden // config.num_heads
        self.rotary_emb = RotaryEmbedding(head_dim, self.prefix_len + task.seq_len, config.rope_theta,
                                          config.num_heads)
        self.lm_head = lecun_linear(hidden, task.vocab_size)
        self.q_head = lecun_linear(hidden, 2, bias=True)
        with torch.no_grad():
            trunc_normal_(self.embed_tokens.weight, std=1 / self.embed_scale)
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5.0)  # both Q logits start at -5: rarely halts before Q learns
        for name in self.state_names:
            self.register_buffer(f"init_{name}", trunc_normal_(torch.empty(hidden), std=1.0))

    def make_stack(self, num_layers: int) -> Stack:
        """``num_layers`` blocks built from this model's config."""
        cfg = self.config
        return Stack([
            Block(
                cfg.hidden_size,
                cfg.num_heads,
                make_ffn(cfg.ffn, cfg.hidden_size, cfg.expansion, cfg.conv_kernel, cfg.conv_position),
                cfg.rms_norm_eps,
            )
            for _ in range(num_layers)
        ])

    def recur(self, state: State, x: Tensor, rope: Rope) -> State:
        """One segment's recurrence on the states, given input embeddings x [B, T, D]."""
        raise NotImplementedError

    @property
    def stack_passes(self) -> int:
        """Passes of a block stack per ACT segment: the unit of test-time compute."""
        raise NotImplementedError

    def explore(self, h: Tensor) -> Tensor:
        """h plus Gaussian noise of std ``model.state_noise`` (each family calls it on its state
        after each loop or cycle); h itself at 0."""
        noise = self.config.state_noise
        return h if noise == 0 else h + noise * torch.randn_like(h)

    def embed_input(self, inputs: Tensor, puzzle_ids: Tensor) -> Tensor:
        """sqrt(D) * [puzzle prefix; token embeddings] -> [B, prefix_len + L, D]."""
        tokens = self.embed_tokens(inputs.long())  # [B, L, D]
        if not self.prefix_len:
            return self.embed_scale * tokens
        if self.puzzle_emb is None:
            vector = tokens.new_zeros(tokens.shape[0], 0)
        else:
            vector = self.puzzle_emb(puzzle_ids).to(tokens.dtype)  # [B, puzzle_emb_dim]
        vector = F.pad(vector, (0, self.prefix_len * tokens.shape[-1] - vector.shape[-1]))
        prefix = vector.view(-1, self.prefix_len, tokens.shape[-1])  # [B, P, D]
        return self.embed_scale * torch.cat([prefix, tokens], dim=1)

    def empty_state(self, batch_size: int, device: torch.device) -> State:
        shape = (batch_size, self.prefix_len + self.task.seq_len, self.config.hidden_size)
        # a bf16 carry from the start (``segment`` casts the states to the stream's dtype)
        dtype = torch.bfloat16 if self.config.bf16_states else self.embed_tokens.weight.dtype
        return {name: torch.zeros(shape, device=device, dtype=dtype) for name in self.state_names}

    def reset_state(self, state: State, rows: Tensor) -> State:
        reset = rows.view(-1, 1, 1)
        return {name: torch.where(reset, getattr(self, f"init_{name}"), value) for name, value in state.items()}

    def rope(self, length: int) -> Rope:
        """RoPE tables for the first ``length`` positions."""
        cos, sin = self.rotary_emb()
        return cos[:length], sin[:length]

    def heads(self, h: Tensor) -> dict[str, Tensor]:
        """Decode the output state h [B, T, D]: token logits and the two Q logits (float32)."""
        q = self.q_head(h[:, 0]).float()  # [B, 2]
        logits = self.lm_head(h[:, self.prefix_len :]).float()  # [B, L, V]
        return {"logits": logits, "q_halt_logits": q[:, 0], "q_continue_logits": q[:, 1]}

    def segment(self, state: State, data: Batch) -> tuple[State, dict[str, Tensor]]:
        x = self.embed_input(data["inputs"], data["puzzle_identifiers"])  # [B, T, D]
        dtype = self.stream_dtype(x.device)
        state = {name: value.to(dtype) for name, value in state.items()}
        return self.core(state, x.to(dtype), data["labels"])

    def stream_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype of the states and the residual stream: bf16 under bf16 autocast with
        ``model.bf16_states``, else float32 (autocast casts each matmul's inputs, not the stream)."""
        if self.config.bf16_states and torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.embed_tokens.weight.dtype

    def core(self, state: State, x: Tensor, labels: Tensor) -> tuple[State, dict[str, Tensor]]:
        """A segment after the input embedding: the recurrence and the heads. Static shapes and
        no Python control flow on values, so this is what ``train.compile`` compiles; the
        puzzle-embedding lookup (which makes a fresh leaf tensor) and the ACT halting stay eager.
        ``labels`` [B, L] are for families whose training reads them (GRAM's posterior)."""
        state = self.recur(state, x, self.rope(x.shape[1]))
        return state, self.heads(state[self.output_state])
