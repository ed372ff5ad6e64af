"""The GPT: gradients of every parameter, PyTorch reference, causality, KV-cached decoding,
sampling, training, config and input errors, dtypes."""
import json
import math

import numpy as np
import pytest

from conftest import well_conditioned
from numpytfmr.gpt import (GPTConfig, generate, gpt_backward, gpt_forward, gpt_loss,
                           gpt_param_shapes, init_gpt, kv_cache_size)
from numpytfmr.gradcheck import check_gradients
from numpytfmr.losses import cross_entropy_backward, cross_entropy_forward
from numpytfmr.optim import adam_init, adam_step
from numpytfmr.positional import sinusoidal_encoding

TINY = dict(vocab_size=7, n_layers=2, d_model=8, n_heads=4, d_ff=6, max_len=6)


def _params(config, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return well_conditioned(init_gpt(config, rng=rng, dtype=np.float64), rng), rng


# ---------------------------------------------------------------------------------------
# finite differences over every parameter
# ---------------------------------------------------------------------------------------

GRAD_CONFIGS = [
    dict(positional="learned", norm="pre", n_kv_heads=4, tie_embeddings=True, activation="gelu"),
    dict(positional="learned", norm="post", n_kv_heads=2, tie_embeddings=False, activation="gelu_tanh"),
    dict(positional="sinusoidal", norm="pre", n_kv_heads=1, tie_embeddings=False, norm_type="rmsnorm",
         bias=False, activation="gelu_tanh"),
    dict(positional="sinusoidal", norm="post", n_kv_heads=4, tie_embeddings=True, norm_type="rmsnorm",
         activation="gelu_tanh"),
    dict(positional="rope", norm="pre", n_kv_heads=2, tie_embeddings=True, bias=False,
         activation="gelu_tanh"),
    dict(positional="rope", norm="post", n_kv_heads=1, tie_embeddings=False, activation="gelu_tanh"),
    dict(positional="rope", norm="pre", n_kv_heads=4, rope_layout="half", dropout=0.2,
         activation="gelu_tanh"),
]


@pytest.mark.parametrize("options", GRAD_CONFIGS,
                         ids=lambda o: "-".join(str(v) for v in o.values()))
def test_every_parameter_matches_finite_differences(options):
    """Directional derivatives of sum(logits * dout) along random directions, one check per
    parameter array, <= 1e-6 relative (float64)."""
    c = GPTConfig(**TINY, **options)
    p, rng = _params(c)
    ids = rng.integers(0, c.vocab_size, (2, 5))
    train = c.dropout > 0
    keys = sorted(p)
    # Without RoPE, bk adds q.bk to a whole row of scores, which softmax ignores: its exact
    # gradient is 0 and only rounding noise comes out, so it is checked on its own below.
    zero = [k for k in keys if k.endswith("attn.bk") and c.positional != "rope"]
    keys = [k for k in keys if k not in zero]

    def fwd(*arrays):
        return gpt_forward({**p, **dict(zip(keys, arrays))}, ids, config=c, train=train,
                           rng=np.random.default_rng(3))    # the same dropout masks every call

    def bwd(dlogits, cache):
        grads = gpt_backward(dlogits, cache)
        assert set(grads) == set(p)
        for k in zero:
            assert np.max(np.abs(grads[k])) < 1e-12, k
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [p[k] for k in keys], mode="directional", n_directions=2,
                          n_coordinates=1, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


def test_gpt_loss_is_cross_entropy_of_the_logits_and_starts_near_log_vocab():
    c = GPTConfig(**TINY)
    rng = np.random.default_rng(1)
    p = init_gpt(c, rng=rng, dtype=np.float64)
    ids = rng.integers(0, 7, (3, 5))
    targets = rng.integers(0, 7, (3, 5))
    targets[0, :2] = -1
    loss, grads = gpt_loss(p, ids, targets, config=c, ignore_index=-1)
    logits, cache = gpt_forward(p, ids, config=c)
    ref, c_loss = cross_entropy_forward(logits, targets, ignore_index=-1)
    assert loss == float(ref)
    expected = gpt_backward(cross_entropy_backward(1.0, c_loss)[0], cache)
    assert all(np.array_equal(grads[k], expected[k]) for k in p)
    # GPT-2 init: logits ~ 0, so the loss of a V-way softmax is ~ ln V
    assert abs(loss - math.log(7)) < 0.05


def test_tied_head_is_the_transposed_table_and_gets_both_gradients():
    c_tied = GPTConfig(**TINY, tie_embeddings=True)
    c_free = GPTConfig(**TINY, tie_embeddings=False)
    p, rng = _params(c_tied)
    q = dict(p, **{"lm_head.W": p["wte"].T.copy()})
    ids = rng.integers(0, 7, (2, 5))
    a, ca = gpt_forward(p, ids, config=c_tied)
    b, cb = gpt_forward(q, ids, config=c_free)
    assert np.array_equal(a, b)
    d = rng.standard_normal(a.shape)
    ga, gb = gpt_backward(d, ca), gpt_backward(d, cb)
    np.testing.assert_allclose(ga["wte"], gb["wte"] + gb["lm_head.W"].T, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------
# PyTorch reference: the same model written with torch ops, autograd gradients
# ---------------------------------------------------------------------------------------

def _torch_gpt(torch, tp, ids, c):
    F = torch.nn.functional
    B, T = ids.shape
    H, Hkv, dh = c.n_heads, c.n_kv_heads, c.d_head

    def norm(x, key):
        if c.norm_type == "layernorm":
            return F.layer_norm(x, (c.d_model,), tp[key + ".gamma"], tp.get(key + ".beta"), c.norm_eps)
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * tp[key + ".gamma"]

    def rope(x):                                   # x (B, heads, T, dh)
        alpha = c.rope_base ** (-np.arange(0, dh, 2) / dh)
        theta = torch.from_numpy(np.arange(T)[:, None] * alpha)
        cos, sin = torch.cos(theta), torch.sin(theta)
        if c.rope_layout == "interleaved":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def lin(x, key, w, b):
        y = x @ tp[f"{key}.{w}"]
        return y + tp[f"{key}.{b}"] if f"{key}.{b}" in tp else y

    def attn(x, key):
        q = lin(x, key, "Wq", "bq").view(B, T, H, dh).transpose(1, 2)
        k = lin(x, key, "Wk", "bk").view(B, T, Hkv, dh).transpose(1, 2)
        v = lin(x, key, "Wv", "bv").view(B, T, Hkv, dh).transpose(1, 2)
        if c.positional == "rope":
            q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // Hkv, dim=1)    # query head h uses key/value head h // group
        v = v.repeat_interleave(H // Hkv, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(dh)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * dh)
        return lin(o, key, "Wo", "bo")

    def mlp(x, key):
        h = lin(x, key, "W1", "b1")
        h = F.gelu(h, approximate="tanh") if c.activation == "gelu_tanh" else (
            F.gelu(h) if c.activation == "gelu" else F.relu(h))
        return lin(h, key, "W2", "b2")

    x = tp["wte"][torch.from_numpy(ids)]
    if c.positional == "learned":
        x = x + tp["wpe"][:T]
    elif c.positional == "sinusoidal":
        x = x + torch.from_numpy(sinusoidal_encoding(T, c.d_model))
    for l in range(c.n_layers):
        if c.norm == "pre":
            x = x + attn(norm(x, f"h{l}.attn_norm"), f"h{l}.attn")
            x = x + mlp(norm(x, f"h{l}.mlp_norm"), f"h{l}.mlp")
        else:
            x = norm(x + attn(x, f"h{l}.attn"), f"h{l}.attn_norm")
            x = norm(x + mlp(x, f"h{l}.mlp"), f"h{l}.mlp_norm")
    if c.norm == "pre":
        x = norm(x, "norm_f")
    return x @ (tp["wte"].T if c.tie_embeddings else tp["lm_head.W"])


@pytest.mark.torch
@pytest.mark.parametrize("options", [
    dict(positional="learned", norm="pre", n_kv_heads=4, activation="gelu_tanh"),
    dict(positional="sinusoidal", norm="post", n_kv_heads=2, tie_embeddings=False, activation="relu"),
    dict(positional="rope", norm="pre", n_kv_heads=1, norm_type="rmsnorm", bias=False, activation="gelu"),
    dict(positional="rope", norm="post", n_kv_heads=2, rope_layout="half", tie_embeddings=False),
], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_matches_torch_reference(options):
    torch = pytest.importorskip("torch")
    c = GPTConfig(**TINY, **options)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (2, 6))
    logits, cache = gpt_forward(p, ids, config=c)
    d = rng.standard_normal(logits.shape)
    grads = gpt_backward(d, cache)
    tp = {k: torch.tensor(a, requires_grad=True) for k, a in p.items()}
    out = _torch_gpt(torch, tp, ids, c)
    out.backward(torch.from_numpy(d))
    np.testing.assert_allclose(logits, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k in p:
        g = tp[k].grad.numpy()
        assert np.max(np.abs(grads[k] - g)) <= 1e-10 * max(np.max(np.abs(g)), 1e-3), k


# ---------------------------------------------------------------------------------------
# causality and the KV cache
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_logits_never_depend_on_later_tokens(positional, norm):
    c = GPTConfig(**dict(TINY, max_len=8), positional=positional, norm=norm, n_kv_heads=2)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (3, 8))
    base, _ = gpt_forward(p, ids, config=c)
    for t in range(7):
        changed = ids.copy()
        changed[:, t + 1:] = rng.integers(0, 7, (3, 7 - t))
        logits, _ = gpt_forward(p, changed, config=c)
        assert np.array_equal(logits[:, :t + 1], base[:, :t + 1]), t     # bitwise
        assert not np.allclose(logits[:, t + 1:], base[:, t + 1:])


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope"])
def test_cached_and_uncached_decoding_agree(n_kv_heads, positional):
    c = GPTConfig(**dict(TINY, max_len=12), positional=positional, n_kv_heads=n_kv_heads)
    p, rng = _params(c)
    prompt = rng.integers(0, 7, (3, 4))
    a, la = generate(p, prompt, config=c, max_new_tokens=8, top_k=1, return_logits=True)
    b, lb = generate(p, prompt, config=c, max_new_tokens=8, top_k=1, use_cache=False,
                     return_logits=True)
    assert a.shape == (3, 12) and np.array_equal(a[:, :4], prompt)
    assert np.array_equal(a, b)
    np.testing.assert_allclose(la, lb, rtol=1e-12, atol=1e-12)
    # and the greedy choice is the argmax of a plain forward pass over the result
    full, _ = gpt_forward(p, a[:, :-1], config=c)
    assert np.array_equal(a[:, 4:], np.argmax(full[:, 3:], axis=-1))


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_chunked_prefill_through_the_cache_equals_one_pass(positional):
    """Feeding a sequence in chunks of 3, 1, 2, 1 against the growing cache reproduces the
    logits of a single pass (the causal mask places chunk queries at n_past + i)."""
    c = GPTConfig(**dict(TINY, max_len=8), positional=positional, n_kv_heads=2)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (2, 7))
    full, _ = gpt_forward(p, ids, config=c)
    pieces, kv, start = [], None, 0
    for size in (3, 1, 2, 1):
        logits, cache = gpt_forward(p, ids[:, start:start + size], config=c, kv_cache=kv)
        kv = cache["kv_cache"]
        pieces.append(logits)
        start += size
        assert kv[0]["k"].shape == (2, 2, start, c.d_head)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-12, atol=1e-12)


def test_cached_step_computes_one_row_of_scores():
    """000 §2.5.1: without the cache step t recomputes all t x t scores (O(n^3) for n tokens),
    with it only the new query's row of t scores (O(n^2)). Counted from the weights' shapes."""
    c = GPTConfig(**dict(TINY, max_len=10))
    p, rng = _params(c)
    ids = rng.integers(0, 7, (1, 10))
    uncached = cached = 0
    kv = None
    for t in range(1, 11):
        _, full = gpt_forward(p, ids[:, :t], config=c)
        _, step = gpt_forward(p, ids[:, t - 1:t], config=c, kv_cache=kv)
        kv = step["kv_cache"]
        assert step["attn_weights"][0].shape == (1, 4, 1, t)
        uncached += full["attn_weights"][0][0, 0].size
        cached += step["attn_weights"][0][0, 0].size
    assert uncached == sum(t * t for t in range(1, 11))      # 385 ~ n^3 / 3
    assert cached == sum(range(1, 11))                      # 55 ~ n^2 / 2


def test_backward_after_a_cached_forward_treats_the_cache_as_constant():
    c = GPTConfig(**dict(TINY, max_len=8), positional="rope", n_kv_heads=2)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (2, 7))
    _, prefix = gpt_forward(p, ids[:, :4], config=c)
    kv = prefix["kv_cache"]
    keys = sorted(p)

    def fwd(*arrays):
        return gpt_forward(dict(zip(keys, arrays)), ids[:, 4:], config=c, kv_cache=kv)

    def bwd(dlogits, cache):
        grads = gpt_backward(dlogits, cache)
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [p[k] for k in keys], mode="directional", n_directions=2,
                          n_coordinates=1, names=keys)
    assert res.passed and max(res.errors.values()) <= 1e-6, str(res)


