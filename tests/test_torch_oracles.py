"""Cross-cutting: the PyTorch oracles. Every op against torch autograd in float64, forward
values and gradients to 1e-10 relative, under the ``torch`` marker (``pytest -m torch``); the
whole file skips where torch is not installed.

- core ops (registry/core.py): every case of every op through numpytfmr and through the
  matching torch.nn.functional composition, with the same random upstream gradient;
- attention: ``scaled_dot_product_attention`` for attention_forward (boolean masks True =
  may attend there too) and ``torch.nn.MultiheadAttention`` for mha_forward, whose weights map
  as in_proj_weight = [Wq^T; Wk^T; Wv^T], out_proj.weight = Wo^T (torch computes x W^T + b)
  and whose boolean masks mean the opposite (True = may NOT attend);
- post-training: LoRA, sequence log-probabilities, DPO and Bradley-Terry.
"""
import numpy as np
import pytest

from numpytfmr import attention_backward, attention_forward, causal_mask, mha_backward, mha_forward
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
from numpytfmr.registry.core import OPS

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.torch


# ---------------------------------------------------------------------------------------
# Core ops
# ---------------------------------------------------------------------------------------

CORE_SPECS = {spec.name: spec for spec in OPS}
CORE_CASES = [(spec.name, i) for spec in OPS
         for i, _ in enumerate(spec.make_cases(np.random.default_rng(0), np.float64))]


def _t(a):
    """A float64 leaf tensor that records its gradient (integer arrays become plain tensors)."""
    if a is None:
        return None
    if a.dtype.kind == "f":
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)
    return torch.tensor(a)


def _torch_linear(x, W, b=None):
    return F.linear(x, W.T, b)  # torch stores W as (d_out, d_in)


_TORCH_ACT = {
    "relu": F.relu,
    "gelu": lambda h: F.gelu(h, approximate="none"),
    "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
}


def _torch_reference(name, args, kwargs, cache):
    """out = the torch computation of op ``name`` on the tensors ``args``."""
    if name == "linear":
        return _torch_linear(*args)
    if name == "relu":
        return F.relu(args[0])
    if name == "gelu":
        return F.gelu(args[0], approximate=kwargs.get("approximate", "none"))
    if name == "softmax":
        return F.softmax(args[0], dim=kwargs.get("axis", -1))
    if name == "log_softmax":
        return F.log_softmax(args[0], dim=kwargs.get("axis", -1))
    if name == "cross_entropy":
        logits, targets = args
        K = logits.shape[-1]
        ignore = kwargs.get("ignore_index")
        return F.cross_entropy(logits.reshape(-1, K), targets.reshape(-1),  # classes last -> (N, K)
                               label_smoothing=kwargs.get("label_smoothing", 0.0),
                               ignore_index=-100 if ignore is None else ignore)
    if name == "layernorm":
        x, gamma, beta = args
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps=kwargs.get("eps", 1e-5))
    if name == "rmsnorm":
        x, gamma = args
        return F.rms_norm(x, (x.shape[-1],), gamma, eps=kwargs.get("eps", 1e-6))
    if name == "embedding":
        ids, table = args
        return F.embedding(ids, table)
    if name == "dropout":  # the same mask as ours: torch's own RNG draws differ
        if cache["mask"] is None:
            return args[0] * 1.0
        return args[0] * torch.tensor(cache["mask"]) * cache["scale"]
    if name == "ffn":
        x, W1, b1, W2, b2 = args
        h = _torch_linear(x, W1, b1)
        return _torch_linear(_TORCH_ACT[kwargs.get("activation", "relu")](h), W2, b2)
    if name == "silu":
        return F.silu(args[0])
    if name == "swiglu_ffn":
        x, W_gate, W_up, W_down = args
        act = {"silu": F.silu, **_TORCH_ACT}[kwargs.get("activation", "silu")]
        return _torch_linear(act(_torch_linear(x, W_gate)) * _torch_linear(x, W_up), W_down)
    raise AssertionError(f"no torch reference for {name}")


def _assert_close(ours, ref, what):
    ref = np.asarray(ref)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-300)
    # 1e-10 relative, elementwise, with an absolute floor of 1e-10 of the array's scale for
    # entries that are tiny by cancellation (e.g. a LayerNorm gradient, a GELU tail)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10 * scale, err_msg=what)


