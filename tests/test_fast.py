"""numpytfmr.fast against the reference, tensor by tensor.

float64: logits, every gradient, the loss, the attention weights and the KV cache agree to
1e-12 (relative to the tensor's magnitude); float32: to float32 rounding. Generation gives
the same tokens, AdamW the same parameters and moments, and the float32 GELU kernel is the
exact GELU to float32 precision, tails included.
"""
import math
import sys

import numpy as np
import pytest

import numpytfmr as R
from numpytfmr import fast
from numpytfmr.fast import kernels
from numpytfmr.optim import adamw_init

from conftest import well_conditioned

TINY = dict(vocab_size=13, n_layers=2, d_model=16, n_heads=4, d_ff=12, max_len=16)

CONFIGS = {
    "learned-pre-gelu-tied": dict(),
    "learned-post-gqa-untied-gelutanh": dict(norm="post", n_kv_heads=2, tie_embeddings=False,
                                             activation="gelu_tanh"),
    "sinusoidal-pre-mqa-rmsnorm-relu-nobias": dict(positional="sinusoidal", n_kv_heads=1,
                                                   tie_embeddings=False, norm_type="rmsnorm",
                                                   bias=False, activation="relu"),
    "sinusoidal-post-rmsnorm": dict(positional="sinusoidal", norm="post", norm_type="rmsnorm"),
    "rope-pre-gqa-swiglu": dict(positional="rope", n_kv_heads=2, bias=False, activation="swiglu"),
    "rope-half-post-mqa-scaled": dict(positional="rope", norm="post", n_kv_heads=1,
                                      tie_embeddings=False, rope_layout="half",
                                      rope_scaling={"type": "yarn", "factor": 4.0,
                                                    "original_max_positions": 8}),
    "rope-gqa-dropout": dict(positional="rope", n_kv_heads=2, rope_layout="half", dropout=0.2,
                             rope_scaling={"type": "linear", "factor": 2.0}),
    "learned-post-swiglu-dropout": dict(norm="post", activation="swiglu", bias=False,
                                        n_kv_heads=2, dropout=0.3),
}


def _model(options, dtype=np.float64, seed=0):
    c = R.GPTConfig(**TINY, **options)
    rng = np.random.default_rng(seed)
    p = well_conditioned(R.init_gpt(c, rng=rng, dtype=np.float64), rng)
    return c, {k: v.astype(dtype) for k, v in p.items()}, rng


def _err(a, b, scale=None):
    """max |a - b| relative to the magnitude of b (or to ``scale`` when that is larger:
    a gradient that is exactly 0 in theory, such as bk without RoPE, is rounding noise
    measured against the other gradients)."""
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    m = max(float(np.max(np.abs(b))), scale or 0.0, 1e-300)
    return float(np.max(np.abs(a - b))) / m


def _zero_in_theory(config):
    """Keys whose exact gradient is 0: without RoPE, bk adds q.bk to a whole row of scores,
    which the softmax ignores, so only rounding noise comes out of any implementation.
    These are measured against the largest gradient instead of their own size."""
    if config.positional == "rope" or not config.bias:
        return set()
    return {f"h{l}.attn.bk" for l in range(config.n_layers)}


def _grad_scales(gr, config):
    top = max(float(np.max(np.abs(g))) for g in gr.values())
    return {k: (top if k in _zero_in_theory(config) else 0.0) for k in gr}


def _assert_grads(gf, gr, tol, config):
    assert sorted(gf) == sorted(gr)
    scales = _grad_scales(gr, config)
    bad = {k: _err(gf[k], gr[k], scales[k]) for k in gr}
    bad = {k: e for k, e in bad.items() if not e <= tol}
    assert not bad, bad


def _f32_close(a, b, scale=None):
    """float32 rounding: |a - b| <= 1e-5 m + 1e-4 |b|, m = the magnitude of b."""
    assert a.dtype == b.dtype == np.float32
    m = max(float(np.max(np.abs(b))), scale or 0.0)
    return np.allclose(a, b, rtol=1e-4, atol=1e-5 * m)


# ---------------------------------------------------------------------------------------
# forward and backward, every configuration
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_every_gradient_match_the_reference_float64(name):
    c, p, rng = _model(CONFIGS[name])
    ids = rng.integers(0, c.vocab_size, (3, 7))
    train = c.dropout > 0
    lr, cr = R.gpt_forward(p, ids, config=c, train=train, rng=np.random.default_rng(5))
    lf, cf = fast.gpt_forward(p, ids, config=c, train=train, rng=np.random.default_rng(5))
    assert _err(lf, lr) <= 1e-12
    for l in range(c.n_layers):
        assert _err(cf["attn_weights"][l], cr["attn_weights"][l]) <= 1e-12
        for k in ("k", "v"):
            assert _err(np.asarray(cf["kv_cache"][l][k]), cr["kv_cache"][l][k]) <= 1e-12
    np.testing.assert_array_equal(cf["positions"], cr["positions"])
    dlogits = rng.standard_normal(lr.shape)
    _assert_grads(fast.gpt_backward(dlogits, cf), R.gpt_backward(dlogits, cr), 1e-12, c)


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "rope-pre-gqa-swiglu",
                                  "rope-half-post-mqa-scaled", "rope-gqa-dropout"])
def test_causal_query_blocks_give_the_same_numbers(name, monkeypatch):
    """Queries in blocks, each scored only against the keys it may see (as at T >= 128),
    with and without a KV cache in front: the same logits, weights and gradients."""
    from numpytfmr.fast import gpt as fast_gpt
    monkeypatch.setattr(fast_gpt, "QUERY_BLOCK", 3)            # T = 11 -> blocks of 3-4 rows
    assert len(fast_gpt.query_blocks(11)) == 3
    c, p, rng = _model(CONFIGS[name])
    ids = rng.integers(0, c.vocab_size, (2, 15))
    train = c.dropout > 0
    for past in (0, 4):
        kv_r = kv_f = None
        if past:
            kv_r = R.gpt_forward(p, ids[:, :past], config=c)[1]["kv_cache"]
            kv_f = fast.gpt_forward(p, ids[:, :past], config=c)[1]["kv_cache"]
        new = ids[:, past:past + 11]
        lr, cr = R.gpt_forward(p, new, config=c, kv_cache=kv_r, train=train,
                               rng=np.random.default_rng(5))
        lf, cf = fast.gpt_forward(p, new, config=c, kv_cache=kv_f, train=train,
                                  rng=np.random.default_rng(5))
        assert _err(lf, lr) <= 1e-12
        for l in range(c.n_layers):
            assert _err(cf["attn_weights"][l], cr["attn_weights"][l]) <= 1e-12
        dlogits = rng.standard_normal(lr.shape)
        _assert_grads(fast.gpt_backward(dlogits, cf), R.gpt_backward(dlogits, cr), 1e-12, c)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_float32_agrees_to_float32_rounding(name):
    c, p, rng = _model(CONFIGS[name], np.float32)
    ids = rng.integers(0, c.vocab_size, (2, 9))
    train = c.dropout > 0
    lr, cr = R.gpt_forward(p, ids, config=c, train=train, rng=np.random.default_rng(1))
    lf, cf = fast.gpt_forward(p, ids, config=c, train=train, rng=np.random.default_rng(1))
    assert _f32_close(lf, lr)
    dlogits = rng.standard_normal(lr.shape).astype(np.float32)
    gr, gf = R.gpt_backward(dlogits, cr), fast.gpt_backward(dlogits, cf)
    scales = _grad_scales(gr, c)
    bad = [k for k in gr if not _f32_close(gf[k], gr[k], scales[k])]
    assert not bad


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "rope-gqa-dropout",
                                  "learned-post-swiglu-dropout"])