def test_cache_shapes_and_size_shrink_with_fewer_kv_heads():
    sizes = {}
    for n_kv in (4, 2, 1):
        c = GPTConfig(**dict(TINY, max_len=8), n_kv_heads=n_kv)
        p, rng = _params(c)
        _, cache = gpt_forward(p, rng.integers(0, 7, (3, 5)), config=c)
        kv = cache["kv_cache"]
        assert len(kv) == c.n_layers
        for l in range(c.n_layers):                          # the blocks' own entries
            assert kv[l] is cache[f"h{l}"]["kv_cache"]
            assert cache["attn_weights"][l] is cache[f"h{l}"]["attn"]["weights"]
        for layer in kv:
            assert layer["k"].shape == layer["v"].shape == (3, n_kv, 5, c.d_head)  # 001 §2.2
        sizes[n_kv] = kv_cache_size(kv)
    assert sizes[4] == 2 * 2 * 3 * 4 * 5 * 2                 # 2 (K, V) * L * B * h * T * d_head
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]          # shrinks by n_heads / n_kv_heads


# ---------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------

def test_greedy_forms_agree_and_sampling_is_reproducible():
    c = GPTConfig(**dict(TINY, max_len=12))
    p, rng = _params(c)
    prompt = rng.integers(0, 7, (2, 3))
    g1 = generate(p, prompt, config=c, max_new_tokens=6, top_k=1)
    g2 = generate(p, prompt, config=c, max_new_tokens=6, temperature=0)
    assert np.array_equal(g1, g2)
    s1 = generate(p, prompt, config=c, max_new_tokens=6, rng=np.random.default_rng(4))
    s2 = generate(p, prompt, config=c, max_new_tokens=6, rng=np.random.default_rng(4))
    assert np.array_equal(s1, s2)
    s3 = generate(p, prompt, config=c, max_new_tokens=6, top_k=3, temperature=0.7,
                  rng=np.random.default_rng(5), use_cache=False)
    s4 = generate(p, prompt, config=c, max_new_tokens=6, top_k=3, temperature=0.7,
                  rng=np.random.default_rng(5), use_cache=True)
    assert np.array_equal(s3, s4)


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (1.0, 3)])
def test_sampled_frequencies_follow_the_softmax(temperature, top_k):
    c = GPTConfig(**TINY)
    p, rng = _params(c)
    n = 20000
    prompt = np.tile(rng.integers(0, 7, (1, 3)), (n, 1))          # n copies of one prompt
    out, logits = generate(p, prompt, config=c, max_new_tokens=1, temperature=temperature,
                           top_k=top_k, rng=np.random.default_rng(6), return_logits=True)
    z = logits[0, 0] / temperature
    if top_k is not None:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    expected = np.exp(z - z.max())
    expected /= expected.sum()
    freq = np.bincount(out[:, -1], minlength=7) / n
    assert np.all(freq[expected == 0] == 0)
    assert np.all(np.abs(freq - expected) <= 4 * np.sqrt(expected * (1 - expected) / n) + 1e-12)


