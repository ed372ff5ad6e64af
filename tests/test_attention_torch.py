"""Attention against PyTorch: forward values and autograd gradients, float64, 1e-10 relative.

torch.nn.functional.scaled_dot_product_attention for attention_forward (boolean masks are
True = may attend there too), and torch.nn.MultiheadAttention for mha_forward, whose
weights map as  in_proj_weight = [Wq^T; Wk^T; Wv^T],  out_proj.weight = Wo^T  (torch
computes x W^T + b), and whose boolean masks mean the opposite (True = may NOT attend).
"""
import numpy as np
import pytest

from numpytfmr import attention_backward, attention_forward, causal_mask, mha_backward, mha_forward

torch = pytest.importorskip("torch")
F = torch.nn.functional


def assert_close(ours, theirs, what=""):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert ours.shape == theirs.shape, what
    # relative to the array's size; the small absolute floor covers gradients that are
    # mathematically 0 (the key bias), where both sides hold only rounding noise
    err = np.abs(ours - theirs).max()
    assert err <= 1e-10 * np.abs(theirs).max() + 1e-14, f"{what}: max abs difference {err:.3g}"


def _t(a, grad=True):
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
    tQ, tK, tV = _t(Q), _t(K), _t(V)
    t_out = F.scaled_dot_product_attention(tQ, tK, tV, attn_mask=torch_mask, scale=scale)
    assert_close(out, t_out, "out")
    dout = rng.standard_normal(out.shape)
    t_out.backward(torch.tensor(dout))
    for g, t, n in zip(attention_backward(dout, cache), (tQ, tK, tV), "QKV"):
        assert_close(g, t.grad, f"d{n}")


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_grouped_attention_matches_sdpa_enable_gqa(n_kv_heads):
    """GQA as mha does it: query heads grouped (B, n_kv, group, n, d), K/V broadcast over the group."""
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
    tQ, tK, tV = _t(Q), _t(K), _t(V)
    t_out = F.scaled_dot_product_attention(tQ, tK, tV, attn_mask=torch.tensor(mask), enable_gqa=True)
    assert_close(out.reshape(B, H, n, d), t_out, "out")
    dout = rng.standard_normal((B, H, n, d))
    t_out.backward(torch.tensor(dout))
    dQ, dK, dV = attention_backward(dout.reshape(out.shape), cache)
    assert_close(dQ.reshape(B, H, n, d), tQ.grad, "dQ")
    assert_close(dK[:, :, 0], tK.grad, "dK")
    assert_close(dV[:, :, 0], tV.grad, "dV")


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
    tq = _t(x_q)
    tkv = tq if self_attn else _t(x_kv)
    kw = {}
    if masked and self_attn:
        kw["attn_mask"] = torch.tensor(~causal_mask(n_q, n_k))           # True = blocked
    elif masked:
        kw["key_padding_mask"] = torch.tensor(~mask[:, 0, 0, :])         # (B, n_k), True = pad
    t_out, t_w = m(tq, tkv, tkv, need_weights=True, average_attn_weights=False, **kw)
    assert_close(out, t_out, "out")
    assert_close(cache["weights"], t_w, "weights")

    dout = rng.standard_normal(out.shape)
    t_out.backward(torch.tensor(dout))
    dx_q, dx_kv, dWq, dWk, dWv, dWo, dbq, dbk, dbv, dbo = mha_backward(dout, cache)
    if self_attn:
        assert_close(dx_q + dx_kv, tq.grad, "dx")
    else:
        assert_close(dx_q, tq.grad, "dx_q")
        assert_close(dx_kv, tkv.grad, "dx_kv")
    gW = m.in_proj_weight.grad.numpy()
    assert_close(dWq, gW[:E].T, "dWq")
    assert_close(dWk, gW[E:2 * E].T, "dWk")
    assert_close(dWv, gW[2 * E:].T, "dWv")
    assert_close(dWo, m.out_proj.weight.grad.numpy().T, "dWo")
    if biases:
        gb = m.in_proj_bias.grad.numpy()
        assert_close(dbq, gb[:E], "dbq")
        assert_close(dbk, gb[E:2 * E], "dbk")
        assert_close(dbv, gb[2 * E:], "dbv")
        assert_close(dbo, m.out_proj.bias.grad, "dbo")
    else:
        assert dbq is dbk is dbv is dbo is None