@pytest.mark.parametrize("options", [dict(), dict(label_smoothing=0.1, ignore_index=3),
                                     dict(loss_mask=True)])
def test_loss_and_its_gradients_match_gpt_loss(name, options):
    c, p, rng = _model(CONFIGS[name])
    ids = rng.integers(0, c.vocab_size, (3, 6))
    targets = rng.integers(0, c.vocab_size, (3, 6))
    if options.get("loss_mask"):
        options = dict(loss_mask=rng.random((3, 6)) < 0.6)
    train = c.dropout > 0
    loss_r, gr = R.gpt_loss(p, ids, targets, config=c, train=train,
                            rng=np.random.default_rng(2), **options)
    loss_f, gf = fast.gpt_loss(p, ids, targets, config=c, train=train,
                               rng=np.random.default_rng(2), **options)
    assert isinstance(loss_f, float)
    assert abs(loss_f - loss_r) <= 1e-12 * abs(loss_r)
    _assert_grads(gf, gr, 1e-12, c)


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "rope-gqa-dropout",
                                  "learned-post-swiglu-dropout"])
def test_loss_workspace_is_reused_and_never_leaks_into_results(name):
    """gpt_loss keeps its activations in a Workspace between calls: a second call (other
    batch, then other shapes) reuses or replaces that memory, yet returns the reference's
    numbers and leaves the gradients of the first call untouched (they are new arrays)."""
    c, p, rng = _model(CONFIGS[name])
    train = c.dropout > 0
    ws = fast.Workspace()
    batches = [(rng.integers(0, c.vocab_size, s), rng.integers(0, c.vocab_size, s))
               for s in ((3, 6), (3, 6), (2, 9))]
    kept = []
    for ids, targets in batches:
        loss_r, gr = R.gpt_loss(p, ids, targets, config=c, train=train,
                                rng=np.random.default_rng(2))
        loss_f, gf = fast.gpt_loss(p, ids, targets, config=c, train=train,
                                   rng=np.random.default_rng(2), workspace=ws)
        assert abs(loss_f - loss_r) <= 1e-12 * abs(loss_r)
        _assert_grads(gf, gr, 1e-12, c)
        kept.append((gf, {k: v.copy() for k, v in gf.items()}))
        assert ws.arrays and not any(np.shares_memory(g, a) for g in gf.values()
                                     for a in ws.arrays.values())
    for gf, copy in kept:
        assert all(np.array_equal(gf[k], copy[k]) for k in copy)
    n_arrays = len(ws.arrays)
    fast.gpt_loss(p, *batches[-1], config=c, train=train, rng=np.random.default_rng(2),
                  workspace=ws)
    assert len(ws.arrays) == n_arrays                    # same shapes: nothing new
    assert isinstance(fast.loss_workspace(), fast.Workspace)
    with pytest.raises(TypeError, match="workspace"):
        fast.gpt_loss(p, *batches[0], config=c, workspace={})


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gradients_written_into_out_are_the_new_arrays_gradients(name):
    """gpt_loss(out=...) and gpt_backward(out=...) write the same numbers into the caller's
    arrays, whatever was in them (the previous step's gradients), and return those arrays."""
    c, p, rng = _model(CONFIGS[name])
    ids = rng.integers(0, c.vocab_size, (2, 7))
    targets = rng.integers(0, c.vocab_size, (2, 7))
    train = {"rng": np.random.default_rng(1), "train": True} if c.dropout else {}
    loss, want = fast.gpt_loss(p, ids, targets, config=c, **train)
    out = {k: rng.standard_normal(v.shape) for k, v in p.items()}     # stale contents
    train = {"rng": np.random.default_rng(1), "train": True} if c.dropout else {}
    loss2, got = fast.gpt_loss(p, ids, targets, config=c, out=out, **train)
    assert loss2 == loss and set(got) == set(p)
    assert all(got[k] is out[k] and np.array_equal(got[k], want[k]) for k in p)
    logits, cache = fast.gpt_forward(p, ids, config=c)
    dlogits = rng.standard_normal(logits.shape)
    want = fast.gpt_backward(dlogits, cache)
    got = fast.gpt_backward(dlogits, cache, out={k: np.full_like(v, 7.0) for k, v in p.items()})
    assert all(np.array_equal(got[k], want[k]) for k in p)


def test_out_arrays_are_checked():
    c, p, rng = _model(CONFIGS["learned-pre-gelu-tied"])
    ids = rng.integers(0, c.vocab_size, (2, 5))
    good = {k: np.zeros_like(v) for k, v in p.items()}
    bad_cases = [
        ({k: v for k, v in good.items() if k != "wte"}, ValueError, "missing \\['wte'\\]"),
        ({**good, "wte": good["wte"][:, :3]}, ValueError, r"out\['wte'\] is an array of shape"),
        ({**good, "wte": good["wte"].astype(np.float32)}, ValueError, "dtype float32"),
        ({**good, "wpe": p["wpe"]}, ValueError, "shares memory"),
        ({**good, "h0.attn.Wk": good["h0.attn.Wq"]}, ValueError, "shares memory"),
        ([1, 2], TypeError, "out is a list"),
    ]
    ro = np.zeros_like(p["wte"])
    ro.setflags(write=False)
    bad_cases.append(({**good, "wte": ro}, ValueError, "read-only"))
    for out, err, match in bad_cases:
        with pytest.raises(err, match=match):
            fast.gpt_loss(p, ids, ids, config=c, out=out)


