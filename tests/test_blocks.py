"""Encoder and decoder blocks: finite differences, PyTorch's layers, KV cache, options, errors."""
import numpy as np
import pytest

from conftest import well_conditioned
from numpytfmr.attention import padding_mask
from numpytfmr.blocks import (decoder_block_backward, decoder_block_forward,
                              encoder_block_backward, encoder_block_forward)
from numpytfmr.encdec import EncDecConfig, init_encdec
from numpytfmr.gradcheck import check_gradients
from numpytfmr.gpt import GPTConfig, init_gpt

D, H = 8, 4


def _encoder_params(rng, *, n_kv_heads=H, norm_type="layernorm", bias=True, d_ff=6):
    c = GPTConfig(vocab_size=5, n_layers=1, d_model=D, n_heads=H, n_kv_heads=n_kv_heads, d_ff=d_ff,
                  norm_type=norm_type, bias=bias)
    p = init_gpt(c, rng=rng, dtype=np.float64)
    return well_conditioned({k: a for k, a in p.items() if k.startswith("h0.")}, rng)


def _decoder_params(rng, *, n_kv_heads=H, norm_type="layernorm", bias=True):
    c = EncDecConfig(src_vocab_size=5, tgt_vocab_size=5, n_enc_layers=1, n_dec_layers=1, d_model=D,
                     n_heads=H, n_kv_heads=n_kv_heads, d_ff=6, norm_type=norm_type, bias=bias)
    p = init_encdec(c, rng=rng, dtype=np.float64)
    return well_conditioned({k[4:]: a for k, a in p.items() if k.startswith("dec.h0.")}, rng)


def _zero_grad_keys(keys, rope):
    """Without RoPE the key bias bk adds q.bk to every score of a row, which softmax ignores:
    its gradient is exactly zero (rounding-level noise), so it is checked separately."""
    return [] if rope else [k for k in keys if k.endswith(".bk")]


# ---------------------------------------------------------------------------------------
# finite differences over x (and memory) and every parameter
# ---------------------------------------------------------------------------------------

ENC_CASES = [
    dict(norm="pre", norm_type="layernorm", n_kv_heads=4, activation="gelu"),
    dict(norm="post", norm_type="layernorm", n_kv_heads=2, activation="gelu_tanh", mask=True),
    dict(norm="pre", norm_type="rmsnorm", n_kv_heads=1, activation="gelu_tanh", rope=True),
    dict(norm="post", norm_type="rmsnorm", n_kv_heads=2, activation="gelu", bias=False, dropout=0.3),
]


