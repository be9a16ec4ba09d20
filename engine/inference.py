"""A step-only form of a trained RecurrentStack for fast CPU streaming: int8 weights, fused projections.

One stream on a CPU steps the model one 40 ms frame at a time, so every layer is a
matrix-vector product and its time goes to reading the weights, not to arithmetic: the STT
model's 17.6 MB of fp32 matrices per frame took 2.3 of its 3.2 ms on a loaded 2-core VM.
`FrozenStack` keeps the same math and the same state layout as `RecurrentBlock.step`, with

- every matrix as int8 with one scale per output row (symmetric): 4x fewer bytes. Parley's
  own AVX2 kernel (engine/cpu_kernels.py) multiplies them with fp32 activations; where it is
  not built, torch's `_weight_int8pack_mm` does, with the activations rounded to bf16 (its
  AVX-512 kernel; without AVX-512 it converts in software, 1.5-2x slower). Activations, the
  recurrence and its state stay fp32 between matrices, so only the weights are rounded;
- projections that read the same input as one matrix (the block's gate and input branches,
  the RG-LRU's two gates), RMSNorm gains folded into the matrix after them and the norm's
  per-row 1/RMS applied to that matrix's output instead of its input: fewer ops, which at
  batch 1 is what a step costs (each op a few microseconds, whatever its size);
- with int8, GELU by its tanh form (within 3e-4 of erf's, far below the bf16 rounding of the
  products; 1.6 instead of 6 us a call, 13 calls a frame);
- the whole stack's step in one call: with Parley's kernel `parley::stack_step`, the same
  math in C++ (a frame's ~300 small ops cost more than its products did); otherwise one
  TorchScript function (`stack_step`), whose interpreter runs those ops without Python's
  per-op cost. The TorchScript functions take a block's tensors as NamedTuples (`Packed`,
  `BlockWeights`); the C++ step reads the same tensors as one flat list, in that order.

With `int8=False` the matrices stay fp32 (stored transposed, which MKL multiplies faster
from the left) and the output equals `RecurrentStack.step` to float rounding
(tests/test_inference.py); that is how the fusion is checked. `scan` runs T frames at once
with the same fusions (RecurrentStack.forward's math): the TTS decoder renders chunks that
way on a CPU, 20-25 % faster a chunk than the training module. A frozen stack has no
parameters and no training mode: freeze again after the weights change (`cached_freeze`).
"""

import functools
import warnings
import weakref
from typing import Callable, List, NamedTuple, Optional, Tuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import cpu_kernels
from .ssm import CONV_KERNEL, GATE_SCALE, BlockState, RecurrentBlock, RecurrentStack, linear_scan


def script(function: Callable) -> Callable:
    """function compiled by TorchScript, whose interpreter runs a frame's ~300 small ops 1.4-1.6x
    faster than Python (the machine code per op is the same), or function itself where
    TorchScript cannot compile it. torch 2.13 deprecates TorchScript for torch.compile, which
    on a CPU needs a C++ compiler at run time; the pinned torch keeps it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return torch.jit.script(function)
        except Exception as error:  # noqa: BLE001 - any failure to compile leaves the Python function
            warnings.warn(f"{function.__name__} runs uncompiled: {error}", RuntimeWarning)
            return function


def int8_supported() -> bool:
    """Whether this torch build has the int8 weight-only matmul (any CPU build since 2.3)."""
    return hasattr(torch, "_weight_int8pack_mm")


def gelu_approximation(int8: bool) -> str:
    """Exact GELU for the fp32 form; the tanh form where int8 products set the precision anyway."""
    return "tanh" if int8 else "none"


def gelu_for(int8: bool):
    """F.gelu as gelu_approximation(int8) chooses it."""
    return functools.partial(F.gelu, approximate=gelu_approximation(int8))


class Packed(NamedTuple):
    """A PackedLinear's tensors, as TorchScript functions take them."""

    weight: Tensor  # int8 [out, in], or fp32 W^T [in, out]
    scale: Tensor  # int8: [out], bf16 values (fp32 for Parley's kernel, bf16 for torch's); fp32: empty
    bias: Tensor  # fp32 [out]