def test_loss_in_float32_and_with_every_target_ignored():
    c, p, rng = _model(CONFIGS["rope-pre-gqa-swiglu"], np.float32)
    ids = rng.integers(0, c.vocab_size, (2, 8))
    targets = rng.integers(0, c.vocab_size, (2, 8))
    loss_r, gr = R.gpt_loss(p, ids, targets, config=c, label_smoothing=0.05)
    loss_f, gf = fast.gpt_loss(p, ids, targets, config=c, label_smoothing=0.05)
    assert abs(loss_f - loss_r) <= 1e-5 * abs(loss_r)
    scales = _grad_scales(gr, c)
    assert all(gf[k].dtype == np.float32 and _f32_close(gf[k], gr[k], scales[k]) for k in gr)
    none = np.full_like(targets, -100)
    loss_r, gr = R.gpt_loss(p, ids, none, config=c, ignore_index=-100)
    loss_f, gf = fast.gpt_loss(p, ids, none, config=c, ignore_index=-100)
    assert loss_f == loss_r == 0.0
    assert all(not np.any(g) for g in gf.values())


def test_backward_after_a_cached_forward_matches():
    """The cached keys and values are constants: the gradient reaches the new tokens only."""
    c, p, rng = _model(CONFIGS["rope-pre-gqa-swiglu"])
    ids = rng.integers(0, c.vocab_size, (2, 9))
    _, cr = R.gpt_forward(p, ids[:, :6], config=c)
    lr, cr = R.gpt_forward(p, ids[:, 6:], config=c, kv_cache=cr["kv_cache"])
    _, cf = fast.gpt_forward(p, ids[:, :6], config=c)
    lf, cf = fast.gpt_forward(p, ids[:, 6:], config=c, kv_cache=cf["kv_cache"])
    assert _err(lf, lr) <= 1e-12
    dlogits = rng.standard_normal(lr.shape)
    _assert_grads(fast.gpt_backward(dlogits, cf), R.gpt_backward(dlogits, cr), 1e-12, c)


def test_inputs_are_left_unchanged():
    c, p, rng = _model(CONFIGS["learned-post-swiglu-dropout"])
    before = {k: v.copy() for k, v in p.items()}
    ids = rng.integers(0, c.vocab_size, (2, 5))
    ids_before = ids.copy()
    logits, cache = fast.gpt_forward(p, ids, config=c, train=True, rng=np.random.default_rng(0))
    dlogits = np.ones_like(logits)
    fast.gpt_backward(dlogits, cache)
    fast.gpt_loss(p, ids, ids, config=c, train=True, rng=np.random.default_rng(0))
    assert all(np.array_equal(p[k], before[k]) for k in p)
    assert np.array_equal(ids, ids_before) and np.all(dlogits == 1.0)


# ---------------------------------------------------------------------------------------
# KV-cached decoding and generation
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "sinusoidal-pre-mqa-rmsnorm-relu-nobias",
                                  "rope-half-post-mqa-scaled", "rope-pre-gqa-swiglu"])
def test_cached_decoding_steps_equal_the_full_forward(name):
    c, p, rng = _model(CONFIGS[name])
    ids = rng.integers(0, c.vocab_size, (2, 10))
    full, _ = R.gpt_forward(p, ids, config=c)
    step, cache = fast.gpt_forward(p, ids[:, :4], config=c)        # prefill
    rows = [step]
    kv = cache["kv_cache"]
    for t in range(4, 10):                                          # one token at a time
        step, cache = fast.gpt_forward(p, ids[:, t:t + 1], config=c, kv_cache=kv)
        kv = cache["kv_cache"]
        rows.append(step)
    assert _err(np.concatenate(rows, axis=1), full) <= 1e-12
    assert R.kv_cache_size(kv) == 2 * c.n_layers * 2 * c.n_kv_heads * 10 * c.d_head
    # a fast cache continues a reference decoding and the other way round
    ref_step, _ = R.gpt_forward(p, ids[:, 9:], config=c,
                                kv_cache=fast.gpt_forward(p, ids[:, :9], config=c)[1]["kv_cache"])
    assert _err(ref_step[:, 0], full[:, 9]) <= 1e-12


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_greedy_token_for_token(name, use_cache):
    """Every configuration: generate's one-position decoding step (cached) and the full
    forward (uncached) give the reference's tokens and logits."""
    c, p, rng = _model(CONFIGS[name])
    prompt = rng.integers(0, c.vocab_size, (3, 4))
    ref, ref_logits = R.generate(p, prompt, config=c, max_new_tokens=8, top_k=1,
                                 return_logits=True)
    out, logits = fast.generate(p, prompt, config=c, max_new_tokens=8, top_k=1,
                                use_cache=use_cache, return_logits=True)
    np.testing.assert_array_equal(out, ref)
    assert _err(logits, ref_logits) <= 1e-12


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "learned-post-gqa-untied-gelutanh",
                                  "sinusoidal-pre-mqa-rmsnorm-relu-nobias",
                                  "rope-pre-gqa-swiglu", "rope-half-post-mqa-scaled"])
def test_generate_at_batch_one_token_for_token(name):
    """Batch 1, where the decoding step's products take the row as a vector: the
    reference's tokens and logits, and in float32 the tokens of the cache-less path."""
    c, p, rng = _model(CONFIGS[name])
    prompt = rng.integers(0, c.vocab_size, (1, 3))
    ref, ref_logits = R.generate(p, prompt, config=c, max_new_tokens=10, top_k=1,
                                 return_logits=True)
    out, logits = fast.generate(p, prompt, config=c, max_new_tokens=10, top_k=1,
                                return_logits=True)
    np.testing.assert_array_equal(out, ref)
    assert _err(logits, ref_logits) <= 1e-12
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    cached, l_cached = fast.generate(p32, prompt, config=c, max_new_tokens=10, top_k=1,
                                     return_logits=True)
    full, l_full = fast.generate(p32, prompt, config=c, max_new_tokens=10, top_k=1,
                                 use_cache=False, return_logits=True)
    np.testing.assert_array_equal(cached, full)
    assert _f32_close(l_cached, l_full)


@pytest.mark.parametrize("options", [dict(max_new_tokens=-1), dict(max_new_tokens=2, top_k=0),
                                     dict(max_new_tokens=2, temperature=1.0),
                                     dict(max_new_tokens=2, top_k=1, eos_id=13),
                                     dict(max_new_tokens=20, top_k=1)])
def test_generate_refuses_what_the_reference_refuses_with_its_message(options):
    """fast.generate checks its options with the reference's own check
    (gpt.generation_options): the same error, the same words but for the function's name."""
    c, p, rng = _model(CONFIGS["learned-pre-gelu-tied"])
    prompt = rng.integers(0, c.vocab_size, (2, 3))
    with pytest.raises((TypeError, ValueError)) as ref:
        R.generate(p, prompt, config=c, **options)
    with pytest.raises(type(ref.value)) as got:
        fast.generate(p, prompt, config=c, **options)
    assert str(got.value) == "fast." + str(ref.value)


