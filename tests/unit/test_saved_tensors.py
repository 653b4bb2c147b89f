"""Copy-on-write of the tensors autograd saves (treegrpo/saved_tensors.py), on a block shaped like Flux's double
block: a residual stream saved by a norm, then updated in place, then saved again and updated again."""
import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from treegrpo.saved_tensors import copy_on_write_saved


def block(x, w1, w2):
    x = x.clone()                       # the block's own copy of its input, as checkpoint_patches makes
    x += torch.tanh(x @ w1)             # x saved by the matmul and tanh's output saved, then x updated in place
    x += torch.layer_norm(x, x.shape[-1:]) @ w2   # layer_norm saves the updated x, which is updated once more
    return x


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=g, dtype=torch.float64)
    w1 = torch.randn(8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(8, 8, generator=g, dtype=torch.float64, requires_grad=True)
    return x, w1, w2


def _grads(run):
    x, w1, w2 = _inputs()
    (run(x, w1, w2) ** 2).sum().backward()
    return w1.grad, w2.grad


def _reference():
    """The same function written without any in-place update: what autograd computes exactly."""
    def pure(x, w1, w2):
        y = x + torch.tanh(x @ w1)
        return y + torch.layer_norm(y, y.shape[-1:]) @ w2
    return _grads(pure)


def test_plain_autograd_refuses_the_block_and_copy_on_write_makes_it_exact():
    x, w1, w2 = _inputs()
    try:
        (block(x, w1, w2) ** 2).sum().backward()
        raise AssertionError("autograd accepted a tensor modified after it was saved")
    except RuntimeError as e:
        assert "inplace operation" in str(e)

    def protected(x, w1, w2):
        with copy_on_write_saved() as mode:
            out = block(x, w1, w2)
        assert mode.copies >= 2 and mode.copied_bytes > 0     # the stream, twice; nothing else
        return out

    for got, want in zip(_grads(protected), _reference()):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_checkpoint_without_it_is_silently_wrong_and_with_it_exact():
    wrong = _grads(lambda x, w1, w2: checkpoint(block, x, w1, w2, use_reentrant=False))
    right = _grads(lambda x, w1, w2: checkpoint(
        block, x, w1, w2, use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), copy_on_write_saved())))
    ref = _reference()
    assert max((a - b).abs().max().item() for a, b in zip(wrong, ref)) > 1e-3   # the bug issue 30 found, in torch
    for got, want in zip(right, ref):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_nothing_is_copied_when_nothing_saved_is_written():
    x, w1, _ = _inputs()
    with copy_on_write_saved() as mode:
        y = torch.tanh(x @ w1)
        z = y * 2
        z += 1          # z was never saved (mul by a constant saves nothing)
    assert mode.copies == 0
    z.sum().backward()
    torch.testing.assert_close(w1.grad, x.T @ (2 * (1 - y.detach() ** 2)))