def test_eos_fills_the_rest_of_a_finished_row():
    c = GPTConfig(**dict(TINY, max_len=12))
    p, rng = _params(c)
    prompt = rng.integers(0, 7, (4, 3))
    free = generate(p, prompt, config=c, max_new_tokens=8, top_k=1)
    eos = int(free[0, 4])                       # row 0 produces it as its second new token
    out = generate(p, prompt, config=c, max_new_tokens=8, top_k=1, eos_id=eos)
    assert out.shape == free.shape
    for row_free, row in zip(free, out):
        hits = np.flatnonzero(row_free[3:] == eos)
        stop = 3 + hits[0] + 1 if hits.size else len(row)
        assert np.array_equal(row[:stop], row_free[:stop])
        assert np.all(row[stop:] == eos)


# ---------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiny_gpt_learns_to_copy(dtype):
    """Sequences s s (s: 4 random tokens) with the loss on the second half: only attention
    back 4 positions can predict it. Adam, 80 steps: the loss falls from ~ln 8 and greedy
    decoding copies unseen sequences."""
    c = GPTConfig(vocab_size=8, n_layers=1, d_model=16, n_heads=2, d_ff=32, max_len=8,
                  activation="relu")
    rng = np.random.default_rng(0)
    p = init_gpt(c, rng=rng, dtype=dtype)
    state = adam_init(p)
    losses = []
    for _ in range(80):
        s = rng.integers(0, 8, (16, 4))
        seq = np.concatenate([s, s], axis=1)
        targets = seq[:, 1:].copy()
        targets[:, :3] = -100                   # the first half is unpredictable
        loss, grads = gpt_loss(p, seq[:, :-1], targets, config=c, ignore_index=-100)
        assert all(g.dtype == dtype for g in grads.values())
        losses.append(loss)
        p, state = adam_step(p, grads, state, lr=1e-2)
    assert abs(losses[0] - math.log(8)) < 0.1
    assert np.mean(losses[-5:]) < 0.3
    s = rng.integers(0, 8, (100, 4))
    out = generate(p, np.concatenate([s, s[:, :1]], axis=1), config=c, max_new_tokens=3, top_k=1)
    assert np.mean(out[:, 5:] == s[:, 1:]) > 0.95