OWN_INT8_KERNEL = cpu_kernels.load()  # torch.ops.parley.*: see engine/cpu_kernels.py
INT8_KERNELS = ("parley", "torch")  # which kernel multiplies int8 matrices: Parley's (fp32 activations) or torch's


def default_int8_kernel() -> str:
    return "parley" if OWN_INT8_KERNEL else "torch"


if OWN_INT8_KERNEL:
    @script
    def packed_product(x: Tensor, packed: Packed, row_gain: Optional[Tensor] = None) -> Tensor:
        """x W^T + b, or (x W^T) * row_gain + b: an RMSNorm's per-row factor applied after the
        product instead of before it (W (r x) = r (W x)), which saves normalising x."""
        if packed.scale.dtype == torch.float32 and packed.scale.numel() > 0:  # Parley's kernel: one call
            return torch.ops.parley.int8_linear(x, packed.weight, packed.scale, packed.bias, row_gain)
        if packed.scale.numel() > 0:
            product = torch._weight_int8pack_mm(x.to(torch.bfloat16), packed.weight, packed.scale)
        else:
            product = torch.mm(x, packed.weight)
        return product + packed.bias if row_gain is None else torch.addcmul(packed.bias, product, row_gain)
else:  # the same without Parley's kernel (TorchScript cannot compile a call of an unknown op)
    @script
    def packed_product(x: Tensor, packed: Packed, row_gain: Optional[Tensor] = None) -> Tensor:
        """x W^T + b, or (x W^T) * row_gain + b (see the function above)."""
        if packed.scale.numel() > 0:
            product = torch._weight_int8pack_mm(x.to(torch.bfloat16), packed.weight, packed.scale)
        else:
            product = torch.mm(x, packed.weight)
        # a bf16 product plus fp32 terms comes out fp32 (type promotion): no separate cast
        return product + packed.bias if row_gain is None else torch.addcmul(packed.bias, product, row_gain)


def check_int8_kernel(kernel: Optional[str]) -> str:
    """kernel=None -> the default; a name it cannot use -> ValueError saying why."""
    kernel = default_int8_kernel() if kernel is None else kernel
    if kernel not in INT8_KERNELS:
        raise ValueError(f"int8 kernel must be one of {INT8_KERNELS}, not {kernel!r}")
    if kernel == "parley" and not OWN_INT8_KERNEL:
        raise ValueError(f"Parley's int8 kernel is not loaded here ({cpu_kernels.unavailable_reason() or 'it failed to build'})")
    return kernel


class PackedLinear:
    """y = x W^T + b for inference only: W fp32 (kept as W^T, [in, out]), or int8 ([out, in],
    as the kernels want it) with a bf16 scale per output row, multiplied by `kernel` (one of
    INT8_KERNELS; default: Parley's where it is available)."""

    def __init__(self, weight: Tensor, bias: Tensor, int8: bool, kernel: Optional[str] = None) -> None:
        weight, bias = weight.detach().float(), bias.detach().float()
        self.int8, self.kernel = int8, check_int8_kernel(kernel) if int8 else None  # None: fp32, no kernel choice
        if int8:
            # Quantize against the bf16 scale the kernel multiplies by, not the fp32 one it
            # was rounded from (up to 0.4 % apart): a row's gain stays exact. The clamp then
            # costs the largest weight at most half a step, like any rounding.
            scale = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(torch.bfloat16)
            quantized = torch.round(weight / scale.float()[:, None]).clamp(-127, 127)
            # the scale's dtype picks the kernel (packed_product): fp32 Parley's, bf16 torch's
            self.packed = Packed(quantized.to(torch.int8).contiguous(),
                                 scale.float() if self.kernel == "parley" else scale, bias)
        else:  # W^T: MKL multiplies this layout faster
            self.packed = Packed(weight.T.contiguous(), torch.empty(0, dtype=torch.bfloat16), bias)

    @property
    def weight(self) -> Tensor:
        return self.packed.weight

    @property
    def scale(self) -> Optional[Tensor]:
        return self.packed.scale if self.int8 else None

    @property
    def bias(self) -> Tensor:
        return self.packed.bias

    @classmethod
    def concat(cls, layers: list[nn.Linear], int8: bool, input_gain: Tensor | None = None,
               kernel: Optional[str] = None) -> "PackedLinear":
        """Layers that read the same input as one matrix; input_gain (an RMSNorm's weight) folded in."""
        weight = torch.cat([layer.weight.detach().float() for layer in layers])
        if input_gain is not None:
            weight = weight * input_gain.detach().float()
        return cls(weight, torch.cat([layer.bias.detach().float() for layer in layers]), int8, kernel)

    def __call__(self, x: Tensor, row_gain: Tensor | None = None) -> Tensor:
        return packed_product(x, self.packed, row_gain)