def test_generate_sampling_and_eos_match():
    c, p, rng = _model(CONFIGS["rope-gqa-dropout"], np.float32)
    prompt = rng.integers(0, c.vocab_size, (4, 3))
    for kw in (dict(temperature=0.8, top_k=5), dict(temperature=1.3), dict(temperature=0.0)):
        ref = R.generate(p, prompt, config=c, max_new_tokens=10, rng=np.random.default_rng(7), **kw)
        out = fast.generate(p, prompt, config=c, max_new_tokens=10, rng=np.random.default_rng(7),
                            **kw)
        np.testing.assert_array_equal(out, ref)
    greedy = R.generate(p, prompt, config=c, max_new_tokens=6, top_k=1)
    eos = int(greedy[0, 4])
    ref = R.generate(p, prompt, config=c, max_new_tokens=6, top_k=1, eos_id=eos)
    out, logits = fast.generate(p, prompt, config=c, max_new_tokens=6, top_k=1, eos_id=eos,
                                return_logits=True)
    np.testing.assert_array_equal(out, ref)
    assert logits.dtype == np.float32 and logits.shape[0] == 4
    empty = fast.generate(p, prompt, config=c, max_new_tokens=0, return_logits=True, top_k=1)
    assert empty[0].shape == (4, 3) and empty[1].shape == (4, 0, c.vocab_size)


# ---------------------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_equals_the_reference(dtype):
    c, p, rng = _model(CONFIGS["learned-pre-gelu-tied"], dtype)
    no_decay = R.decay_exempt_keys(p)
    ref_p, ref_s = p, adamw_init(p)
    fast_p, fast_s = p, adamw_init(p)
    inplace_p = {k: v.copy() for k, v in p.items()}
    inplace_s = adamw_init(p)
    for step in range(3):
        g = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in p.items()}
        g_before = {k: v.copy() for k, v in g.items()}
        kw = dict(lr=1e-2 / (step + 1), weight_decay=0.1, no_decay=no_decay, beta2=0.99)
        ref_p, ref_s = R.adamw_step(ref_p, g, ref_s, **kw)
        passed_p, passed_s = fast_p, fast_s
        copies = ({k: v.copy() for k, v in fast_p.items()}, {k: v.copy() for k, v in fast_s.items()})
        fast_p, fast_s = fast.adamw_step(fast_p, g, fast_s, **kw)
        for passed, copy in zip((passed_p, passed_s), copies):   # new arrays: inputs untouched
            assert all(np.array_equal(passed[k], copy[k]) for k in copy)
        fast.adamw_step_(inplace_p, g, inplace_s, **kw)
        assert all(np.array_equal(g[k], g_before[k]) for k in g)
    assert int(fast_s["step"]) == int(inplace_s["step"]) == int(ref_s["step"]) == 3
    for k in ref_p:
        for a, b in ((fast_p[k], ref_p[k]), (inplace_p[k], ref_p[k]),
                     (fast_s["m/" + k], ref_s["m/" + k]), (fast_s["v/" + k], ref_s["v/" + k]),
                     (inplace_s["v/" + k], ref_s["v/" + k])):
            assert a.dtype == b.dtype == dtype
            if dtype == np.float64:
                assert _err(a, b) <= 1e-12, k
            else:
                assert _f32_close(a, b), k


def test_adamw_with_a_zero_learning_rate_only_moves_the_moments():
    rng = np.random.default_rng(3)
    p = {"w": rng.standard_normal((4, 5)), "b": rng.standard_normal(5)}
    g = {k: rng.standard_normal(v.shape) for k, v in p.items()}
    ref_p, ref_s = R.adamw_step(p, g, adamw_init(p), lr=0.0, weight_decay=0.1)
    fast_p, fast_s = fast.adamw_step(p, g, adamw_init(p), lr=0.0, weight_decay=0.1)
    for k in p:
        assert np.array_equal(fast_p[k], p[k]) and np.array_equal(ref_p[k], p[k])
        assert _err(fast_s["m/" + k], ref_s["m/" + k]) <= 1e-12
        assert _err(fast_s["v/" + k], ref_s["v/" + k]) <= 1e-12


