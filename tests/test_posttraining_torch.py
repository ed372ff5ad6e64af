"""Post-training ops against PyTorch autograd (float64, 1e-10 relative)."""
import numpy as np
import pytest

from numpytfmr.lora import lora_linear_backward, lora_linear_forward
from numpytfmr.preference import (
    bradley_terry_loss_backward,
    bradley_terry_loss_forward,
    dpo_loss_backward,
    dpo_loss_forward,
    sequence_logprobs_backward,
    sequence_logprobs_forward,
)
from numpytfmr.registry import bind, posttraining

torch = pytest.importorskip("torch")
F = torch.nn.functional

SPECS = {s.name: s for s in posttraining.OPS}


def cases(name):
    return SPECS[name].make_cases(np.random.default_rng(0), np.float64)


def t(a, grad=False):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def assert_close(ours, theirs):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-13)


def _lora_torch(x, W, A, B, b, scale, mask):
    xd = x if mask is None else x * t(mask)
    y = x @ W + scale * (xd @ A) @ B
    return y if b is None else y + b


@pytest.mark.parametrize("case", cases("lora_linear"), ids=lambda c: c.label)
def test_lora_linear(case):
    out, cache = bind(lora_linear_forward, case.kwargs)(*case.args)
    dout = np.random.default_rng(1).standard_normal(out.shape)
    dx, dW, dA, dB, db = lora_linear_backward(dout, cache)
    x, A, B = (t(a, True) for a in (case.args[0], case.args[2], case.args[3]))
    W = t(case.args[1])
    b = None if case.args[4] is None else t(case.args[4])
    drop = cache["drop"]                          # the dropout on the branch: mask * 1/(1-p)
    mask = None if drop["mask"] is None else drop["mask"] * drop["scale"]
    y = _lora_torch(x, W, A, B, b, cache["scale"], mask)
    y.backward(t(dout))
    assert_close(out, y)
    assert_close(dx, x.grad)
    assert_close(dA, A.grad)
    assert_close(dB, B.grad)
    assert dW is None and db is None


def test_lora_matches_the_notes_pytorch_layout():
    # 000 §2.7.2 listing: weight (out, in), A (r, in), B (out, r),
    # y = F.linear(x, weight) + F.linear(x, B @ A) * alpha / r
    rng = np.random.default_rng(2)
    x, W = rng.standard_normal((3, 7)), rng.standard_normal((7, 5))
    A, B = rng.standard_normal((7, 2)), rng.standard_normal((2, 5))
    out, _ = lora_linear_forward(x, W, A, B, alpha=3.0)
    y = F.linear(t(x), t(W.T)) + F.linear(t(x), t(B.T) @ t(A.T)) * (3.0 / 2)
    assert_close(out, y)


@pytest.mark.parametrize("case", cases("sequence_logprobs"), ids=lambda c: c.label)
def test_sequence_logprobs(case):
    logits, targets, mask = case.args
    out, cache = sequence_logprobs_forward(logits, targets, mask)
    dout = np.random.default_rng(3).standard_normal(out.shape)
    dlogits = sequence_logprobs_backward(dout, cache)[0]
    L = t(logits, True)
    m = torch.tensor(np.asarray(mask) != 0)
    ids = torch.tensor(np.where(np.asarray(mask) != 0, targets, 0))
    picked = torch.gather(F.log_softmax(L, dim=-1), -1, ids.unsqueeze(-1)).squeeze(-1)
    y = torch.where(m, picked, torch.zeros_like(picked)).sum(-1)
    y.backward(t(dout))
    assert_close(out, y)
    assert_close(dlogits, L.grad)


def _dpo_torch(pc, pr, rc, rr, beta, eps, loss_type):
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    return losses.mean()


@pytest.mark.parametrize("case", cases("dpo_loss"), ids=lambda c: c.label)
def test_dpo_loss(case):
    kw = case.kwargs
    loss, cache = dpo_loss_forward(*case.args, **kw)
    dpc, dpr, drc, drr = dpo_loss_backward(0.7, cache)
    pc, pr = t(case.args[0], True), t(case.args[1], True)
    rc, rr = t(case.args[2]), t(case.args[3])
    eps = kw.get("label_smoothing", 0.0)
    eps = t(eps) if isinstance(eps, np.ndarray) else eps
    y = _dpo_torch(pc, pr, rc, rr, kw.get("beta", 0.1), eps, kw.get("loss_type", "sigmoid"))
    y.backward(t(0.7))
    assert_close(loss, y)
    assert_close(dpc, pc.grad)
    assert_close(dpr, pr.grad)
    assert drc is None and drr is None
    # TRL's reward metrics
    assert_close(cache["chosen_rewards"], kw.get("beta", 0.1) * (pc - rc))
    assert_close(cache["rejected_rewards"], kw.get("beta", 0.1) * (pr - rr))


# label smoothing is defined for the sigmoid loss only (hinge/IPO refuse it, see test_preference)
@pytest.mark.parametrize("loss_type, eps", [("sigmoid", 0.0), ("sigmoid", 0.25), ("sigmoid", 0.5),
                                            ("hinge", 0.0), ("ipo", 0.0)])
def test_dpo_loss_every_type_and_smoothing(loss_type, eps):
    rng = np.random.default_rng(4)
    arrays = [-rng.uniform(5, 30, 9) for _ in range(4)]
    loss, cache = dpo_loss_forward(*arrays, beta=0.2, label_smoothing=eps, loss_type=loss_type)
    dpc, dpr, _, _ = dpo_loss_backward(1.0, cache)
    pc, pr, rc, rr = (t(a, i < 2) for i, a in enumerate(arrays))
    y = _dpo_torch(pc, pr, rc, rr, 0.2, eps, loss_type)
    y.backward()
    assert_close(loss, y)
    assert_close(dpc, pc.grad)
    assert_close(dpr, pr.grad)


@pytest.mark.parametrize("case", cases("bradley_terry_loss"), ids=lambda c: c.label)
def test_bradley_terry_loss(case):
    loss, cache = bradley_terry_loss_forward(*case.args)
    dc, dr = bradley_terry_loss_backward(1.3, cache)
    rc, rr = t(case.args[0], True), t(case.args[1], True)
    y = -F.logsigmoid(rc - rr).mean()
    y.backward(t(1.3))
    assert_close(loss, y)
    assert_close(dc, rc.grad)
    assert_close(dr, rr.grad)