def test_plain_gradient_step_lowers_the_loss_as_predicted():
    """theta' = theta - lr g changes the loss by -lr |g|^2 to first order (plain SGD)."""
    c = GPTConfig(**TINY, positional="rope", n_kv_heads=2)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (4, 6))
    targets = rng.integers(0, 7, (4, 6))
    loss, grads = gpt_loss(p, ids, targets, config=c)
    g2 = sum(float(np.sum(g * g)) for g in grads.values())
    for lr in (1e-3, 1e-4):
        new, _ = gpt_loss({k: p[k] - lr * grads[k] for k in p}, ids, targets, config=c)
        assert new < loss
        assert abs((loss - new) / (lr * g2) - 1) < 20 * lr


# ---------------------------------------------------------------------------------------
# config, parameters, dtypes, errors
# ---------------------------------------------------------------------------------------

def test_config_defaults_round_trip_and_errors():
    c = GPTConfig(vocab_size=50, n_layers=2, d_model=16, n_heads=4, positional="rope",
                  rope_scaling={"type": "linear", "factor": 2.0})
    assert c.n_kv_heads == 4 and c.d_ff == 64 and c.d_head == 4
    assert GPTConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ValueError, match="unknown keys"):
        GPTConfig.from_dict(dict(c.to_dict(), n_layer=3))
    bad = [(dict(d_model=10), ValueError, "d_model is 10 and n_heads is 4"),
           (dict(n_kv_heads=3), ValueError, "n_heads is 4 and n_kv_heads is 3"),
           (dict(positional="alibi"), ValueError, "positional is 'alibi'"),
           (dict(norm="sandwich"), ValueError, "norm is 'sandwich'"),
           (dict(norm_type="batchnorm"), ValueError, "norm_type"),
           (dict(activation="swish"), ValueError, "activation is 'swish'"),
           (dict(vocab_size=0), ValueError, "vocab_size is 0"),
           (dict(n_layers=2.0), TypeError, "n_layers"),
           (dict(dropout=1.0), ValueError, "dropout is 1.0"),
           (dict(tie_embeddings="yes"), TypeError, "tie_embeddings"),
           (dict(d_model=12, n_heads=4, positional="rope"), ValueError, "positional is .rope. but d_head .* is odd"),
           (dict(rope_scaling={"type": "linear", "factor": 2.0}), ValueError, "rope_scaling")]
    for change, error, message in bad:
        kwargs = {**dict(vocab_size=50, n_layers=2, d_model=16, n_heads=4), **change}
        with pytest.raises(error, match="GPTConfig: " + message):
            GPTConfig(**kwargs)