@pytest.mark.parametrize("name,i", CORE_CASES)
def test_forward_and_gradients_match_torch(name, i):
    spec = CORE_SPECS[name]
    case = spec.make_cases(np.random.default_rng(0), np.float64)[i]
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    if name == "cross_entropy" and case.kwargs.get("ignore_index") is not None \
            and np.all(case.args[1] == case.kwargs["ignore_index"]):
        # torch returns 0/0 = nan here; ours is defined as 0 with a zero gradient
        assert float(out) == 0.0
        assert np.all(spec.backward(np.float64(1.0), cache)[0] == 0)
        return
    dout = np.random.default_rng(100 + i).standard_normal(np.shape(out))
    grads = spec.backward(dout, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)

    targs = [_t(a) for a in case.args]
    ref = _torch_reference(name, targs, case.kwargs, cache)
    _assert_close(out, ref.detach().numpy(), f"{name} [{case.label}] forward")
    (ref * torch.tensor(dout)).sum().backward()
    for k, (a, g) in enumerate(zip(targs, grads)):
        if a is None or not a.is_floating_point():
            assert g is None, f"{name}: input {k} should have no gradient"
            continue
        _assert_close(g, a.grad.numpy(), f"{name} [{case.label}] gradient of input {k}")


def test_cross_entropy_matches_torch_on_a_larger_batch_with_everything():
    from numpytfmr import cross_entropy_backward, cross_entropy_forward
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((4, 9, 13)) * 3
    targets = rng.integers(0, 13, size=(4, 9))
    targets[rng.random((4, 9)) < 0.3] = 5  # ignore class 5 wherever it appears
    for eps in (0.0, 0.05, 0.5, 1.0):
        loss, cache = cross_entropy_forward(logits, targets, label_smoothing=eps, ignore_index=5)
        tl = torch.tensor(logits, requires_grad=True)
        ref = F.cross_entropy(tl.reshape(-1, 13), torch.tensor(targets).reshape(-1),
                              label_smoothing=eps, ignore_index=5)
        ref.backward(torch.tensor(0.7, dtype=torch.float64))
        _assert_close(loss, ref.item(), f"loss eps={eps}")
        _assert_close(cross_entropy_backward(0.7, cache)[0], tl.grad.numpy(), f"dlogits eps={eps}")


def test_gelu_matches_torch_on_a_dense_grid():
    from numpytfmr import gelu_backward, gelu_forward
    x = np.linspace(-5, 12, 3401)
    for form in ("none", "tanh"):
        out, cache = gelu_forward(x, approximate=form)
        tx = torch.tensor(x, requires_grad=True)
        ref = F.gelu(tx, approximate=form)
        ref.sum().backward()
        _assert_close(out, ref.detach().numpy(), f"gelu {form}")
        _assert_close(gelu_backward(np.ones_like(x), cache), tx.grad.numpy(), f"gelu' {form}")


# ---------------------------------------------------------------------------------------
# Attention and multi-head attention
# ---------------------------------------------------------------------------------------

def _close_rel(ours, theirs, what=""):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert ours.shape == theirs.shape, what
    # relative to the array's size; the small absolute floor covers gradients that are
    # mathematically 0 (the key bias), where both sides hold only rounding noise
    err = np.abs(ours - theirs).max()
    assert err <= 1e-10 * np.abs(theirs).max() + 1e-14, f"{what}: max abs difference {err:.3g}"


def _leaf(a, grad=True):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


_SDPA_CASES = {
    "plain": ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4), None, None),
    "causal": ((2, 4, 6), (2, 4, 6), (2, 4, 6), "causal", None),
    "n_q=2 < n_k=5, cached-step causal": ((2, 2, 2, 4), (2, 2, 5, 4), (2, 2, 5, 4), "causal", None),
    "d_k=6 != d_v=3, scale 0.3": ((3, 4, 6), (3, 5, 6), (3, 5, 3), None, 0.3),
    "padding + causal": ((2, 4, 3), (2, 4, 3), (2, 4, 2), "padding", None),
    "float bias": ((2, 3, 4), (2, 5, 4), (2, 5, 4), "bias", None),
}


