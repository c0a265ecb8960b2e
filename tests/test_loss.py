"""Label-smoothed loss: matches torch's cross-entropy, ignores padding."""

import torch
import torch.nn.functional as F

from transformer.loss import label_smoothed_nll


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


def test_hand_written_gradient_matches_autograd_of_torch_cross_entropy():
    torch.manual_seed(2)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        logits = torch.randn(2, 6, 13, dtype=dtype, requires_grad=True)
        target = torch.randint(1, 13, (2, 6))
        target[1, 4:] = 0
        (got,) = torch.autograd.grad(label_smoothed_nll(logits, target, 0.1, 0)[0] * 0.5, logits)
        want_loss = F.cross_entropy(logits.float().view(-1, 13), target.view(-1), ignore_index=0, label_smoothing=0.1,
                                    reduction="sum")
        (want,) = torch.autograd.grad(want_loss * 0.5, logits)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        assert not got[1, 4:].any()  # padding gets no gradient