@pytest.mark.parametrize("options", [dict(), dict(norm="post", tie_embeddings=False),
                                     dict(norm_type="rmsnorm", bias=False, positional="rope",
                                          n_kv_heads=1)])
def test_init_keys_shapes_and_scales(options):
    c = GPTConfig(vocab_size=300, n_layers=4, d_model=64, n_heads=4, d_ff=128, max_len=32, **options)
    p = init_gpt(c, rng=np.random.default_rng(0))
    shapes = gpt_param_shapes(c)
    assert {k: a.shape for k, a in p.items()} == shapes
    assert all(a.dtype == np.float32 for a in p.values())
    assert ("norm_f.gamma" in p) == (c.norm == "pre")
    assert ("lm_head.W" in p) == (not c.tie_embeddings)
    assert ("wpe" in p) == (c.positional == "learned")
    assert any(k.endswith(".beta") for k in p) == (c.norm_type == "layernorm" and c.bias)
    assert p["h0.attn.Wk"].shape == (64, c.n_kv_heads * 16)
    assert abs(p["wte"].std() - 0.02) < 0.002
    assert abs(p["h1.mlp.W1"].std() - 0.02) < 0.002
    assert abs(p["h2.attn.Wo"].std() - 0.02 / math.sqrt(8)) < 0.0006   # 1/sqrt(2 n_layers)
    assert abs(p["h3.mlp.W2"].std() - 0.02 / math.sqrt(8)) < 0.0006
    assert all(np.all(a == 1) for k, a in p.items() if k.endswith("gamma"))
    assert all(np.all(a == 0) for k, a in p.items() if a.ndim == 1 and not k.endswith("gamma"))