@pytest.mark.parametrize("name", list(_SDPA_CASES))
def test_attention_matches_scaled_dot_product_attention(name):
    sq, sk, sv, kind, scale = _SDPA_CASES[name]
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal(sq), rng.standard_normal(sk), rng.standard_normal(sv)
    n_q, n_k = sq[-2], sk[-2]
    mask = bias = torch_mask = None
    if kind == "causal":
        mask = causal_mask(n_q, n_k)
        torch_mask = torch.tensor(mask)
    elif kind == "padding":
        mask = causal_mask(n_q, n_k) & (np.arange(n_k) < np.array([4, 2])[:, None, None])
        torch_mask = torch.tensor(mask)
    elif kind == "bias":
        bias = rng.standard_normal((n_q, n_k))
        torch_mask = torch.tensor(bias)
    out, cache = attention_forward(Q, K, V, mask=mask, bias=bias, scale=scale)
    tQ, tK, tV = _leaf(Q), _leaf(K), _leaf(V)
    t_out = F.scaled_dot_product_attention(tQ, tK, tV, attn_mask=torch_mask, scale=scale)
    _close_rel(out, t_out, "out")
    dout = rng.standard_normal(out.shape)
    t_out.backward(torch.tensor(dout))
    for g, t, n in zip(attention_backward(dout, cache), (tQ, tK, tV), "QKV"):
        _close_rel(g, t.grad, f"d{n}")


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_grouped_attention_matches_sdpa_enable_gqa(n_kv_heads):
    """GQA as fast.mha_forward does it: query heads grouped (B, n_kv, group, n, d), K/V broadcast
    over the group."""
    if "enable_gqa" not in F.scaled_dot_product_attention.__doc__:
        pytest.skip("this torch has no enable_gqa")
    rng = np.random.default_rng(1)
    B, H, n, d = 2, 6, 4, 3
    g = H // n_kv_heads
    Q = rng.standard_normal((B, H, n, d))
    K, V = rng.standard_normal((B, n_kv_heads, n, d)), rng.standard_normal((B, n_kv_heads, n, d))
    mask = causal_mask(n)
    out, cache = attention_forward(Q.reshape(B, n_kv_heads, g, n, d), K[:, :, None], V[:, :, None],
                                   mask=mask)
    tQ, tK, tV = _leaf(Q), _leaf(K), _leaf(V)
    t_out = F.scaled_dot_product_attention(tQ, tK, tV, attn_mask=torch.tensor(mask), enable_gqa=True)
    _close_rel(out.reshape(B, H, n, d), t_out, "out")
    dout = rng.standard_normal((B, H, n, d))
    t_out.backward(torch.tensor(dout))
    dQ, dK, dV = attention_backward(dout.reshape(out.shape), cache)
    _close_rel(dQ.reshape(B, H, n, d), tQ.grad, "dQ")
    _close_rel(dK[:, :, 0], tK.grad, "dK")
    _close_rel(dV[:, :, 0], tV.grad, "dV")


@pytest.mark.parametrize("self_attn,biases,masked", [(True, True, True), (True, False, False),
                                                     (False, True, True), (False, False, False)])