@script
def halves(x: Tensor) -> Tuple[Tensor, Tensor]:
    """The two column halves of rows [N, 2 C] (two slices: a third of split's cost at batch 1)."""
    half = x.shape[1] // 2
    return x[:, :half], x[:, half:]


@script
def rms_gain(x: Tensor, eps: Tensor) -> Tensor:
    """1 / RMS(x) per row [B, 1], as RMSNorm computes it (few ops: each costs microseconds here)."""
    return torch.rsqrt(torch.add(eps, (x * x).sum(-1, keepdim=True), alpha=1.0 / x.shape[-1]))


class BlockWeights(NamedTuple):
    """A frozen RecurrentBlock's tensors, as the TorchScript functions below take them."""

    branches: Packed  # the gate and input branches, the block norm's gain folded in
    conv_taps: Tensor  # [kernel, expanded]
    conv_bias: Tensor
    gates: Packed  # the RG-LRU's input and recurrence gates
    log_decay_rate: Tensor
    out: Packed
    mlp_in: Packed  # the MLP norm's gain folded in
    mlp_out: Packed
    eps: Tensor  # both norms'
    min_norm: Tensor


@script
def recurrence_inputs(conv_out: Tensor, w: BlockWeights) -> Tuple[Tensor, Tensor]:
    """RG-LRU gates of the conv output -> (log decay, gated and normalised input)."""
    input_gate, recurrence_gate = halves(torch.sigmoid(packed_product(conv_out, w.gates)))
    log_decay = w.log_decay_rate * recurrence_gate
    # sqrt(1 - decay²) = sqrt(-expm1(2 log decay)), as RGLRU computes it
    norm = torch.sqrt(torch.maximum(torch.expm1(log_decay + log_decay).neg_(), w.min_norm))
    return log_decay, norm * input_gate * conv_out


@script
def mix_out(x: Tensor, gate: Tensor, h: Tensor, w: BlockWeights, gelu: str) -> Tensor:
    """The residual recurrent branch, then the residual gated MLP, on rows [N, width]."""
    x = x + packed_product(F.gelu(gate, approximate=gelu) * h, w.out)
    gate, value = halves(packed_product(x, w.mlp_in, rms_gain(x, w.eps)))
    return x + packed_product(F.gelu(gate, approximate=gelu) * value, w.mlp_out)


@script
def block_step(x: Tensor, conv: Tensor, h: Tensor, w: BlockWeights, gelu: str) -> Tuple[Tensor, Tensor, Tensor]:
    """RecurrentBlock.step: x [B, width] one frame, state (conv [B, kernel-1, E], h [B, E])
    -> (y [B, width], new conv, new h)."""
    gate, branch = halves(packed_product(x, w.branches, rms_gain(x, w.eps)))
    window = torch.cat([conv.float(), branch.unsqueeze(1)], dim=1)  # [B, kernel, expanded]
    conv_out = (window * w.conv_taps).sum(1) + w.conv_bias
    log_decay, gated = recurrence_inputs(conv_out, w)
    h = torch.addcmul(gated, torch.exp(log_decay), h.float())
    return mix_out(x, gate, h, w, gelu), window[:, 1:], h


@script
def stack_step(x: Tensor, convs: List[Tensor], hs: List[Tensor], blocks: List[BlockWeights], gelu: str
               ) -> Tuple[Tensor, List[Tensor], List[Tensor]]:
    """RecurrentStack.step without its final norm, block by block, in one TorchScript call."""
    new_convs: List[Tensor] = []
    new_hs: List[Tensor] = []
    for i in range(len(blocks)):
        x, conv, h = block_step(x, convs[i], hs[i], blocks[i], gelu)
        new_convs.append(conv)
        new_hs.append(h)
    return x, new_convs, new_hs


