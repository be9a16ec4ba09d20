"""A step-only form of a trained RecurrentStack for fast CPU streaming: int8 weights, fused projections.

One stream on a CPU steps the model one 40 ms frame at a time, so every layer is a
matrix-vector product and its time goes to reading the weights, not to arithmetic: the STT
model's 17.6 MB of fp32 matrices per frame took 2.3 of its 3.2 ms on a loaded 2-core VM.
`FrozenStack` keeps the same math and the same state layout as `RecurrentBlock.step`, with

- every matrix as int8 with one scale per output row (symmetric), multiplied with bf16
  activations by torch's `_weight_int8pack_mm` (the AVX-512 kernel behind its int8 weight-only
  inference): 4x fewer bytes. Activations, the recurrence and its state stay fp32 between
  matrices, so only the products are rounded;
- projections that read the same input as one matrix (the block's gate and input branches,
  the RG-LRU's two gates), RMSNorm gains folded into the matrix after them and the norm's
  per-row 1/RMS applied to that matrix's output instead of its input: fewer ops, which at
  batch 1 is what a step costs (each op a few microseconds, whatever its size);
- with int8, GELU by its tanh form (within 3e-4 of erf's, far below the bf16 rounding of the
  products; 1.6 instead of 6 us a call, 13 calls a frame).

With `int8=False` the matrices stay fp32 (stored transposed, which MKL multiplies faster
from the left) and the output equals `RecurrentStack.step` to float rounding
(tests/test_inference.py); that is how the fusion is checked. `scan` runs T frames at once
with the same fusions (RecurrentStack.forward's math): the TTS decoder renders chunks that
way on a CPU, 20-25 % faster a chunk than the training module. A frozen stack has no
parameters and no training mode: freeze again after the weights change (`cached_freeze`).
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ssm import CONV_KERNEL, GATE_SCALE, BlockState, RecurrentBlock, RecurrentStack, linear_scan


def int8_supported() -> bool:
    """Whether this torch build has the int8 weight-only matmul (any CPU build since 2.3)."""
    return hasattr(torch, "_weight_int8pack_mm")


def gelu_for(int8: bool):
    """Exact GELU for the fp32 form; the tanh form where int8 products set the precision anyway."""
    return functools.partial(F.gelu, approximate="tanh" if int8 else "none")


class PackedLinear:
    """y = x W^T + b for inference only: W fp32 (kept as W^T, [in, out]), or int8 ([out, in],
    as the kernel wants it) with a bf16 scale per output row."""

    def __init__(self, weight: Tensor, bias: Tensor, int8: bool) -> None:
        weight, self.bias = weight.detach().float(), bias.detach().float()
        self.int8 = int8
        if int8:
            # Quantize against the bf16 scale the kernel multiplies by, not the fp32 one it
            # was rounded from (up to 0.4 % apart): a row's gain stays exact. The clamp then
            # costs the largest weight at most half a step, like any rounding.
            self.scale = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(torch.bfloat16)
            quantized = torch.round(weight / self.scale.float()[:, None]).clamp(-127, 127)
            self.weight = quantized.to(torch.int8).contiguous()
        else:
            self.weight, self.scale = weight.T.contiguous(), None  # MKL multiplies this layout faster

    @classmethod
    def concat(cls, layers: list[nn.Linear], int8: bool, input_gain: Tensor | None = None) -> "PackedLinear":
        """Layers that read the same input as one matrix; input_gain (an RMSNorm's weight) folded in."""
        weight = torch.cat([layer.weight.detach().float() for layer in layers])
        if input_gain is not None:
            weight = weight * input_gain.detach().float()
        return cls(weight, torch.cat([layer.bias.detach().float() for layer in layers]), int8)

    def __call__(self, x: Tensor, row_gain: Tensor | None = None) -> Tensor:
        """x W^T + b, or (x W^T) * row_gain + b: an RMSNorm's per-row factor applied after the
        product instead of before it (W (r x) = r (W x)), which saves normalising x."""
        product = torch._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.scale) if self.int8 \
            else torch.mm(x, self.weight)
        # a bf16 product plus fp32 terms comes out fp32 (type promotion): no separate cast
        return product + self.bias if row_gain is None else torch.addcmul(self.bias, product, row_gain)


def halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """The two column halves of rows [N, 2 C] (two slices: a third of split's cost at batch 1)."""
    half = x.shape[1] // 2
    return x[:, :half], x[:, half:]


def rms_gain(x: Tensor, eps: Tensor) -> Tensor:
    """1 / RMS(x) per row [B, 1], as RMSNorm computes it (few ops: each costs microseconds here)."""
    return torch.rsqrt(torch.add(eps, (x * x).sum(-1, keepdim=True), alpha=1.0 / x.shape[-1]))


