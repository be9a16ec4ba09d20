"""engine.ssm: the parallel scan, step-by-step and random chunkings agree within 1e-4."""

import random

import torch

from engine.ssm import RecurrentStack, linear_scan


def run_steps(stack, x):
    state = stack.initial_state(x.shape[0])
    outputs = []
    for t in range(x.shape[1]):
        y, state = stack.step(x[:, t], state)
        outputs.append(y)
    return torch.stack(outputs, dim=1), state


def run_chunks(stack, x, rng):
    state = stack.initial_state(x.shape[0])
    outputs, t = [], 0
    while t < x.shape[1]:
        size = rng.randint(1, 70)
        y, state = stack(x[:, t:t + size], state)
        outputs.append(y)
        t += size
    return torch.cat(outputs, dim=1), state


def test_linear_scan_matches_the_recurrence():
    torch.manual_seed(0)
    log_a = -torch.rand(3, 150, 8) * 3
    u = torch.randn(3, 150, 8)
    h0 = torch.randn(3, 8)
    h, last = linear_scan(log_a, u, h0, chunk=32)
    expected, state = [], h0
    for t in range(150):
        state = torch.exp(log_a[:, t]) * state + u[:, t]
        expected.append(state)
    assert torch.allclose(h, torch.stack(expected, 1), atol=1e-5)
    assert torch.allclose(last, state, atol=1e-5)


def test_linear_scan_survives_decays_that_forget_everything():
    # exp(-A) of the closed form would overflow without the floor on each step's log decay
    log_a = torch.full((2, 100, 4), -1000.0)
    u, h0 = torch.randn(2, 100, 4), torch.randn(2, 4)
    h, last = linear_scan(log_a, u, h0)
    assert torch.isfinite(h).all()
    assert torch.allclose(h, u, atol=1e-6) and torch.allclose(last, u[:, -1], atol=1e-6)


def test_parallel_equals_step_equals_random_chunks():
    torch.manual_seed(1)
    stack = RecurrentStack(width=32, depth=3, expand=2).eval()
    x = torch.randn(2, 203, 32)
    with torch.no_grad():
        full, full_state = stack(x)
        stepped, step_state = run_steps(stack, x)
        chunked, chunk_state = run_chunks(stack, x, random.Random(4))
    assert (full - stepped).abs().max() < 1e-4
    assert (full - chunked).abs().max() < 1e-4
    for a, b, c in zip(full_state, step_state, chunk_state):
        assert (a.h - b.h).abs().max() < 1e-4 and (a.h - c.h).abs().max() < 1e-4
        assert (a.conv - b.conv).abs().max() < 1e-4 and (a.conv - c.conv).abs().max() < 1e-4


def test_state_is_fixed_size_and_fp32():
    stack = RecurrentStack(width=64, depth=2)
    state = stack.initial_state(5)
    with torch.no_grad():
        _, after = stack(torch.randn(5, 300, 64), state)
    for before, now in zip(state, after):
        assert before.h.shape == now.h.shape and before.conv.shape == now.conv.shape
        assert now.h.dtype == torch.float32


def test_gradients_flow_through_the_scan():
    torch.manual_seed(2)
    stack = RecurrentStack(width=16, depth=2)
    x = torch.randn(2, 100, 16, requires_grad=True)
    y, _ = stack(x)
    y.pow(2).mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in stack.parameters())