def test_mha_matches_torch_multihead_attention(self_attn, biases, masked):
    rng = np.random.default_rng(2)
    B, E, H = 2, 8, 2
    n_q, n_k = (4, 4) if self_attn else (3, 5)
    x_q = rng.standard_normal((B, n_q, E))
    x_kv = x_q if self_attn else rng.standard_normal((B, n_k, E))
    s = E ** -0.5
    Wq, Wk, Wv, Wo = (rng.standard_normal((E, E)) * s for _ in range(4))
    bq, bk, bv, bo = (rng.standard_normal(E) * 0.3 for _ in range(4)) if biases else [None] * 4
    mask = None
    if masked:
        mask = causal_mask(n_q, n_k) if self_attn else np.arange(n_k) < np.array([5, 3])[:, None, None, None]

    out, cache = mha_forward(x_q, x_kv, Wq, Wk, Wv, Wo, bq, bk, bv, bo, n_heads=H, mask=mask)

    m = torch.nn.MultiheadAttention(E, H, bias=biases, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.tensor(np.concatenate([Wq.T, Wk.T, Wv.T])))
        m.out_proj.weight.copy_(torch.tensor(Wo.T))
        if biases:
            m.in_proj_bias.copy_(torch.tensor(np.concatenate([bq, bk, bv])))
            m.out_proj.bias.copy_(torch.tensor(bo))
    tq = _leaf(x_q)
    tkv = tq if self_attn else _leaf(x_kv)
    kw = {}
    if masked and self_attn:
        kw["attn_mask"] = torch.tensor(~causal_mask(n_q, n_k))           # True = blocked
    elif masked:
        kw["key_padding_mask"] = torch.tensor(~mask[:, 0, 0, :])         # (B, n_k), True = pad
    t_out, t_w = m(tq, tkv, tkv, need_weights=True, average_attn_weights=False, **kw)
    _close_rel(out, t_out, "out")
    _close_rel(cache["weights"], t_w, "weights")

    dout = rng.standard_normal(out.shape)
    t_out.backward(torch.tensor(dout))
    dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo = mha_backward(dout, cache)
    if self_attn:
        _close_rel(dx_q + dx_kv, tq.grad, "dx")
    else:
        _close_rel(dx_q, tq.grad, "dx_q")
        _close_rel(dx_kv, tkv.grad, "dx_kv")
    gW = m.in_proj_weight.grad.numpy()
    _close_rel(dWq, gW[:E].T, "dWq")
    _close_rel(dWk, gW[E:2 * E].T, "dWk")
    _close_rel(dWv, gW[2 * E:].T, "dWv")
    _close_rel(dWo, m.out_proj.weight.grad.numpy().T, "dWo")
    if biases:
        gb = m.in_proj_bias.grad.numpy()
        _close_rel(dbq, gb[:E], "dbq")
        _close_rel(dbk, gb[E:2 * E], "dbk")
        _close_rel(dbv, gb[2 * E:], "dbv")
        _close_rel(dbo, m.out_proj.bias.grad, "dbo")
    else:
        assert dbq is dbk is dbv is dbo is None


# ---------------------------------------------------------------------------------------
# Post-training: LoRA, sequence log-probabilities, DPO, Bradley-Terry
# ---------------------------------------------------------------------------------------

POST_SPECS = {s.name: s for s in posttraining.OPS}


def post_cases(name):
    return POST_SPECS[name].make_cases(np.random.default_rng(0), np.float64)


def _tensor(a, grad=False):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def _close_post(ours, theirs):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-13)


def _lora_torch(x, W, A, B, b, scale, mask):
    xd = x if mask is None else x * _tensor(mask)
    y = x @ W + scale * (xd @ A) @ B
    return y if b is None else y + b


@pytest.mark.parametrize("case", post_cases("lora_linear"), ids=lambda c: c.label)
def test_lora_linear(case):
    out, cache = bind(lora_linear_forward, case.kwargs)(*case.args)
    dout = np.random.default_rng(1).standard_normal(out.shape)
    dx, dW, dA, dB, db = lora_linear_backward(dout, cache)
    x, A, B = (_tensor(a, True) for a in (case.args[0], case.args[2], case.args[3]))
    W = _tensor(case.args[1])
    b = None if case.args[4] is None else _tensor(case.args[4])
    drop = cache["drop"]                          # the dropout on the branch: mask * 1/(1-p)
    mask = None if drop["mask"] is None else drop["mask"] * drop["scale"]
    y = _lora_torch(x, W, A, B, b, cache["scale"], mask)
    y.backward(_tensor(dout))
    _close_post(out, y)
    _close_post(dx, x.grad)
    _close_post(dA, A.grad)
    _close_post(dB, B.grad)
    assert dW is None and db is None


def test_lora_matches_the_notes_pytorch_layout():
    # 000 §2.7.2 listing: weight (out, in), A (r, in), B (out, r),
    # y = F.linear(x, weight) + F.linear(x, B @ A) * alpha / r
    rng = np.random.default_rng(2)
    x, W = rng.standard_normal((3, 7)), rng.standard_normal((7, 5))
    A, B = rng.standard_normal((7, 2)), rng.standard_normal((2, 5))
    out, _ = lora_linear_forward(x, W, A, B, alpha=3.0)
    y = F.linear(_tensor(x), _tensor(W.T)) + F.linear(_tensor(x), _tensor(B.T) @ _tensor(A.T)) * (3.0 / 2)
    _close_post(out, y)