@pytest.mark.parametrize("counts", [(1,) * 30, (2, 9, 1, 40, 8, 3), (200,), (9, 9, 9)])
def test_scatter_add_rows_accumulates_every_repeat(counts):
    """Ids repeated up to and beyond the kernel's levels, in a shuffled order."""
    rng = np.random.default_rng(len(counts))
    ids = rng.permutation(np.repeat(rng.permutation(60)[:len(counts)], counts))
    rows = rng.standard_normal((ids.size, 7))
    want = np.zeros((60, 7))
    np.add.at(want, ids, rows)
    got = np.zeros((60, 7))
    kernels.scatter_add_rows(got, ids, rows)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_grad_norm_in_place_equals_the_reference(max_norm, dtype):
    rng = np.random.default_rng(5)
    grads = {"a": rng.standard_normal((300, 700)).astype(dtype),     # more than one block
             "b": rng.standard_normal(11).astype(dtype)}
    want, want_norm = R.clip_grad_norm(grads, max_norm)
    got = {k: g.copy() for k, g in grads.items()}
    same, norm = fast.clip_grad_norm_(got, max_norm)
    assert same is got and norm == pytest.approx(want_norm, rel=1e-13)
    for k in grads:
        assert got[k].dtype == dtype
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12 if dtype == np.float64 else 1e-6)
    if max_norm > want_norm:                                          # no clipping: untouched
        assert all(np.array_equal(got[k], grads[k]) for k in grads)
    bad = {"a": np.ones(3), "b": np.array([1.0, np.nan])}
    with pytest.raises(ValueError, match=r"grads\['b'\] holds non-finite"):
        fast.clip_grad_norm_(bad, 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        fast.clip_grad_norm_(got, 0.0)


def test_adamw_rejects_mismatched_inputs():
    p = {"w": np.zeros((2, 3))}
    with pytest.raises(ValueError, match="grads keys"):
        fast.adamw_step(p, {}, adamw_init(p), lr=0.1)
    with pytest.raises(ValueError, match="shape"):
        fast.adamw_step(p, {"w": np.zeros(3)}, adamw_init(p), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        fast.adamw_step(p, {"w": np.zeros((2, 3))}, adamw_init(p), lr=-1.0)


# ---------------------------------------------------------------------------------------
# the float32 GELU kernel
# ---------------------------------------------------------------------------------------

def _exact_gelu(x):
    """x Phi(x), Phi(x) + x phi(x) and the sum of the magnitudes of the two terms, in
    float64 through math.erfc."""
    cdf = 0.5 * np.vectorize(math.erfc)(-x / math.sqrt(2.0))
    with np.errstate(over="ignore", under="ignore"):
        xpdf = x * np.exp(-0.5 * np.minimum(x * x, 1e4)) / math.sqrt(2.0 * math.pi)
    return x * cdf, cdf + xpdf, cdf + np.abs(xpdf)


def _within(got, want, size, x, eps, tiny):
    """|got - want| <= 4 eps (1 + x^2) size + 1000 tiny: the precision of the dtype times
    the condition number of GELU in its input (about x^2 in the tails: one rounding of x,
    or of x^2 inside exp(-x^2/2), moves the result by x^2 eps relative), plus the
    subnormal range."""
    bound = 4 * eps * (1 + x * x) * size + 1e3 * tiny
    return np.abs(got - want) <= bound


def test_float32_gelu_is_the_exact_gelu_to_float32_precision():
    """x Phi(x) and Phi(x) + x phi(x) against float64 math.erfc, on [-50, 50] (tails,
    the exact zero, the largest float32), with the bias added inside the kernel."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-50, 50, 200_001), rng.standard_normal(50_000) * 4,
                        [0.0, -0.0, 1e-30, -1e-30, 3e38, -3e38]]).astype(np.float32)
    bias = np.linspace(-0.25, 0.25, 7).astype(np.float32)
    x = x[: x.size // 7 * 7].reshape(-1, 7)
    out, dydx = kernels.gelu_float32(x.copy(), bias)
    xs = (x + bias).astype(np.float64)
    want_out, want_d, size_d = _exact_gelu(xs)
    f32 = np.finfo(np.float32)
    for got, want, size in ((out, want_out, np.abs(want_out)), (dydx, want_d, size_d)):
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        assert np.all(_within(got, want, size, xs, f32.eps, f32.tiny))
    bulk = np.abs(xs) <= 3                             # a few roundings, at most 8 eps
    assert np.all(np.abs(out - want_out)[bulk] <= 8 * f32.eps * np.abs(want_out)[bulk] + 1e-37)
    assert np.all(out[xs > 6] == x[xs > 6] + np.broadcast_to(bias, x.shape)[xs > 6])
    assert np.all(out[xs < -15] == 0.0)


@pytest.mark.parametrize("rows", [70, 1000])   # one block, and several
def test_float32_gelu_kernel_writes_over_its_input_and_takes_transposed_input(rows):
    """The output is the input array (contiguous: no new output array), and a transposed
    (non-contiguous) pre-activation with a bias gives what its contiguous copy gives."""
    x = np.random.default_rng(5).standard_normal((rows, 50)).astype(np.float32)
    bias = np.linspace(-1.0, 1.0, rows).astype(np.float32)
    a = np.ascontiguousarray(x.T)
    out, dydx = kernels.gelu_float32(a, bias)
    assert np.shares_memory(out, a) and out.shape == (50, rows)
    out_t, dydx_t = kernels.gelu_float32(x.T, bias)
    np.testing.assert_array_equal(out_t, out)
    np.testing.assert_array_equal(dydx_t, dydx)
    want, want_d, _ = _exact_gelu((x.T + bias).astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dydx, want_d, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 40), (8, 1024), (40, 1000)])   # one block, several
def test_float32_gelu_rows_are_the_kernels_numbers(shape):
    """gelu_float32_rows (a decoding step's GELU, in the calling thread) writes over its
    input the same bits as gelu_float32, bias included."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    bias = rng.standard_normal(shape[1]).astype(np.float32)
    a = x.copy()
    out = kernels.gelu_float32_rows(a, bias)
    assert out is a
    want, _ = kernels.gelu_float32(x.copy(), bias, need_grad=False)
    np.testing.assert_array_equal(out, want)


def test_float32_gelu_kernel_at_huge_and_tiny_inputs():
    """Huge inputs give x (and slope 1) or 0 (and slope 0), tiny ones x/2 (slope 1/2),
    with no invalid operation inside (the rational's y is capped before it could overflow)."""
    x = np.array([3e38, -3e38, 1e20, -1e20, 1e13, -1e13, 1e10, -1e10, 50.0, -50.0, 16.5,
                  -16.5, 1e-30, -1e-30, 0.0, -0.0], np.float32)
    with np.errstate(all="raise"):
        out, dydx = kernels.gelu_float32(x.copy(), None)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(dydx))
    big = np.abs(x) > 10
    np.testing.assert_array_equal(out[big & (x > 0)], x[big & (x > 0)])
    np.testing.assert_array_equal(out[big & (x < 0)], 0.0)
    np.testing.assert_array_equal(dydx[big], (x[big] > 0).astype(np.float32))
    tiny = ~big
    np.testing.assert_allclose(out[tiny], x[tiny] / 2, rtol=1e-6, atol=0)
    np.testing.assert_allclose(dydx[tiny], 0.5, rtol=1e-6)


def test_float32_gelu_rational_is_the_mills_ratio_to_its_stated_error():
    """P(y) / Q(y), the float32 GELU's Mills ratio Phi(-y) / phi(y), evaluated in float64
    against math.erfc: relative error under 5e-8 for y < 1 and 3.5e-8 (1 + y^2) up to
    y = 12.5 (the bounds its comment states), and within 2e-5 out to 14."""
    y = np.linspace(0.0, 14.0, 28_001)
    erfc = np.vectorize(math.erfc)
    mills = 0.5 * erfc(y / math.sqrt(2.0)) / (np.exp(-0.5 * y * y) / math.sqrt(2.0 * math.pi))
    P = np.polynomial.polynomial.polyval(y, kernels._MILLS_P)
    Q = np.polynomial.polynomial.polyval(y, kernels._MILLS_Q + (1.0,))
    rel = np.abs(P / Q / mills - 1.0)
    assert rel[y < 1].max() < 5e-8
    assert np.all(rel[y <= 12.5] <= 3.5e-8 * (1.0 + y[y <= 12.5] ** 2))
    assert rel.max() < 2e-5


def test_float64_gelu_kernel_matches_math_erfc():
    x = np.linspace(-40, 40, 4001)
    out, dydx = kernels.gelu_float64(x.copy())
    want_out, want_d, size_d = _exact_gelu(x)
    f64 = np.finfo(np.float64)
    assert np.all(_within(out, want_out, np.abs(want_out), x, f64.eps, f64.tiny))
    assert np.all(_within(dydx, want_d, size_d, x, f64.eps, f64.tiny))


# ---------------------------------------------------------------------------------------
# entry checks
# ---------------------------------------------------------------------------------------

def test_inputs_are_checked_once_at_the_entry():
    c, p, rng = _model(CONFIGS["learned-pre-gelu-tied"])
    ids = rng.integers(0, c.vocab_size, (2, 5))
    with pytest.raises(TypeError, match="GPTConfig"):
        fast.gpt_forward(p, ids, config=dict(TINY))
    with pytest.raises(ValueError, match="missing"):
        fast.gpt_forward({k: v for k, v in p.items() if k != "wte"}, ids, config=c)
    with pytest.raises(ValueError, match=r"params\['h0.attn.Wq'\] has shape"):
        fast.gpt_forward({**p, "h0.attn.Wq": p["h0.attn.Wq"][:, :3]}, ids, config=c)
    with pytest.raises(TypeError, match="mix dtypes"):
        fast.gpt_forward({**p, "wte": p["wte"].astype(np.float32)}, ids, config=c)
    with pytest.raises(ValueError, match="values in"):
        fast.gpt_forward(p, ids + c.vocab_size, config=c)
    with pytest.raises(ValueError, match="max_len"):
        fast.gpt_forward(p, rng.integers(0, c.vocab_size, (1, c.max_len + 1)), config=c)
    with pytest.raises(TypeError, match="rng"):
        fast.gpt_forward(p, ids, config=R.GPTConfig(**TINY, dropout=0.1), train=True)
    logits, cache = fast.gpt_forward(p, ids, config=c)
    with pytest.raises(ValueError, match="dlogits has shape"):
        fast.gpt_backward(logits[:, :-1], cache)
    with pytest.raises(ValueError, match="targets"):
        fast.gpt_loss(p, ids, ids + c.vocab_size, config=c)
    with pytest.raises(ValueError, match="rng is None"):
        fast.generate(p, ids, config=c, max_new_tokens=2, temperature=1.0)


def test_the_reference_never_enters_fast_code():
    """A reader stepping through numpytfmr.gpt_loss / gpt_forward stays in the reference."""
    c, p, rng = _model(CONFIGS["rope-pre-gqa-swiglu"])
    ids = rng.integers(0, c.vocab_size, (1, 4))
    seen = set()

    def tracer(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(tracer)
    try:
        R.gpt_loss(p, ids, ids, config=c)
        R.generate(p, ids, config=c, max_new_tokens=2, top_k=1)
    finally:
        sys.setprofile(None)
    assert any(f.endswith("gpt.py") for f in seen)
    assert not [f for f in seen if "fast" in f.replace("\\", "/").split("/")]


# ---------------------------------------------------------------------------------------
# LoRA and DPO (fast.posttrain against numpytfmr.posttrain)
# ---------------------------------------------------------------------------------------

def _adapted(name, dtype=np.float64):
    """A model with random (non-zero) adapters on Wq, Wv and, without SwiGLU, W1."""
    from numpytfmr.posttrain import add_lora
    c, p, rng = _model(CONFIGS[name], dtype)
    targets = ("Wq", "Wv") if c.activation == "swiglu" else ("Wq", "Wv", "W1")
    a = add_lora(p, c, r=3, targets=targets, rng=rng)
    a = {k: (v + 0.3 * rng.standard_normal(v.shape)).astype(dtype) for k, v in a.items()}
    return c, p, a, rng


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "rope-pre-gqa-swiglu"])
def test_lora_forward_backward_and_loss_match(name):
    from numpytfmr import posttrain as RP
    c, p, a, rng = _adapted(name)
    ids = rng.integers(0, c.vocab_size, (3, 6))
    lr, cr = RP.gpt_lora_forward(p, a, ids, config=c, alpha=6.0)
    lf, cf = fast.posttrain.gpt_lora_forward(p, a, ids, config=c, alpha=6.0)
    assert _err(lf, lr) <= 1e-12
    dlogits = rng.standard_normal(lr.shape)
    gr, gf = RP.gpt_lora_backward(dlogits, cr), fast.posttrain.gpt_lora_backward(dlogits, cf)
    assert sorted(gr) == sorted(gf) == sorted(a)
    assert max(_err(gf[k], gr[k]) for k in gr) <= 1e-12
    targets = np.where(rng.random((3, 6)) < 0.3, -1, rng.integers(0, c.vocab_size, (3, 6)))
    loss_r, gr = RP.gpt_lora_loss(p, a, ids, targets, config=c, alpha=6.0, ignore_index=-1,
                                  rank_stabilized=True)
    loss_f, gf = fast.posttrain.gpt_lora_loss(p, a, ids, targets, config=c, alpha=6.0,
                                              ignore_index=-1, rank_stabilized=True)
    assert abs(loss_f - loss_r) <= 1e-12 * abs(loss_r)
    assert max(_err(gf[k], gr[k]) for k in gr) <= 1e-12


@pytest.mark.parametrize("options", [dict(), dict(nll_weight=0.5, loss_type="hinge"),
                                     dict(precomputed=True, label_smoothing=0.1)])
def test_dpo_loss_grads_and_metrics_match(options):
    from numpytfmr import posttrain as RP
    c, p, a, rng = _adapted("rope-gqa-dropout")
    B, T = 4, 7
    batch = {"chosen_ids": rng.integers(0, c.vocab_size, (B, T)),
             "rejected_ids": rng.integers(0, c.vocab_size, (B, T))}
    for side in ("chosen", "rejected"):
        m = np.zeros((B, T), bool)
        m[:, 3:] = rng.random((B, T - 3)) < 0.8
        batch[f"{side}_mask"] = m
    options = dict(options)
    if options.pop("precomputed", False):
        ref, _ = RP.completion_logprobs_forward(
            p, None, np.concatenate([batch["chosen_ids"], batch["rejected_ids"]]),
            np.concatenate([batch["chosen_mask"], batch["rejected_mask"]]), config=c)
        options.update(ref_chosen=ref[:B], ref_rejected=ref[B:])
    loss_r, gr, mr = RP.dpo_loss_and_grads(p, a, batch, config=c, alpha=4.0, beta=0.5, **options)
    loss_f, gf, mf = fast.posttrain.dpo_loss_and_grads(p, a, batch, config=c, alpha=4.0, beta=0.5,
                                                       **options)
    assert abs(loss_f - loss_r) <= 1e-12 * abs(loss_r)
    assert sorted(gf) == sorted(gr) and max(_err(gf[k], gr[k]) for k in gr) <= 1e-12
    assert sorted(mf) == sorted(mr)
    for k in mr:
        assert np.allclose(mf[k], mr[k], rtol=1e-12, atol=0), k
    ids = np.concatenate([batch["chosen_ids"], batch["rejected_ids"]])
    mask = np.concatenate([batch["chosen_mask"], batch["rejected_mask"]])
    for adapters in (None, a):
        lr, _ = RP.completion_logprobs_forward(p, adapters, ids, mask, config=c, alpha=4.0)
        lf, _ = fast.posttrain.completion_logprobs_forward(p, adapters, ids, mask, config=c,
                                                           alpha=4.0)
        assert _err(lf, lr) <= 1e-12


def test_complete_prompts_and_completion_kl_match():
    from numpytfmr import posttrain as RP
    c, p, a, rng = _adapted("learned-pre-gelu-tied", np.float32)
    ids = rng.integers(3, c.vocab_size, (6, 5))
    lengths = np.array([2, 3, 2, 4, 3, 2])
    for kw in (dict(), dict(temperature=1.0, top_k=4)):
        sr, mr = RP.complete_prompts(p, ids, lengths, config=c, max_new_tokens=5, batch_size=2,
                                     rng=np.random.default_rng(4), **kw)
        sf, mf = fast.posttrain.complete_prompts(p, ids, lengths, config=c, max_new_tokens=5,
                                                 batch_size=2, rng=np.random.default_rng(4), **kw)
        np.testing.assert_array_equal(sf, sr)
        np.testing.assert_array_equal(mf, mr)
    kr = RP.completion_kl(p, a, sr, mr, config=c, alpha=4.0, batch_size=4)
    kf = fast.posttrain.completion_kl(p, a, sr, mr, config=c, alpha=4.0, batch_size=4)
    assert kr["kl_per_token"] > 0
    for k in kr:
        assert abs(kf[k] - kr[k]) <= 1e-4 * abs(kr[k]), k


# ---------------------------------------------------------------------------------------
# Multi-head attention: the GQA groups broadcast (fast) against repeated (reference)
# ---------------------------------------------------------------------------------------

MHA_CASES = {
    "mha": dict(n_heads=4, n_kv_heads=None),
    "gqa-causal-rope": dict(n_heads=4, n_kv_heads=2, causal=True, rope={"layout": "half"}),
    "mqa-bias-scale": dict(n_heads=4, n_kv_heads=1, bias=True, scale=0.3),
    "gqa-cached-rope": dict(n_heads=6, n_kv_heads=3, past=3, rope="interleaved"),
    "cross-padding": dict(n_heads=2, n_kv_heads=1, cross=True, padding=True),
}


def _mha_inputs(case, dtype=np.float64, seed=3):
    rng = np.random.default_rng(seed)
    H, H_kv = case["n_heads"], case["n_kv_heads"] or case["n_heads"]
    d_head, d_model, B, n_q = 4, 12, 2, 5
    n_k = 7 if case.get("cross") else n_q
    x_q = rng.standard_normal((B, n_q, d_model))
    x_kv = rng.standard_normal((B, n_k, d_model)) if case.get("cross") else x_q
    W = [rng.standard_normal(s) / 3 for s in ((d_model, H * d_head), (d_model, H_kv * d_head),
                                                (d_model, H_kv * d_head), (H * d_head, d_model))]
    b = [rng.standard_normal(s) / 3 for s in ((H * d_head,), (H_kv * d_head,), (H_kv * d_head,),
                                                (d_model,))]
    past = case.get("past", 0)
    kw = dict(n_heads=H, n_kv_heads=case["n_kv_heads"], rope=case.get("rope"), scale=case.get("scale"))
    if past:
        kw["kv_cache"] = {n: rng.standard_normal((B, H_kv, past, d_head)).astype(dtype) for n in "kv"}
    if case.get("causal") or past:
        kw["mask"] = R.causal_mask(n_q, past + n_k)
    if case.get("padding"):
        kw["mask"] = R.padding_mask(np.array([n_k, 3])[:, None], n_k)
    if case.get("bias"):
        kw["bias"] = rng.standard_normal((B, H, n_q, past + n_k))
    args = [a.astype(dtype) for a in [x_q, x_kv] + W + b]
    return args, kw, rng


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_fast_mha_equals_the_reference_float64(name):
    args, kw, rng = _mha_inputs(MHA_CASES[name])
    out_r, cache_r = R.mha_forward(*args, **kw)
    out_f, cache_f = fast.mha_forward(*args, **kw)
    assert _err(out_f, out_r) <= 1e-12
    assert _err(cache_f["weights"], cache_r["weights"]) <= 1e-12
    for n in "kv":
        assert _err(cache_f["kv_cache"][n], cache_r["kv_cache"][n]) == 0.0
    dout = rng.standard_normal(out_r.shape)
    for gf, gr in zip(fast.mha_backward(dout, cache_f), R.mha_backward(dout, cache_r)):
        assert (gf is None) == (gr is None)
        if gr is not None:
            assert _err(gf, gr) <= 1e-12


def test_fast_mha_float32_and_its_checks_are_the_references():
    args, kw, _ = _mha_inputs(MHA_CASES["gqa-causal-rope"], dtype=np.float32)
    out_r, _ = R.mha_forward(*args, **kw)
    out_f, _ = fast.mha_forward(*args, **kw)
    assert out_f.dtype == np.float32 and _f32_close(out_f, out_r)
    bad = dict(kw, n_kv_heads=3)
    for fn in (R.mha_forward, fast.mha_forward):
        with pytest.raises(ValueError, match="mha_forward: n_heads=4 is not divisible by n_kv_heads=3"):
            fn(*args, **bad)


def test_reference_gqa_repeats_each_key_value_head_for_its_group():
    """The reference builds the repeated keys (003 §5.2 as drawn); head i uses K_{i // group}."""
    K = np.arange(2 * 3 * 4, dtype=float).reshape(2, 3, 4)          # 2 kv heads
    Kh = R.repeat_kv(K, 3)
    assert Kh.shape == (6, 3, 4)
    for i in range(6):
        np.testing.assert_array_equal(Kh[i], K[i // 3])
    d = np.random.default_rng(0).standard_normal(Kh.shape)
    np.testing.assert_allclose(R.repeat_kv_backward(d, 3), d.reshape(2, 3, 3, 4).sum(1))


def test_kv_cache_grows_by_the_new_positions_and_keeps_the_old_cache():
    rng = np.random.default_rng(1)
    K1, V1 = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((2, 1, 3, 4))
    c1 = R.kv_cache_append(None, K1, V1)
    assert c1["k"] is K1 and c1["v"] is V1
    K2, V2 = rng.standard_normal((2, 1, 1, 4)), rng.standard_normal((2, 1, 1, 4))
    c2 = R.kv_cache_append(c1, K2, V2)
    assert c2["k"].shape == (2, 1, 4, 4) and c1["k"].shape == (2, 1, 3, 4)
    np.testing.assert_array_equal(c2["k"][..., :3, :], K1)
    np.testing.assert_array_equal(c2["v"][..., 3:, :], V2)


# ---------------------------------------------------------------------------------------
# the passes on several workers (fast.parallel): the same bits as on one
# ---------------------------------------------------------------------------------------

@pytest.fixture
def split_everything(monkeypatch):
    """Every pass split however small (row blocks of one row, GELU blocks of 64 elements),
    and a function that runs a call with n workers (a pool of n - 1 threads, whatever the
    number of cores: threads, not processes, so one core is enough)."""
    from numpytfmr.fast import parallel
    monkeypatch.setattr(parallel, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(parallel, "ROW_ALIGN", 1)
    monkeypatch.setattr(kernels, "GELU_BLOCK", 64)
    before = parallel.workers()

    def with_workers(n, fn, *args, **kwargs):
        parallel.set_workers(n)
        try:
            return fn(*args, **kwargs)
        finally:
            parallel.set_workers(before)
    yield with_workers
    parallel.set_workers(before)


def _bitwise(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_loss_and_gradients_on_several_workers_are_bitwise_those_of_one(name, dtype,
                                                                        split_everything):
    """gpt_loss with 2 and 3 workers (norms, GELU, residual adds in row blocks, pairs of
    sequences' attention on different workers) gives the one-worker loss and gradients bit
    for bit, and those are the reference's (1e-12 in float64)."""
    c, p, rng = _model(CONFIGS[name], dtype)
    ids = rng.integers(0, c.vocab_size, (5, 11))           # 3 pairs of sequences
    targets = rng.integers(0, c.vocab_size, (5, 11))
    train = {"rng": np.random.default_rng(4), "train": True} if c.dropout else {}
    runs = {}
    for n in (1, 2, 3):
        kw = {k: (np.random.default_rng(4) if k == "rng" else v) for k, v in train.items()}
        runs[n] = split_everything(n, fast.gpt_loss, p, ids, targets, config=c,
                                   workspace=fast.Workspace(), **kw)
    for n in (2, 3):
        assert runs[n][0] == runs[1][0]
        assert all(_bitwise(runs[n][1][k], runs[1][1][k]) for k in p), n
    if dtype == np.float64:
        kw = {k: (np.random.default_rng(4) if k == "rng" else v) for k, v in train.items()}
        loss_r, gr = R.gpt_loss(p, ids, targets, config=c, **kw)
        assert abs(runs[2][0] - loss_r) <= 1e-12 * abs(loss_r)
        _assert_grads(runs[2][1], gr, 1e-12, c)


@pytest.mark.parametrize("name", ["learned-pre-gelu-tied", "rope-half-post-mqa-scaled"])
def test_forward_and_generation_on_two_workers_are_bitwise_those_of_one(name, split_everything):
    c, p, rng = _model(CONFIGS[name], np.float32)
    ids = rng.integers(0, c.vocab_size, (4, 9))
    one = split_everything(1, fast.gpt_forward, p, ids, config=c)
    two = split_everything(2, fast.gpt_forward, p, ids, config=c)
    assert _bitwise(two[0], one[0])
    for l in range(c.n_layers):
        assert _bitwise(two[1]["attn_weights"][l], one[1]["attn_weights"][l])
    dlogits = rng.standard_normal(one[0].shape).astype(np.float32)
    g1 = split_everything(1, fast.gpt_backward, dlogits, one[1])
    g2 = split_everything(2, fast.gpt_backward, dlogits, two[1])
    assert all(_bitwise(g2[k], g1[k]) for k in p)
    prompt = rng.integers(0, c.vocab_size, (3, 4))
    kw = dict(config=c, max_new_tokens=6, temperature=0.9, return_logits=True)
    a = split_everything(1, fast.generate, p, prompt, rng=np.random.default_rng(3), **kw)
    b = split_everything(2, fast.generate, p, prompt, rng=np.random.default_rng(3), **kw)
    assert np.array_equal(a[0], b[0]) and _bitwise(a[1], b[1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_and_clipping_on_several_workers_are_bitwise_those_of_one(dtype, split_everything,
                                                                        monkeypatch):
    """The update in pieces (parameters split by rows, dealt to the workers) and the norm's
    block sums added in their one-worker order: the same bits, for new arrays and in place."""
    rng = np.random.default_rng(8)
    p = {"a": rng.standard_normal((37, 5)), "b": rng.standard_normal(3),
         "c": rng.standard_normal((2, 3, 4)), "s": np.array(0.5)}
    p = {k: v.astype(dtype) for k, v in p.items()}
    g = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in p.items()}
    kw = dict(lr=1e-2, weight_decay=0.1, no_decay={"b"})
    new = {n: split_everything(n, fast.adamw_step, p, g, adamw_init(p), **kw) for n in (1, 2, 3)}
    inplace = {}
    for n in (1, 2, 3):
        q, st = {k: v.copy() for k, v in p.items()}, adamw_init(p)
        split_everything(n, fast.adamw_step_, q, g, st, **kw)
        inplace[n] = (q, st)
    want_p, want_s = R.adamw_step(p, g, adamw_init(p), **kw)
    for n in (2, 3):
        for got_p, got_s in (new[n], inplace[n]):
            assert all(_bitwise(got_p[k], new[1][0][k]) for k in p)
            assert all(_bitwise(got_s[k], new[1][1][k]) for k in new[1][1] if k != "step")
    for k in p:
        assert _bitwise(inplace[1][0][k], new[1][0][k])
        if dtype == np.float64:
            assert _err(new[2][0][k], want_p[k]) <= 1e-12
    from numpytfmr.fast import optim as fast_optim
    monkeypatch.setattr(fast_optim, "NORM_BLOCK", 7)              # many blocks to share out
    clipped = {}
    for n in (1, 2, 3):
        gg = {k: v.copy() for k, v in g.items()}
        clipped[n] = split_everything(n, fast.clip_grad_norm_, gg, 0.5)
    want, want_norm = R.clip_grad_norm(g, 0.5)
    for n in (2, 3):
        assert clipped[n][1] == clipped[1][1]
        assert all(_bitwise(clipped[n][0][k], clipped[1][0][k]) for k in g)
    assert clipped[1][1] == pytest.approx(want_norm, rel=1e-12 if dtype == np.float64 else 1e-6)


def test_parallel_runs_every_part_and_raises_what_a_part_raised(split_everything):
    from numpytfmr.fast import parallel
    seen = []

    def part(i):
        seen.append((i, parallel.workers()))
        if i == 3:
            raise ZeroDivisionError("part 3")
    with pytest.raises(ZeroDivisionError, match="part 3"):
        split_everything(2, parallel.run, part, [(i,) for i in range(5)])
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3, 4]
    assert parallel.row_blocks(10, 3, align=4) == [(0, 4), (4, 8), (8, 10)]
    assert parallel.row_blocks(5, 1) == [(0, 5)]
    got = []
    split_everything(3, parallel.each, 7, lambda i, w: got.append((i, w)))
    assert sorted(got) == [(i, i % 3) for i in range(7)]
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="set_workers: n is"):
            parallel.set_workers(bad)
