"""State-space sequence layers in pure PyTorch: a Hawk-style recurrent block (RG-LRU).

Each layer has two exact modes over the same parameters:

- `forward(x, state)`: a whole sequence at once, by a chunked parallel scan (training,
  prefill); takes a state and returns the state after the last frame;
- `step(x_t, state)`: one frame, fixed-size state (streaming inference).

The recurrence is the Real-Gated Linear Recurrent Unit of Griffin/Hawk (De et al., 2024):

    a_t = exp(-c * softplus(Λ) * r_t)            r_t = σ(W_a x_t), c = 8
    h_t = a_t ⊙ h_{t-1} + sqrt(1 - a_t²) ⊙ (i_t ⊙ x_t)   i_t = σ(W_x x_t)

preceded by a causal depthwise convolution (kernel 4). Decays are computed in fp32 log
space; the recurrent state is always fp32. No normalisation looks at the future.
State per layer per stream: conv (width × 3) + recurrence (width) floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CONV_KERNEL = 4  # causal depthwise conv taps (Hawk uses 4)
GATE_SCALE = 8.0  # c in a_t = a^(c r_t)
SCAN_CHUNK = 32  # frames per chunk of the parallel scan: 16-64 measured alike on CPU; 32 is one TTS render chunk
FP64_EXP_RANGE = 700.0  # exp overflows fp64 past 709
MIN_DECAY, MAX_DECAY = 0.9, 0.999  # initial range of a^c: memory of ~10 to ~1000 frames


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def linear_scan(log_a: Tensor, u: Tensor, h0: Tensor, chunk: int = SCAN_CHUNK) -> tuple[Tensor, Tensor]:
    """h_t = exp(log_a_t) * h_{t-1} + u_t over dim 1, for [B, T, D] inputs and h0 [B, D].

    Chunked closed form: inside a chunk, with A_t the cumulative log decay from its start,
    h_t = exp(A_t) * (h_in + sum_{s<=t} exp(-A_s) u_s): two cumsums and three products, O(T)
    work (the pairwise form exp(A_t - A_s) is O(T²) and was 5x slower at every size used).
    It runs in fp64 so exp(-A_s) cannot overflow: a chunk's |A| stays under 700 because each
    step's log decay is floored at -700/chunk (a decay of e^-21 or less, which leaves nothing
    of the past at fp32 precision either way; trained models stay above -0.6). Rounding is
    relative to each term, so the result is as exact as the fp32 recurrence. The state
    is carried between chunks. Returns (all h [B, T, D], last h [B, D]), fp32.
    """
    log_a = log_a.double().clamp(min=-FP64_EXP_RANGE / chunk)
    u, h = u.double(), h0.double()
    outputs = []
    for start in range(0, u.shape[1], chunk):
        cumulative = torch.cumsum(log_a[:, start:start + chunk], dim=1)  # A_t
        inputs = torch.cumsum(torch.exp(-cumulative) * u[:, start:start + chunk], dim=1)
        hc = torch.exp(cumulative) * (h.unsqueeze(1) + inputs)
        outputs.append(hc)
        h = hc[:, -1]
    return torch.cat(outputs, dim=1).float(), h.float()


class RGLRU(nn.Module):
    """Real-Gated Linear Recurrent Unit: a diagonal, input-gated linear recurrence."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.input_gate = nn.Linear(width, width)
        self.recurrence_gate = nn.Linear(width, width)
        # Λ such that a^c = exp(-c softplus(Λ)) starts uniform in [MIN_DECAY, MAX_DECAY].
        decay = torch.empty(width).uniform_(MIN_DECAY, MAX_DECAY)
        softplus_value = -torch.log(decay) / GATE_SCALE
        self.decay_param = nn.Parameter(torch.log(torch.expm1(softplus_value)))

    def _gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(log a_t, gated and normalised input) in fp32."""
        r = torch.sigmoid(self.recurrence_gate(x).float())
        log_a = -GATE_SCALE * F.softplus(self.decay_param.float()) * r
        i = torch.sigmoid(self.input_gate(x).float())
        # sqrt(1 - a²) keeps the state's scale independent of the memory length.
        multiplier = torch.sqrt(torch.clamp(-torch.expm1(2 * log_a), min=1e-12))
        return log_a, multiplier * i * x.float()

    def forward(self, x: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        log_a, u = self._gates(x)
        h, last = linear_scan(log_a, u, h0, SCAN_CHUNK)
        return h.to(x.dtype), last

    def step(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        log_a, u = self._gates(x)
        h = torch.exp(log_a) * h.float() + u
        return h.to(x.dtype), h


class CausalConv(nn.Module):
    """Depthwise causal 1-D convolution whose left context is carried as state."""

    def __init__(self, width: int, kernel: int = CONV_KERNEL) -> None:
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.randn(width, kernel) / math.sqrt(kernel))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, D], state [B, kernel-1, D] (the previous inputs) -> (y, new state)."""
        padded = torch.cat([state.to(x.dtype), x], dim=1)  # [B, T+k-1, D]
        windows = padded.unfold(1, self.kernel, 1)  # [B, T, D, k]
        y = (windows * self.weight.to(x.dtype)).sum(-1) + self.bias.to(x.dtype)
        return y, padded[:, -(self.kernel - 1):]

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, D] one frame."""
        y, state = self.forward(x.unsqueeze(1), state)
        return y.squeeze(1), state


@dataclass
class BlockState:
    """One stream's (or a batch's) state for one RecurrentBlock: fixed size."""

    conv: Tensor  # [B, kernel-1, expanded]
    h: Tensor  # [B, expanded], fp32

    @staticmethod
    def zeros(batch: int, expanded: int, device=None, dtype=torch.float32) -> "BlockState":
        return BlockState(torch.zeros(batch, CONV_KERNEL - 1, expanded, device=device, dtype=dtype),
                          torch.zeros(batch, expanded, device=device, dtype=torch.float32))


class RecurrentBlock(nn.Module):
    """Hawk residual block: RMSNorm -> (GeLU branch) * (conv -> RG-LRU branch) -> out, then a gated MLP."""

    def __init__(self, width: int, expand: int = 1, mlp_ratio: int = 3) -> None:
        super().__init__()
        self.expanded = width * expand
        self.norm = RMSNorm(width)
        self.gate_branch = nn.Linear(width, self.expanded)
        self.input_branch = nn.Linear(width, self.expanded)
        self.conv = CausalConv(self.expanded)
        self.rglru = RGLRU(self.expanded)
        self.out = nn.Linear(self.expanded, width)
        self.mlp_norm = RMSNorm(width)
        self.mlp_in = nn.Linear(width, 2 * mlp_ratio * width)
        self.mlp_out = nn.Linear(mlp_ratio * width, width)

    def initial_state(self, batch: int, device=None) -> BlockState:
        return BlockState.zeros(batch, self.expanded, device)

    def _mlp(self, x: Tensor) -> Tensor:
        gate, value = self.mlp_in(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp_out(F.gelu(gate) * value)

    def forward(self, x: Tensor, state: BlockState) -> tuple[Tensor, BlockState]:
        """x [B, T, width] -> (y [B, T, width], state after the last frame)."""
        normed = self.norm(x)
        gate = F.gelu(self.gate_branch(normed))
        conv_out, conv_state = self.conv(self.input_branch(normed), state.conv)
        recurrent, h = self.rglru(conv_out, state.h)
        x = x + self.out(gate * recurrent)
        return self._mlp(x), BlockState(conv_state, h)

    def step(self, x: Tensor, state: BlockState) -> tuple[Tensor, BlockState]:
        """x [B, width] one frame -> (y [B, width], new state)."""
        normed = self.norm(x)
        gate = F.gelu(self.gate_branch(normed))
        conv_out, conv_state = self.conv.step(self.input_branch(normed), state.conv)
        recurrent, h = self.rglru.step(conv_out, state.h)
        x = x + self.out(gate * recurrent)
        return self._mlp(x), BlockState(conv_state, h)


class RecurrentStack(nn.Module):
    """N RecurrentBlocks with one list of states: the sequence core of the STT and TTS models."""

    def __init__(self, width: int, depth: int, expand: int = 1, mlp_ratio: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RecurrentBlock(width, expand, mlp_ratio) for _ in range(depth))
        self.final_norm = RMSNorm(width)

    def initial_state(self, batch: int, device=None) -> list[BlockState]:
        return [block.initial_state(batch, device) for block in self.blocks]

    def forward(self, x: Tensor, state: Optional[list[BlockState]] = None) -> tuple[Tensor, list[BlockState]]:
        state = state if state is not None else self.initial_state(x.shape[0], x.device)
        new_state = []
        for block, block_state in zip(self.blocks, state):
            x, block_state = block(x, block_state)
            new_state.append(block_state)
        return self.final_norm(x), new_state

    def step(self, x: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState]]:
        new_state = []
        for block, block_state in zip(self.blocks, state):
            x, block_state = block.step(x, block_state)
            new_state.append(block_state)
        return self.final_norm(x), new_state
