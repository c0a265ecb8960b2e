"""Label-smoothed loss: matches torch's cross-entropy, ignores padding."""

import pytest
import torch
import torch.nn.functional as F

from transformer.training.loss import chunk_loss, chunk_rows, generator_loss, label_smoothed_nll


def test_matches_torch_cross_entropy_and_ignores_pad():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0
    target[2, 1:] = 0
    loss, nll = label_smoothed_nll(logits, target, 0.1, pad_id=0)
    want = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1, reduction="sum")
    want_nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(nll, want_nll)


def test_padding_logits_do_not_matter():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 7)
    target = torch.tensor([[3, 4, 0, 0], [5, 6, 2, 0]])
    changed = logits.clone()
    changed[0, 2:] = 1e4
    assert torch.equal(label_smoothed_nll(logits, target, 0.1, 0)[0], label_smoothed_nll(changed, target, 0.1, 0)[0])


def test_generator_loss_equals_projection_then_loss_in_value_and_gradients():
    """The fused path (300 rows: three chunks, the last one short) against logits made whole, fp32 and bf16."""
    torch.manual_seed(2)
    for precision, tol in (("fp32", 1e-5), ("bf16", 2e-2)):
        hidden = torch.randn(3, 100, 16, requires_grad=True)
        weight = torch.randn(37, 16, requires_grad=True)
        target = torch.randint(1, 37, (3, 100))
        target[1, 60:] = 0
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
        with autocast:
            got = generator_loss(hidden, weight, target, 0.1, 0)
        got_grads = torch.autograd.grad(got[0] * 0.5, (hidden, weight))
        with autocast:
            want = label_smoothed_nll(F.linear(hidden, weight), target, 0.1, 0)
        want_grads = torch.autograd.grad(want[0] * 0.5, (hidden, weight))
        for a, b in zip(got + got_grads, want + want_grads):
            assert a.dtype == b.dtype
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
        assert not got_grads[0][1, 60:].any()  # padding positions get no gradient
        assert not got[1].requires_grad  # the NLL is for logging


def test_generator_loss_without_gradients():
    hidden, weight = torch.randn(5, 8), torch.randn(11, 8)
    target = torch.tensor([3, 4, 0, 5, 6])
    with torch.inference_mode():
        loss, nll = generator_loss(hidden, weight, target, 0.1, 0)
    want = label_smoothed_nll(hidden @ weight.t(), target, 0.1, 0)
    torch.testing.assert_close((loss, nll), want)


def test_chunks_are_cache_sized_on_cpu_and_large_on_gpu():
    assert chunk_rows(torch.device("cpu"), 8000) == 128
    assert chunk_rows(torch.device("cuda"), 8000) == 2**26 // 8000
    assert chunk_rows(torch.device("cuda"), 10**7) == 128  # never fewer rows than on a CPU


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_chunk_scores_as_the_eager_one(backend):
    """generator_loss with its chunk compiled (train.compile's loss; aot_eager traces as inductor does, inductor
    also fuses): the same values and gradients, fp32 and bf16, over three chunks of 128 rows, the last one short."""
    torch.manual_seed(3)
    compiled = torch.compile(chunk_loss, backend=backend, dynamic=True)
    for precision, tol in (("fp32", 1e-5), ("bf16", 1e-2)):
        hidden = torch.randn(3, 100, 16, requires_grad=True)
        weight = torch.randn(37, 16, requires_grad=True)
        target = torch.randint(1, 37, (3, 100))
        target[1, 60:] = 0
        results = []
        for chunk in (chunk_loss, compiled):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss, nll = generator_loss(hidden, weight, target, 0.1, 0, chunk=chunk)
            results.append((loss, nll, *torch.autograd.grad(loss, (hidden, weight))))
        for a, b in zip(*results):
            assert a.dtype == b.dtype
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