@pytest.mark.parametrize("case", ENC_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_encoder_block_gradients(case):
    case = dict(case)
    rng = np.random.default_rng(0)
    p = _encoder_params(rng, n_kv_heads=case.pop("n_kv_heads"), norm_type=case["norm_type"],
                        bias=case.pop("bias", True))
    x = rng.standard_normal((2, 5, D))
    mask = padding_mask(np.array([5, 3]), 5)[:, None] if case.pop("mask", False) else None
    rope = {"layout": "interleaved"} if case.pop("rope", False) else None
    dropout = case.pop("dropout", 0.0)
    keys = sorted(p)
    frozen = _zero_grad_keys(keys, rope)
    keys = [k for k in keys if k not in frozen]
    n_kv = p["h0.attn.Wk"].shape[1] // (D // H)

    def fwd(x, *arrays):
        params = {**p, **dict(zip(keys, arrays))}
        return encoder_block_forward(x, params, prefix="h0.", n_heads=H, n_kv_heads=n_kv, mask=mask,
                                     rope=rope, dropout=dropout, train=dropout > 0,
                                     rng=np.random.default_rng(7), **case)

    def bwd(dy, cache):
        dx, dmemory, grads = encoder_block_backward(dy, cache)
        assert dmemory is None                             # an encoder block reads no memory
        assert set(grads) == set(p)
        for k in frozen:
            assert np.max(np.abs(grads[k])) < 1e-12
        return (dx,) + tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [x] + [p[k] for k in keys], mode="directional",
                          n_directions=3, n_coordinates=2, names=["x"] + keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


DEC_CASES = [
    dict(norm="pre", norm_type="layernorm", n_kv_heads=4, memory=True),
    dict(norm="post", norm_type="layernorm", n_kv_heads=1, memory=True, memory_mask=True),
    dict(norm="pre", norm_type="rmsnorm", n_kv_heads=2, memory=False, rope=True),
    dict(norm="post", norm_type="rmsnorm", n_kv_heads=2, memory=True, rope=True, bias=False),
]


@pytest.mark.parametrize("case", DEC_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_decoder_block_gradients(case):
    case = dict(case)
    rng = np.random.default_rng(1)
    p = _decoder_params(rng, n_kv_heads=case.pop("n_kv_heads"), norm_type=case["norm_type"],
                        bias=case.pop("bias", True))
    use_memory = case.pop("memory")
    if not use_memory:
        p = {k: a for k, a in p.items() if not k.startswith("h0.cross")}
    x = rng.standard_normal((2, 4, D))
    memory = rng.standard_normal((2, 6, D))
    memory_mask = padding_mask(np.array([6, 2]), 6)[:, None] if case.pop("memory_mask", False) else None
    rope = "interleaved" if case.pop("rope", False) else None
    keys = sorted(p)
    frozen = [k for k in _zero_grad_keys(keys, False)
              if not (rope and k.startswith("h0.attn."))]   # RoPE rotates the self-attention keys
    keys = [k for k in keys if k not in frozen]
    n_kv = p["h0.attn.Wk"].shape[1] // (D // H)

    def fwd(x, memory, *arrays):
        params = {**p, **dict(zip(keys, arrays))}
        return decoder_block_forward(x, memory if use_memory else None, params, prefix="h0.",
                                     n_heads=H, n_kv_heads=n_kv, memory_mask=memory_mask, rope=rope,
                                     activation="gelu_tanh", **case)

    def bwd(dy, cache):
        dx, dmemory, grads = decoder_block_backward(dy, cache)
        assert set(grads) == set(p)
        assert (dmemory is None) == (not use_memory)
        for k in frozen:
            assert np.max(np.abs(grads[k])) < 1e-12
        return (dx, dmemory) + tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [x, memory] + [p[k] for k in keys], mode="directional",
                          n_directions=3, n_coordinates=2, names=["x", "memory"] + keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


# ---------------------------------------------------------------------------------------
# PyTorch's nn.TransformerEncoderLayer / nn.TransformerDecoderLayer, float64, forward and autograd
# ---------------------------------------------------------------------------------------

def _load_mha(torch, module, p, key):
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.from_numpy(np.concatenate(
            [p[f"{key}.Wq"].T, p[f"{key}.Wk"].T, p[f"{key}.Wv"].T])))
        module.in_proj_bias.copy_(torch.from_numpy(np.concatenate(
            [p[f"{key}.bq"], p[f"{key}.bk"], p[f"{key}.bv"]])))
        module.out_proj.weight.copy_(torch.from_numpy(p[f"{key}.Wo"].T))
        module.out_proj.bias.copy_(torch.from_numpy(p[f"{key}.bo"]))


def _load_norm_ffn(torch, layer, p, norms):
    with torch.no_grad():
        for torch_name, key in norms:
            getattr(layer, torch_name).weight.copy_(torch.from_numpy(p[f"{key}.gamma"]))
            getattr(layer, torch_name).bias.copy_(torch.from_numpy(p[f"{key}.beta"]))
        layer.linear1.weight.copy_(torch.from_numpy(p["h0.mlp.W1"].T))
        layer.linear1.bias.copy_(torch.from_numpy(p["h0.mlp.b1"]))
        layer.linear2.weight.copy_(torch.from_numpy(p["h0.mlp.W2"].T))
        layer.linear2.bias.copy_(torch.from_numpy(p["h0.mlp.b2"]))


def _torch_grads(torch, p, key, module):
    return {f"{key}.Wq": module.in_proj_weight.grad[:D].T, f"{key}.Wk": module.in_proj_weight.grad[D:2 * D].T,
            f"{key}.Wv": module.in_proj_weight.grad[2 * D:].T, f"{key}.Wo": module.out_proj.weight.grad.T,
            f"{key}.bq": module.in_proj_bias.grad[:D], f"{key}.bk": module.in_proj_bias.grad[D:2 * D],
            f"{key}.bv": module.in_proj_bias.grad[2 * D:], f"{key}.bo": module.out_proj.bias.grad}


def _assert_close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else theirs
    scale = max(np.max(np.abs(theirs)), 1e-3)
    assert np.max(np.abs(ours - theirs)) <= 1e-10 * scale, what


@pytest.mark.torch
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch(norm, activation):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    p = _encoder_params(rng, d_ff=16)
    x = rng.standard_normal((2, 5, D))
    lengths = np.array([5, 3])
    dy = rng.standard_normal((2, 5, D))
    y, cache = encoder_block_forward(x, p, prefix="h0.", n_heads=H, norm=norm, activation=activation,
                                     mask=padding_mask(lengths, 5)[:, None])
    dx, _, grads = encoder_block_backward(dy, cache)

    layer = torch.nn.TransformerEncoderLayer(D, H, dim_feedforward=16, dropout=0.0, activation=activation,
                                             batch_first=True, norm_first=norm == "pre", dtype=torch.float64)
    _load_mha(torch, layer.self_attn, p, "h0.attn")
    _load_norm_ffn(torch, layer, p, [("norm1", "h0.attn_norm"), ("norm2", "h0.mlp_norm")])
    xt = torch.tensor(x, requires_grad=True)
    pad = torch.from_numpy(np.arange(5)[None, :] >= lengths[:, None])   # torch: True = padding
    yt = layer(xt, src_key_padding_mask=pad)
    yt.backward(torch.from_numpy(dy))
    _assert_close(y, yt, "y")
    _assert_close(dx, xt.grad, "dx")
    for k, g in _torch_grads(torch, p, "h0.attn", layer.self_attn).items():
        _assert_close(grads[k], g, k)
    _assert_close(grads["h0.mlp.W1"], layer.linear1.weight.grad.T, "W1")
    _assert_close(grads["h0.mlp.b2"], layer.linear2.bias.grad, "b2")
    _assert_close(grads["h0.attn_norm.gamma"], layer.norm1.weight.grad, "gamma1")
    _assert_close(grads["h0.mlp_norm.beta"], layer.norm2.bias.grad, "beta2")


@pytest.mark.torch
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_block_matches_torch(norm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    p = _decoder_params(rng)
    p.update({k: a for k, a in _encoder_params(rng, d_ff=6).items() if k.startswith("h0.mlp.")})
    x = rng.standard_normal((2, 4, D))
    memory = rng.standard_normal((2, 6, D))
    lengths = np.array([6, 4])
    dy = rng.standard_normal((2, 4, D))
    y, cache = decoder_block_forward(x, memory, p, prefix="h0.", n_heads=H, norm=norm, activation="relu",
                                     memory_mask=padding_mask(lengths, 6)[:, None])
    dx, dmemory, grads = decoder_block_backward(dy, cache)

    layer = torch.nn.TransformerDecoderLayer(D, H, dim_feedforward=6, dropout=0.0, activation="relu",
                                             batch_first=True, norm_first=norm == "pre", dtype=torch.float64)
    _load_mha(torch, layer.self_attn, p, "h0.attn")
    _load_mha(torch, layer.multihead_attn, p, "h0.cross")
    _load_norm_ffn(torch, layer, p, [("norm1", "h0.attn_norm"), ("norm2", "h0.cross_norm"),
                                     ("norm3", "h0.mlp_norm")])
    xt = torch.tensor(x, requires_grad=True)
    mt = torch.tensor(memory, requires_grad=True)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    pad = torch.from_numpy(np.arange(6)[None, :] >= lengths[:, None])
    yt = layer(xt, mt, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=pad)
    yt.backward(torch.from_numpy(dy))
    _assert_close(y, yt, "y")
    _assert_close(dx, xt.grad, "dx")
    _assert_close(dmemory, mt.grad, "dmemory")
    for key, module in (("h0.attn", layer.self_attn), ("h0.cross", layer.multihead_attn)):
        for k, g in _torch_grads(torch, p, key, module).items():
            _assert_close(grads[k], g, k)
    _assert_close(grads["h0.cross_norm.gamma"], layer.norm2.weight.grad, "cross_norm.gamma")
    _assert_close(grads["h0.mlp.W2"], layer.linear2.weight.grad.T, "W2")


# ---------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------

def test_decoder_block_is_causal_and_encoder_block_is_not():
    rng = np.random.default_rng(4)
    p = _encoder_params(rng)
    x = rng.standard_normal((1, 6, D))
    x2 = x.copy()
    x2[:, 4:] = rng.standard_normal((1, 2, D))             # change the last two positions
    opts = dict(prefix="h0.", n_heads=H)
    y, _ = decoder_block_forward(x, None, p, **opts)
    y2, _ = decoder_block_forward(x2, None, p, **opts)
    assert np.array_equal(y[:, :4], y2[:, :4])             # the past never sees the future
    e, _ = encoder_block_forward(x, p, **opts)
    e2, _ = encoder_block_forward(x2, p, **opts)
    assert np.max(np.abs(e[:, :4] - e2[:, :4])) > 1e-3     # the encoder sees everything


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("rope", [None, "interleaved"])
def test_decoder_block_kv_cache_equals_full_sequence(n_kv_heads, rope):
    """Prefix first, then the rest against its cache (003 §6.2): same outputs as one pass."""
    rng = np.random.default_rng(5)
    p = _decoder_params(rng, n_kv_heads=n_kv_heads)
    x = rng.standard_normal((2, 7, D))
    memory = rng.standard_normal((2, 3, D))
    opts = dict(prefix="h0.", n_heads=H, n_kv_heads=n_kv_heads, rope=rope)
    full, c_full = decoder_block_forward(x, memory, p, **opts)
    first, c1 = decoder_block_forward(x[:, :4], memory, p, **opts)
    second, c2 = decoder_block_forward(x[:, 4:], memory, p, kv_cache=c1["kv_cache"], **opts)
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), full, rtol=1e-12, atol=1e-12)
    assert c2["kv_cache"]["k"].shape == (2, n_kv_heads, 7, D // H)
    np.testing.assert_allclose(c2["kv_cache"]["k"], c_full["kv_cache"]["k"], rtol=1e-12, atol=1e-12)
    assert c2["attn_weights"].shape == (2, H, 3, 7)


def test_cache_is_a_flat_dict_of_named_steps():
    """The block's cache holds each step's cache under its name, nothing callable; the
    attention weights and the KV cache are the attention steps' own."""
    rng = np.random.default_rng(12)
    p = _decoder_params(rng)
    x, m = rng.standard_normal((2, 4, D)), rng.standard_normal((2, 3, D))
    steps = {"attn_norm", "attn", "attn_res", "mlp_norm", "mlp", "mlp_res"}
    cross = {"cross_norm", "cross", "cross_res"}
    for norm in ("pre", "post"):
        _, c = decoder_block_forward(x, m, p, prefix="h0.", n_heads=H, norm=norm)
        assert steps | cross <= set(c) and not any(callable(v) for v in c.values())
        assert c["attn_weights"] is c["attn"]["weights"] and c["kv_cache"] is c["attn"]["kv_cache"]
        assert c["cross_weights"] is c["cross"]["weights"]
        self_only = {k: a for k, a in p.items() if ".cross" not in k}
        _, c = decoder_block_forward(x, None, self_only, prefix="h0.", n_heads=H, norm=norm)
        assert steps <= set(c) and not cross & set(c) and c["cross_weights"] is None
        _, c = encoder_block_forward(x, self_only, prefix="h0.", n_heads=H, norm=norm)
        assert steps <= set(c) and not cross & set(c) and c["attn_weights"] is c["attn"]["weights"]


def test_pre_norm_is_residual_and_post_norm_is_normalised():
    """eq. 30 keeps x on the identity path; eq. 31 ends in a norm (rows of mean 0, variance 1
    when gamma = 1, beta = 0)."""
    rng = np.random.default_rng(6)
    p = _encoder_params(rng)
    for k in p:
        if k.endswith("gamma"):
            p[k] = np.ones_like(p[k])
        if k.endswith("beta"):
            p[k] = np.zeros_like(p[k])
    x = rng.standard_normal((2, 5, D))
    y, _ = encoder_block_forward(x, p, prefix="h0.", n_heads=H, norm="post")
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-4)
    # pre-norm with zero output projections: both sublayers add 0, so y = x exactly
    z = dict(p, **{"h0.attn.Wo": np.zeros((D, D)), "h0.attn.bo": np.zeros(D),
                   "h0.mlp.W2": np.zeros_like(p["h0.mlp.W2"]), "h0.mlp.b2": np.zeros(D)})
    y, _ = encoder_block_forward(x, z, prefix="h0.", n_heads=H, norm="pre")
    assert np.array_equal(y, x)