class FrozenBlock:
    """RecurrentBlock.step with packed matrices (see the module docstring)."""

    def __init__(self, block: RecurrentBlock, int8: bool) -> None:
        self.expanded, self.eps = block.expanded, torch.tensor([block.norm.eps])
        self.gelu = gelu_for(int8)
        self.branches = PackedLinear.concat([block.gate_branch, block.input_branch], int8, block.norm.weight)
        self.conv_taps = block.conv.weight.detach().float().T.contiguous()  # [kernel, expanded]
        self.conv_bias = block.conv.bias.detach().float()
        rglru = block.rglru
        self.gates = PackedLinear.concat([rglru.input_gate, rglru.recurrence_gate], int8)
        self.log_decay_rate = -GATE_SCALE * F.softplus(rglru.decay_param.detach().float())
        self.min_norm = torch.tensor([1e-12])
        self.out = PackedLinear.concat([block.out], int8)
        self.mlp_in = PackedLinear.concat([block.mlp_in], int8, block.mlp_norm.weight)
        self.mlp_out = PackedLinear.concat([block.mlp_out], int8)

    def step(self, x: Tensor, state: BlockState) -> tuple[Tensor, BlockState]:
        """x [B, width] fp32 one frame -> (y [B, width], new state)."""
        # Written for few ops rather than few lines: at batch 1 each op's fixed cost (µs)
        # outweighs its arithmetic. Python scalars are avoided for the same reason.
        gate, branch = halves(self.branches(x, rms_gain(x, self.eps)))
        window = torch.cat([state.conv.float(), branch[:, None]], dim=1)  # [B, kernel, expanded]
        conv_out = (window * self.conv_taps).sum(1) + self.conv_bias
        log_decay, gated = self._recurrence_inputs(conv_out)
        h = torch.addcmul(gated, torch.exp(log_decay), state.h.float())
        return self._mix_out(x, gate, h), BlockState(window[:, 1:], h)

    def scan(self, x: Tensor, state: BlockState) -> tuple[Tensor, BlockState]:
        """x [B, T, width] fp32, T frames at once (RecurrentBlock.forward) -> (y [B, T, width], new state)."""
        batch, frames, width = x.shape
        x = x.reshape(batch * frames, width)
        gate, branch = halves(self.branches(x, rms_gain(x, self.eps)))
        padded = torch.cat([state.conv.float(), branch.view(batch, frames, -1)], dim=1)  # [B, T + kernel - 1, E]
        windows = padded.unfold(1, CONV_KERNEL, 1)  # [B, T, E, kernel]
        conv_out = (windows * self.conv_taps.T).sum(-1).view(batch * frames, -1) + self.conv_bias
        log_decay, gated = self._recurrence_inputs(conv_out)
        h, last = linear_scan(log_decay.view(batch, frames, -1), gated.view(batch, frames, -1), state.h.float())
        y = self._mix_out(x, gate, h.view(batch * frames, -1))
        return y.view(batch, frames, width), BlockState(padded[:, -(CONV_KERNEL - 1):], last)

    def _recurrence_inputs(self, conv_out: Tensor) -> tuple[Tensor, Tensor]:
        """RG-LRU gates of the conv output -> (log decay, gated and normalised input)."""
        input_gate, recurrence_gate = halves(torch.sigmoid(self.gates(conv_out)))
        log_decay = self.log_decay_rate * recurrence_gate
        # sqrt(1 - decay²) = sqrt(-expm1(2 log decay)), as RGLRU computes it
        norm = torch.sqrt(torch.maximum(torch.expm1(log_decay + log_decay).neg_(), self.min_norm))
        return log_decay, norm * input_gate * conv_out

    def _mix_out(self, x: Tensor, gate: Tensor, h: Tensor) -> Tensor:
        """The residual recurrent branch, then the residual gated MLP, on rows [N, width]."""
        x = x + self.out(self.gelu(gate) * h)
        gate, value = halves(self.mlp_in(x, rms_gain(x, self.eps)))
        return x + self.mlp_out(self.gelu(gate) * value)


class FrozenStack:
    """RecurrentStack.step, block by block; the final RMSNorm is left to the caller, who folds
    `final_gain` into the matrix that reads the output and applies the per-row gain step returns."""

    def __init__(self, stack: RecurrentStack, int8: bool) -> None:
        self.blocks = [FrozenBlock(block, int8) for block in stack.blocks]
        self.final_gain, self.eps = stack.final_norm.weight.detach().float(), torch.tensor([stack.final_norm.eps])

    def initial_state(self, batch: int, device=None) -> list[BlockState]:
        return [BlockState.zeros(batch, block.expanded, device) for block in self.blocks]

    def step(self, x: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState], Tensor]:
        """-> (output before its final RMSNorm, new state, that norm's per-row gain [B, 1]):
        the caller's next matrix applies the gain (PackedLinear's row_gain)."""
        new_state = []
        for block, block_state in zip(self.blocks, state):
            x, block_state = block.step(x, block_state)
            new_state.append(block_state)
        return x, new_state, rms_gain(x, self.eps)

    def scan(self, x: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState], Tensor]:
        """RecurrentStack.forward over x [B, T, width] -> (output before the final RMSNorm,
        new state, that norm's gain [B, T, 1]), as step returns them."""
        new_state = []
        for block, block_state in zip(self.blocks, state):
            x, block_state = block.scan(x, block_state)
            new_state.append(block_state)
        return x, new_state, rms_gain(x, self.eps)


Frozen = TypeVar("Frozen")
_FROZEN: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def cached_freeze(model: nn.Module, kind: str, freeze: Callable[[nn.Module], Frozen]) -> Frozen:
    """freeze(model), kept per model and kind and made again only when a weight has changed
    since (an optimizer step or load_state_dict bumps the tensor's version): freezing takes
    milliseconds, a stream's step microseconds."""
    version = tuple((p.data_ptr(), p._version) for p in model.parameters())
    forms = _FROZEN.setdefault(model, {})
    if kind not in forms or forms[kind][0] != version:
        forms[kind] = (version, freeze(model))
    return forms[kind][1]