def test_float32_end_to_end():
    c = GPTConfig(**TINY, positional="rope", n_kv_heads=2)
    p = init_gpt(c, rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, 7, (2, 5))
    logits, cache = gpt_forward(p, ids, config=c)
    assert logits.dtype == np.float32
    assert cache["kv_cache"][0]["k"].dtype == np.float32
    grads = gpt_backward(np.ones_like(logits), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    loss, grads = gpt_loss(p, ids, ids, config=c)
    assert np.isfinite(loss) and all(g.dtype == np.float32 for g in grads.values())
    out, lg = generate(p, ids, config=c, max_new_tokens=3, rng=np.random.default_rng(0),
                       return_logits=True)
    assert out.shape == (2, 8) and lg.dtype == np.float32


def test_longer_than_max_len():
    learned = GPTConfig(**TINY)
    p, _ = _params(learned)
    with pytest.raises(ValueError, match="gpt_forward: ids reaches position 6 but max_len=6"):
        gpt_forward(p, np.zeros((1, 7), dtype=int), config=learned)
    _, cache = gpt_forward(p, np.zeros((1, 4), dtype=int), config=learned)
    with pytest.raises(ValueError, match="max_len"):
        gpt_forward(p, np.zeros((1, 3), dtype=int), config=learned, kv_cache=cache["kv_cache"])
    with pytest.raises(ValueError, match="generate: .* exceed max_len=6"):
        generate(p, np.zeros((1, 4), dtype=int), config=learned, max_new_tokens=4, top_k=1)
    assert generate(p, np.zeros((1, 4), dtype=int), config=learned, max_new_tokens=3,
                    top_k=1).shape == (1, 7)          # the last token is never fed back
    for positional in ("sinusoidal", "rope"):          # computed for any position
        c = GPTConfig(**TINY, positional=positional)
        q, _ = _params(c)
        logits, _ = gpt_forward(q, np.zeros((1, 9), dtype=int), config=c)
        assert logits.shape == (1, 9, 7) and np.all(np.isfinite(logits))


def test_bad_inputs():
    c = GPTConfig(**TINY)
    p, _ = _params(c)
    ids = np.zeros((2, 3), dtype=int)
    with pytest.raises(ValueError, match=r"gpt_forward: ids has values in \[0, 7\]; expected values in \[0, 7\)"):
        gpt_forward(p, np.array([[0, 7]]), config=c)
    with pytest.raises(ValueError, match="gpt_forward: ids"):
        gpt_forward(p, np.array([[-1, 2]]), config=c)
    with pytest.raises(TypeError, match="gpt_forward: ids has dtype float64"):
        gpt_forward(p, ids.astype(float), config=c)
    with pytest.raises(ValueError, match=r"gpt_forward: ids has shape \(3,\); expected \(batch, T\) with T >= 1"):
        gpt_forward(p, ids[0], config=c)
    with pytest.raises(TypeError, match="gpt_forward: config is a dict"):
        gpt_forward(p, ids, config=c.to_dict())
    with pytest.raises(ValueError, match="params is missing"):
        gpt_forward({k: a for k, a in p.items() if k != "h1.mlp.W2"}, ids, config=c)
    with pytest.raises(ValueError, match=r"params\['wte'\] has shape \(7, 9\); expected \(7, 8\)"):
        gpt_forward(dict(p, wte=np.zeros((7, 9))), ids, config=c)
    with pytest.raises(ValueError, match="unexpected keys"):
        gpt_forward(dict(p, **{"lm_head.W": np.zeros((8, 7))}), ids, config=c)
    with pytest.raises(TypeError, match="mix dtypes"):
        gpt_forward(dict(p, wte=p["wte"].astype(np.float32)), ids, config=c)
    with pytest.raises(ValueError, match="kv_cache"):
        gpt_forward(p, ids, config=c, kv_cache={"k": 0})
    with pytest.raises(TypeError, match="gpt_forward: rng"):
        gpt_forward(p, ids, config=GPTConfig(**TINY, dropout=0.1), train=True)
    logits, cache = gpt_forward(p, ids, config=c)
    with pytest.raises(ValueError, match="gpt_backward: dlogits has shape"):
        gpt_backward(logits[:, :2], cache)
    with pytest.raises(ValueError, match="generate: rng is None but sampling needs randomness"):
        generate(p, ids, config=c, max_new_tokens=2)
    with pytest.raises(ValueError, match="generate: temperature"):
        generate(p, ids, config=c, max_new_tokens=2, temperature=-1.0, top_k=1)
    with pytest.raises(ValueError, match="generate: prompt_ids has values"):
        generate(p, ids + 7, config=c, max_new_tokens=2, top_k=1)
    with pytest.raises(ValueError, match="generate: max_new_tokens"):
        generate(p, ids, config=c, max_new_tokens=-1, top_k=1)


def test_forward_and_backward_leave_params_unchanged():
    c = GPTConfig(**TINY, tie_embeddings=True, dropout=0.1)
    p, rng = _params(c)
    before = {k: a.copy() for k, a in p.items()}
    ids = rng.integers(0, 7, (2, 5))
    logits, cache = gpt_forward(p, ids, config=c, train=True, rng=np.random.default_rng(0))
    d = rng.standard_normal(logits.shape)
    d0 = d.copy()
    gpt_backward(d, cache)
    gpt_backward(d, cache)
    assert all(np.array_equal(p[k], before[k]) for k in p) and np.array_equal(d, d0)
    generate(p, ids, config=c, max_new_tokens=1, top_k=1)
    assert all(np.array_equal(p[k], before[k]) for k in p)


def test_loss_mask_leaves_positions_out_of_the_mean():
    c = GPTConfig(**TINY)
    p, rng = _params(c)
    ids = rng.integers(0, 7, (2, 5))
    targets = rng.integers(0, 7, (2, 5))
    mask = rng.random((2, 5)) < 0.6
    a, ga = gpt_loss(p, ids, targets, config=c, loss_mask=mask)
    b, gb = gpt_loss(p, ids, np.where(mask, targets, -100), config=c, ignore_index=-100)
    assert a == b and all(np.array_equal(ga[k], gb[k]) for k in p)
    with pytest.raises(ValueError, match="gpt_loss: loss_mask"):
        gpt_loss(p, ids, targets, config=c, loss_mask=mask.astype(int))