def test_dropout_only_when_training():
    rng = np.random.default_rng(7)
    p = _encoder_params(rng)
    x = rng.standard_normal((2, 5, D))
    opts = dict(prefix="h0.", n_heads=H, dropout=0.5)
    y_eval, _ = encoder_block_forward(x, p, **opts)
    y_plain, _ = encoder_block_forward(x, p, prefix="h0.", n_heads=H)
    assert np.array_equal(y_eval, y_plain)
    a, _ = encoder_block_forward(x, p, train=True, rng=np.random.default_rng(1), **opts)
    b, _ = encoder_block_forward(x, p, train=True, rng=np.random.default_rng(1), **opts)
    c, _ = encoder_block_forward(x, p, train=True, rng=np.random.default_rng(2), **opts)
    assert np.array_equal(a, b) and not np.allclose(a, c) and not np.allclose(a, y_eval)
    with pytest.raises(TypeError, match="encoder_block_forward: rng"):
        encoder_block_forward(x, p, train=True, **opts)


def test_float32_in_float32_out():
    rng = np.random.default_rng(8)
    p = {k: a.astype(np.float32) for k, a in _decoder_params(rng).items()}
    x = rng.standard_normal((2, 4, D)).astype(np.float32)
    m = rng.standard_normal((2, 3, D)).astype(np.float32)
    y, cache = decoder_block_forward(x, m, p, prefix="h0.", n_heads=H)
    dx, dm, grads = decoder_block_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == dm.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())


