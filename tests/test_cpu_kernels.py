"""Parley's own CPU kernels (engine/csrc/int8_linear.cpp): built where they can run, exact
against the float math they replace, and clear about bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine import cpu_kernels
from engine.inference import OWN_INT8_KERNEL, FrozenStack, PackedLinear, check_int8_kernel
from engine.ssm import RecurrentStack
from engine.stt import FrozenSttModel, SttConfig, SttModel
from tests.test_inference import trained_looking

needs_kernel = pytest.mark.skipif(not OWN_INT8_KERNEL, reason="Parley's int8 kernel does not run on this machine")


def test_the_kernel_is_built_wherever_it_can_run():
    """On an x86 CPU with AVX2 (every machine CI runs on) a failed build is a failure, not a
    silent fallback to the slower kernel."""
    reason = cpu_kernels.unavailable_reason()
    assert OWN_INT8_KERNEL == (reason is None), f"the kernel did not load ({reason or 'build failed'})"


def dequantized(packed: PackedLinear) -> torch.Tensor:
    return packed.weight.float() * packed.scale.float()[:, None]


@needs_kernel
@pytest.mark.parametrize("rows, columns, outputs", [(1, 256, 512), (5, 64, 30), (3, 320, 29)])
@torch.no_grad()
def test_int8_linear_equals_the_product_of_the_same_int8_weights(rows, columns, outputs):
    """fp32 activations against the dequantized matrix, with a row gain, at batch 1 and above,
    and a row count that is not a multiple of the kernel's block of 4."""
    torch.manual_seed(rows)
    packed = PackedLinear(torch.randn(outputs, columns), torch.randn(outputs), int8=True, kernel="parley")
    x, gain = torch.randn(rows, columns) * 3, torch.rand(rows, 1) + 0.5
    exact = x @ dequantized(packed).T
    ours = torch.ops.parley.int8_linear(x, packed.weight, packed.scale, packed.bias, gain)
    torch.testing.assert_close(ours, exact * gain + packed.bias, atol=1e-4, rtol=1e-5)
    columns_view = torch.randn(columns, rows).T  # not contiguous: copied, same result
    torch.testing.assert_close(packed(columns_view), columns_view @ dequantized(packed).T + packed.bias,
                               atol=1e-4, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("width, depth, expand, mlp_ratio, batch", [(64, 2, 1, 2, 1), (32, 3, 2, 3, 3)])
@torch.no_grad()
def test_the_compiled_stack_step_equals_the_scripted_one(width, depth, expand, mlp_ratio, batch):
    """parley::stack_step does in one call what the TorchScript stack_step does in ~45 ops a
    block, on the same int8 weights: outputs and states agree to float rounding."""
    stack = trained_looking(RecurrentStack(width, depth, expand, mlp_ratio), seed=width)
    compiled = FrozenStack(stack, int8=True, kernel="parley")
    scripted = FrozenStack(stack, int8=True, kernel="parley")
    scripted.compiled_weights = None
    state, scripted_state = compiled.initial_state(batch), scripted.initial_state(batch)
    for _ in range(25):
        x = torch.randn(batch, width) * 2
        y, state, gain = compiled.step(x, state)
        z, scripted_state, scripted_gain = scripted.step(x, scripted_state)
        torch.testing.assert_close(y, z, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(gain, scripted_gain, atol=1e-5, rtol=1e-4)
        for ours, theirs in zip(state, scripted_state):
            torch.testing.assert_close(ours.conv, theirs.conv, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours.h, theirs.h, atol=1e-4, rtol=1e-4)


@needs_kernel
@torch.no_grad()
def test_parleys_int8_model_is_closer_to_float_than_torchs():
    """Both kernels share the int8 weights; ours keeps the activations fp32 where torch's rounds
    them to bf16, so its logits stay nearer the float model's over a stream."""
    model = trained_looking(SttModel(SttConfig(width=64, depth=2)), seed=5)
    forms = {"float": FrozenSttModel(model, int8=False), "parley": FrozenSttModel(model, kernel="parley"),
             "torch": FrozenSttModel(model, kernel="torch")}
    states = {name: form.initial_state(1) for name, form in forms.items()}
    errors = {"parley": 0.0, "torch": 0.0}
    for _ in range(30):
        x = torch.randn(1, 320)
        logits = {}
        for name, form in forms.items():
            logits[name], _, states[name] = form.step(x, states[name])
        for name in errors:
            errors[name] = max(errors[name], (logits[name] - logits["float"]).abs().max().item())
    assert errors["parley"] < errors["torch"]


@needs_kernel
def test_bad_arguments_are_refused_with_a_reason():
    weight, scale, bias = torch.zeros(8, 16, dtype=torch.int8), torch.ones(8), torch.zeros(8)
    with pytest.raises(RuntimeError, match="x must be fp32"):
        torch.ops.parley.int8_linear(torch.zeros(2, 16, dtype=torch.float64), weight, scale, bias)
    with pytest.raises(RuntimeError, match=r"must be \[rows, 16\]"):
        torch.ops.parley.int8_linear(torch.zeros(2, 24), weight, scale, bias)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.parley.int8_linear(torch.zeros(2, 12), torch.zeros(8, 12, dtype=torch.int8), scale, bias)
    with pytest.raises(RuntimeError, match="scale must be fp32"):
        torch.ops.parley.int8_linear(torch.zeros(2, 16), weight, scale.bfloat16(), bias)
    with pytest.raises(RuntimeError, match="one value per row"):
        torch.ops.parley.int8_linear(torch.zeros(2, 16), weight, scale, bias, torch.ones(3, 1))
    stack = FrozenStack(RecurrentStack(32, 1, 1, 2), int8=True, kernel="parley")
    with pytest.raises(RuntimeError, match="state does not fit"):
        torch.ops.parley.stack_step(torch.zeros(2, 32), [s.conv for s in stack.initial_state(1)],
                                    [s.h for s in stack.initial_state(1)], stack.compiled_weights)
    with pytest.raises(RuntimeError, match="weight tensors per block"):
        torch.ops.parley.stack_step(torch.zeros(1, 32), [], [], stack.compiled_weights)


def test_kernel_choice_is_checked():
    with pytest.raises(ValueError, match="int8 kernel must be one of"):
        check_int8_kernel("avx9000")
    assert check_int8_kernel("torch") == "torch"


def test_the_torch_kernel_can_be_chosen_by_environment():
    """PARLEY_INT8_KERNEL=torch: the engine steps with torch's kernel and loads nothing of ours."""
    script = ("import torch; from engine.inference import OWN_INT8_KERNEL, default_int8_kernel; "
              "print(OWN_INT8_KERNEL, default_int8_kernel(), hasattr(torch.ops.parley, 'int8_linear'))")
    env = dict(os.environ, PARLEY_INT8_KERNEL="torch")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "torch", "False"]
