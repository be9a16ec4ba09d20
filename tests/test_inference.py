"""The frozen forms (engine/inference.py): the same math and state as RecurrentStack.step and .forward."""

from __future__ import annotations

import pytest
import torch

from engine.inference import FrozenStack, PackedLinear, int8_supported
from engine.ssm import RecurrentStack
from engine.stt import FrozenSttModel, SttConfig, SttModel, streaming_model
from engine.tts import FrozenTts, TtsConfig, TtsModel, inference_model

needs_int8 = pytest.mark.skipif(not int8_supported(), reason="this torch build has no int8 weight-only matmul")


def trained_looking(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights, with norm gains and conv taps away from their initial values, so a
    gain folded into the wrong matrix shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith(("norm.weight", "conv.weight", "conv.bias")):
                parameter.uniform_(0.5, 1.5) if name.endswith("norm.weight") else parameter.normal_(0, 0.5)
    return module.eval()


def assert_same_outputs_and_states(stack: RecurrentStack, frozen_result: tuple, stack_result: tuple) -> None:
    """A FrozenStack's (output before the final norm, state, norm gain) against the stack's (output, state)."""
    z, frozen_state, norm_gain = frozen_result
    y, state = stack_result
    torch.testing.assert_close(z * norm_gain * stack.final_norm.weight, y, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(frozen_state, state):
        torch.testing.assert_close(ours.conv, theirs.conv, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.h, theirs.h, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width, depth, expand, mlp_ratio", [(48, 2, 1, 2), (32, 3, 2, 3)])
@torch.no_grad()
def test_frozen_fp32_stack_steps_like_the_stack(width, depth, expand, mlp_ratio):
    stack = trained_looking(RecurrentStack(width, depth, expand, mlp_ratio), seed=width)
    frozen = FrozenStack(stack, int8=False)
    state, frozen_state = stack.initial_state(3), frozen.initial_state(3)
    for _ in range(20):
        x = torch.randn(3, width) * 2
        y, state = stack.step(x, state)
        z, frozen_state, norm_gain = frozen.step(x, frozen_state)
        assert_same_outputs_and_states(stack, (z, frozen_state, norm_gain), (y, state))


@torch.no_grad()
def test_frozen_fp32_stt_model_steps_like_the_model():
    model = trained_looking(SttModel(SttConfig(width=48, depth=2)), seed=1)
    frozen = FrozenSttModel(model, int8=False)
    state, frozen_state = model.initial_state(2), frozen.initial_state(2)
    for _ in range(20):
        x = torch.randn(2, 320)
        ctc, eot, state = model.step(x, state)
        frozen_ctc, frozen_eot, frozen_state = frozen.step(x, frozen_state)
        torch.testing.assert_close(frozen_ctc, ctc, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(frozen_eot, eot, atol=1e-5, rtol=1e-5)


@needs_int8
@torch.no_grad()
def test_int8_products_are_close_and_rows_are_independent():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 96)
    packed = PackedLinear(layer.weight, layer.bias, int8=True)
    assert packed.weight.dtype == torch.int8 and packed.weight.shape == (96, 256)
    x = torch.randn(5, 256)
    exact = layer(x)
    assert ((packed(x) - exact).abs().max() / exact.abs().max()) < 0.02
    x[2] = 1e4  # one loud row changes nothing in the others
    torch.testing.assert_close(packed(x)[[0, 1, 3, 4]], packed(x[[0, 1, 3, 4]]), atol=0.05, rtol=0.01)


def test_int8_rounding_is_against_the_scale_the_kernel_uses():
    """Each weight, rebuilt from its int8 value and the row's bf16 scale, is within half a step."""
    torch.manual_seed(1)
    weight = torch.randn(512, 64) * torch.rand(512, 1) * 3
    packed = PackedLinear(weight, torch.zeros(512), int8=True)
    step = packed.scale.float()[:, None]
    error = (packed.weight.float() * step - weight).abs() / step
    assert error.max() <= 0.5 + 1e-3


@needs_int8
def test_frozen_form_is_reused_until_a_weight_changes():
    model = SttModel(SttConfig(width=32, depth=1))
    first = streaming_model(model, "int8")
    assert streaming_model(model, "int8") is first
    with torch.no_grad():
        model.eot_head.bias.add_(1.0)  # as an optimizer step would
    second = streaming_model(model, "int8")
    assert second is not first
    x, state = torch.randn(1, 320), model.initial_state(1)
    torch.testing.assert_close(second.step(x, state)[1], model.step(x, state)[1], atol=0.05, rtol=0.02)


def test_precision_choice():
    model = SttModel(SttConfig(width=32, depth=1))
    assert streaming_model(model, "float") is model
    assert isinstance(streaming_model(model, "auto"), FrozenSttModel) == int8_supported()
    with pytest.raises(ValueError, match="precision must be one of"):
        streaming_model(model, "fp8")
    half = SttModel(SttConfig(width=32, depth=1)).to(torch.bfloat16)
    assert streaming_model(half, "auto") is half  # asked for bf16: steps in bf16


@pytest.mark.parametrize("chunks", [[1, 7, 32, 5], [40]])
@torch.no_grad()
def test_frozen_fp32_stack_scans_like_the_stack(chunks):
    """FrozenStack.scan (T frames at once, as the TTS renders) equals RecurrentStack.forward,
    state carried across calls of any length."""
    stack = trained_looking(RecurrentStack(40, 2, 1, 2), seed=len(chunks))
    frozen = FrozenStack(stack, int8=False)
    state, frozen_state = stack.initial_state(2), frozen.initial_state(2)
    for frames in chunks:
        x = torch.randn(2, frames, 40) * 2
        y, state = stack(x, state)
        z, frozen_state, norm_gain = frozen.scan(x, frozen_state)
        assert_same_outputs_and_states(stack, (z, frozen_state, norm_gain), (y, state))


@torch.no_grad()
def test_frozen_tts_encodes_like_the_model():
    model = trained_looking(TtsModel(TtsConfig(width=32, encoder_depth=2)), seed=3)
    frozen = FrozenTts(model)
    ids = torch.randint(1, 40, (2, 9))
    encoder_state, history = model.encoder.initial_state(2), torch.randn(2, model.config.lookahead, 32)
    vectors, state, new_history = model.encode(ids, encoder_state, history)
    frozen_vectors, frozen_state, frozen_history = frozen.encode(ids, encoder_state, history)
    torch.testing.assert_close(frozen_vectors, vectors, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(frozen_history, new_history)
    torch.testing.assert_close(frozen_state[-1].h, state[-1].h, atol=1e-5, rtol=1e-5)


def test_tts_runs_its_frozen_form_on_cpu_until_a_weight_changes():
    model = TtsModel(TtsConfig(width=32, encoder_depth=1))
    first = inference_model(model)
    assert isinstance(first, FrozenTts) and inference_model(model) is first
    with torch.no_grad():
        model.phoneme_out.bias.add_(1.0)  # as an optimizer step would
    assert inference_model(model) is not first
    half = TtsModel(TtsConfig(width=32, encoder_depth=1)).to(torch.bfloat16)
    assert inference_model(half) is half  # half precision runs the model itself


def test_the_frame_step_is_compiled():
    """A change TorchScript cannot compile would fall back to Python (inference.script) and
    silently cost a CPU stream a third of its speed: it must fail here instead."""
    from engine import inference

    for function in (inference.packed_product, inference.block_step, inference.stack_step):
        assert isinstance(function, torch.jit.ScriptFunction), function