@pytest.mark.parametrize("case", post_cases("sequence_logprobs"), ids=lambda c: c.label)
def test_sequence_logprobs(case):
    logits, targets, mask = case.args
    out, cache = sequence_logprobs_forward(logits, targets, mask)
    dout = np.random.default_rng(3).standard_normal(out.shape)
    dlogits = sequence_logprobs_backward(dout, cache)[0]
    L = _tensor(logits, True)
    m = torch.tensor(np.asarray(mask) != 0)
    ids = torch.tensor(np.where(np.asarray(mask) != 0, targets, 0))
    picked = torch.gather(F.log_softmax(L, dim=-1), -1, ids.unsqueeze(-1)).squeeze(-1)
    y = torch.where(m, picked, torch.zeros_like(picked)).sum(-1)
    y.backward(_tensor(dout))
    _close_post(out, y)
    _close_post(dlogits, L.grad)


def _dpo_torch(pc, pr, rc, rr, beta, eps, loss_type):
    logits = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - eps) - F.logsigmoid(-beta * logits) * eps
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    return losses.mean()


@pytest.mark.parametrize("case", post_cases("dpo_loss"), ids=lambda c: c.label)
def test_dpo_loss(case):
    kw = case.kwargs
    loss, cache = dpo_loss_forward(*case.args, **kw)
    dpc, dpr, drc, drr = dpo_loss_backward(0.7, cache)
    pc, pr = _tensor(case.args[0], True), _tensor(case.args[1], True)
    rc, rr = _tensor(case.args[2]), _tensor(case.args[3])
    eps = kw.get("label_smoothing", 0.0)
    eps = _tensor(eps) if isinstance(eps, np.ndarray) else eps
    y = _dpo_torch(pc, pr, rc, rr, kw.get("beta", 0.1), eps, kw.get("loss_type", "sigmoid"))
    y.backward(_tensor(0.7))
    _close_post(loss, y)
    _close_post(dpc, pc.grad)
    _close_post(dpr, pr.grad)
    assert drc is None and drr is None
    # TRL's reward metrics
    _close_post(cache["chosen_rewards"], kw.get("beta", 0.1) * (pc - rc))
    _close_post(cache["rejected_rewards"], kw.get("beta", 0.1) * (pr - rr))


# label smoothing is defined for the sigmoid loss only (hinge/IPO refuse it, see test_preference)
@pytest.mark.parametrize("loss_type, eps", [("sigmoid", 0.0), ("sigmoid", 0.25), ("sigmoid", 0.5),
                                            ("hinge", 0.0), ("ipo", 0.0)])
def test_dpo_loss_every_type_and_smoothing(loss_type, eps):
    rng = np.random.default_rng(4)
    arrays = [-rng.uniform(5, 30, 9) for _ in range(4)]
    loss, cache = dpo_loss_forward(*arrays, beta=0.2, label_smoothing=eps, loss_type=loss_type)
    dpc, dpr, _, _ = dpo_loss_backward(1.0, cache)
    pc, pr, rc, rr = (_tensor(a, i < 2) for i, a in enumerate(arrays))
    y = _dpo_torch(pc, pr, rc, rr, 0.2, eps, loss_type)
    y.backward()
    _close_post(loss, y)
    _close_post(dpc, pc.grad)
    _close_post(dpr, pr.grad)


@pytest.mark.parametrize("case", post_cases("bradley_terry_loss"), ids=lambda c: c.label)
def test_bradley_terry_loss(case):
    loss, cache = bradley_terry_loss_forward(*case.args)
    dc, dr = bradley_terry_loss_backward(1.3, cache)
    rc, rr = _tensor(case.args[0], True), _tensor(case.args[1], True)
    y = -F.logsigmoid(rc - rr).mean()
    y.backward(_tensor(1.3))
    _close_post(loss, y)
    _close_post(dc, rc.grad)
    _close_post(dr, rr.grad)