def test_inputs_and_params_unchanged():
    rng = np.random.default_rng(9)
    p = _decoder_params(rng)
    before = {k: a.copy() for k, a in p.items()}
    x, m = rng.standard_normal((2, 4, D)), rng.standard_normal((2, 3, D))
    x0, m0 = x.copy(), m.copy()
    y, cache = decoder_block_forward(x, m, p, prefix="h0.", n_heads=H, norm="post")
    dy = rng.standard_normal(y.shape)
    dy0 = dy.copy()
    decoder_block_backward(dy, cache)
    assert all(np.array_equal(p[k], before[k]) for k in p)
    assert np.array_equal(x, x0) and np.array_equal(m, m0) and np.array_equal(dy, dy0)


def test_bad_arguments():
    rng = np.random.default_rng(10)
    p = _encoder_params(rng)
    x = rng.standard_normal((2, 5, D))
    with pytest.raises(ValueError, match="params has no key 'h1.attn_norm.gamma'"):
        encoder_block_forward(x, p, prefix="h1.", n_heads=H)
    with pytest.raises(ValueError, match="encoder_block_forward: norm is 'middle'"):
        encoder_block_forward(x, p, prefix="h0.", n_heads=H, norm="middle")
    with pytest.raises(ValueError, match="norm_type"):
        encoder_block_forward(x, p, prefix="h0.", n_heads=H, norm_type="batchnorm")
    with pytest.raises(ValueError, match="dropout"):
        encoder_block_forward(x, p, prefix="h0.", n_heads=H, dropout=1.0)
    with pytest.raises(TypeError, match="decoder_block_forward: x"):
        decoder_block_forward(np.zeros((2, 5, D), dtype=int), None, p, prefix="h0.", n_heads=H)
    with pytest.raises(TypeError, match="kv_cache"):
        decoder_block_forward(x, None, p, prefix="h0.", n_heads=H, kv_cache=np.zeros((2, H, 3, 2)))


def test_decoder_self_attention_mask_hides_left_padding():
    """An extra key mask (left padding) combined with the future mask: the real tokens'
    outputs equal those of the sequence without its padding."""
    rng = np.random.default_rng(11)
    p = _decoder_params(rng)
    x = rng.standard_normal((2, 6, D))
    real = np.arange(6) >= np.array([[0], [2]])               # row 1 starts with 2 pads
    opts = dict(prefix="h0.", n_heads=H)
    y, cache = decoder_block_forward(x, None, p, mask=real[:, None, None, :], **opts)
    alone, _ = decoder_block_forward(x[1:, 2:], None, p, **opts)
    np.testing.assert_allclose(y[1:, 2:], alone, rtol=1e-12, atol=1e-12)
    assert np.all(cache["attn_weights"][1, :, :, :2] == 0)
    y_all, _ = decoder_block_forward(x, None, p, mask=np.ones((6,), dtype=bool), **opts)
    y_none, _ = decoder_block_forward(x, None, p, **opts)
    assert np.array_equal(y_all, y_none)