class FrozenBlock:
    """RecurrentBlock with packed matrices (see the module docstring): its tensors for
    block_step, and scan."""

    def __init__(self, block: RecurrentBlock, int8: bool, kernel: Optional[str] = None) -> None:
        self.expanded, self.gelu = block.expanded, gelu_approximation(int8)
        rglru = block.rglru
        pack = functools.partial(PackedLinear.concat, int8=int8, kernel=kernel)
        self.weights = BlockWeights(
            branches=pack([block.gate_branch, block.input_branch], input_gain=block.norm.weight).packed,
            conv_taps=block.conv.weight.detach().float().T.contiguous(),
            conv_bias=block.conv.bias.detach().float(),
            gates=pack([rglru.input_gate, rglru.recurrence_gate]).packed,
            log_decay_rate=-GATE_SCALE * F.softplus(rglru.decay_param.detach().float()),
            out=pack([block.out]).packed,
            mlp_in=pack([block.mlp_in], input_gain=block.mlp_norm.weight).packed,
            mlp_out=pack([block.mlp_out]).packed,
            eps=torch.tensor([block.norm.eps]),
            min_norm=torch.tensor([1e-12]))

    def scan(self, x: Tensor, state: BlockState) -> tuple[Tensor, BlockState]:
        """x [B, T, width] fp32, T frames at once (RecurrentBlock.forward) -> (y [B, T, width], new state)."""
        batch, frames, width = x.shape
        w = self.weights
        x = x.reshape(batch * frames, width)
        gate, branch = halves(packed_product(x, w.branches, rms_gain(x, w.eps)))
        padded = torch.cat([state.conv.float(), branch.view(batch, frames, -1)], dim=1)  # [B, T + kernel - 1, E]
        windows = padded.unfold(1, CONV_KERNEL, 1)  # [B, T, E, kernel]
        conv_out = (windows * w.conv_taps.T).sum(-1).view(batch * frames, -1) + w.conv_bias
        log_decay, gated = recurrence_inputs(conv_out, w)
        h, last = linear_scan(log_decay.view(batch, frames, -1), gated.view(batch, frames, -1), state.h.float())
        y = mix_out(x, gate, h.view(batch * frames, -1), w, self.gelu)
        return y.view(batch, frames, width), BlockState(padded[:, -(CONV_KERNEL - 1):], last)


class FrozenStack:
    """RecurrentStack.step, block by block; the final RMSNorm is left to the caller, who folds
    `final_gain` into the matrix that reads the output and applies the per-row gain step returns."""

    def __init__(self, stack: RecurrentStack, int8: bool, kernel: Optional[str] = None) -> None:
        self.blocks = [FrozenBlock(block, int8, kernel) for block in stack.blocks]
        self.block_weights, self.gelu = [block.weights for block in self.blocks], gelu_approximation(int8)
        self.final_gain, self.eps = stack.final_norm.weight.detach().float(), torch.tensor([stack.final_norm.eps])
        # parley::stack_step reads every block's tensors in BlockWeights' order, a Packed as its three
        self.compiled_weights = [tensor for weights in self.block_weights for field in weights
                                 for tensor in (field if isinstance(field, tuple) else (field,))
                                 ] if int8 and check_int8_kernel(kernel) == "parley" else None

    def initial_state(self, batch: int, device=None) -> list[BlockState]:
        return [BlockState.zeros(batch, block.expanded, device) for block in self.blocks]

    def step(self, x: Tensor, state: list[BlockState]) -> tuple[Tensor, list[BlockState], Tensor]:
        """-> (output before its final RMSNorm, new state, that norm's per-row gain [B, 1]):
        the caller's next matrix applies the gain (PackedLinear's row_gain)."""
        convs, hs = [s.conv for s in state], [s.h for s in state]
        if self.compiled_weights is not None:  # the whole step in one call of Parley's kernel
            x, convs, hs = torch.ops.parley.stack_step(x, convs, hs, self.compiled_weights)
        else:
            x, convs, hs = stack_step(x, convs, hs, self.block_weights, self.gelu)
        return x, [BlockState(conv, h) for conv, h in zip(convs, hs)], rms_gain(x, self.eps)

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
