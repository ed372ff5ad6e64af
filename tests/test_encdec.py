"""The encoder-decoder: gradients of every parameter, PyTorch's nn.Transformer, padding,
causality, cross-attention weights, greedy decoding, training, errors, dtypes."""
import json
import math

import numpy as np
import pytest

from conftest import well_conditioned
from numpytfmr.encdec import (EncDecConfig, encdec_backward, encdec_forward, encdec_generate,
                              encdec_loss, encdec_param_shapes, init_encdec)
from numpytfmr.gradcheck import check_gradients
from numpytfmr.optim import adam_init, adam_step

TINY = dict(src_vocab_size=9, tgt_vocab_size=7, n_enc_layers=2, n_dec_layers=2, d_model=8,
            n_heads=4, d_ff=6, max_len=8)


def _setup(config, seed=0, S=5, T=4):
    rng = np.random.default_rng(seed)
    p = well_conditioned(init_encdec(config, rng=rng, dtype=np.float64), rng)
    src = rng.integers(0, config.src_vocab_size, (2, S))
    tgt = rng.integers(0, config.tgt_vocab_size, (2, T))
    src_mask = np.ones((2, S), dtype=bool)
    src_mask[1, S - 2:] = False                    # the second source has 2 padding positions
    return p, src, tgt, src_mask, rng


@pytest.mark.parametrize("options", [
    dict(positional="learned", norm="pre", n_kv_heads=4, tie_embeddings=True, activation="gelu_tanh"),
    dict(positional="sinusoidal", norm="post", n_kv_heads=2, tie_embeddings=False, activation="gelu_tanh"),
    dict(positional="rope", norm="pre", n_kv_heads=1, norm_type="rmsnorm", bias=False,
         tie_embeddings=False, activation="gelu"),
], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_every_parameter_matches_finite_differences(options):
    c = EncDecConfig(**dict(TINY, n_enc_layers=1), **options)   # two decoder layers share memory
    p, src, tgt, src_mask, _ = _setup(c)
    keys = sorted(p)
    # bk of an attention without RoPE has an exactly zero gradient (softmax ignores a shift
    # of a whole row of scores); the cross-attention never uses RoPE
    zero = [k for k in keys if k.endswith(".bk") and (".cross." in k or c.positional != "rope")]
    keys = [k for k in keys if k not in zero]

    def fwd(*arrays):
        return encdec_forward({**p, **dict(zip(keys, arrays))}, src, tgt, config=c, src_mask=src_mask)

    def bwd(dlogits, cache):
        grads = encdec_backward(dlogits, cache)
        assert set(grads) == set(p)
        for k in zero:
            assert np.max(np.abs(grads[k])) < 1e-12, k
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [p[k] for k in keys], mode="directional", n_directions=2,
                          n_coordinates=1, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_matches_torch_transformer():
    """Pre-norm model against nn.Transformer(norm_first=True), whose encoder and decoder end
    in a final LayerNorm like our norm_f; learned positions and the tied output layer are
    written around it. Logits and every gradient at 1e-10 (float64)."""
    torch = pytest.importorskip("torch")
    c = EncDecConfig(**TINY, positional="learned", norm="pre", activation="relu")
    p, src, tgt, src_mask, rng = _setup(c)
    logits, cache = encdec_forward(p, src, tgt, config=c, src_mask=src_mask)
    d = rng.standard_normal(logits.shape)
    grads = encdec_backward(d, cache)

    model = torch.nn.Transformer(8, 4, 2, 2, dim_feedforward=6, dropout=0.0, activation="relu",
                                 batch_first=True, norm_first=True, dtype=torch.float64)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    names = {}                                  # our key -> (torch tensor, transform of its grad)
    with torch.no_grad():
        def mha(module, key):
            module.in_proj_weight.copy_(t(np.concatenate([p[f"{key}.W{n}"].T for n in "qkv"])))
            module.in_proj_bias.copy_(t(np.concatenate([p[f"{key}.b{n}"] for n in "qkv"])))
            module.out_proj.weight.copy_(t(p[f"{key}.Wo"].T))
            module.out_proj.bias.copy_(t(p[f"{key}.bo"]))
            for i, n in enumerate("qkv"):
                names[f"{key}.W{n}"] = (module.in_proj_weight, lambda g, i=i: g[8 * i:8 * i + 8].T)
                names[f"{key}.b{n}"] = (module.in_proj_bias, lambda g, i=i: g[8 * i:8 * i + 8])
            names[f"{key}.Wo"] = (module.out_proj.weight, lambda g: g.T)
            names[f"{key}.bo"] = (module.out_proj.bias, lambda g: g)

        def norm(module, key):
            module.weight.copy_(t(p[f"{key}.gamma"]))
            module.bias.copy_(t(p[f"{key}.beta"]))
            names[f"{key}.gamma"] = (module.weight, lambda g: g)
            names[f"{key}.beta"] = (module.bias, lambda g: g)

        def ffn(layer, key):
            for lin, n in ((layer.linear1, "1"), (layer.linear2, "2")):
                lin.weight.copy_(t(p[f"{key}.W{n}"].T))
                lin.bias.copy_(t(p[f"{key}.b{n}"]))
                names[f"{key}.W{n}"] = (lin.weight, lambda g: g.T)
                names[f"{key}.b{n}"] = (lin.bias, lambda g: g)

        for l, layer in enumerate(model.encoder.layers):
            mha(layer.self_attn, f"enc.h{l}.attn")
            norm(layer.norm1, f"enc.h{l}.attn_norm")
            norm(layer.norm2, f"enc.h{l}.mlp_norm")
            ffn(layer, f"enc.h{l}.mlp")
        for l, layer in enumerate(model.decoder.layers):
            mha(layer.self_attn, f"dec.h{l}.attn")
            mha(layer.multihead_attn, f"dec.h{l}.cross")
            norm(layer.norm1, f"dec.h{l}.attn_norm")
            norm(layer.norm2, f"dec.h{l}.cross_norm")
            norm(layer.norm3, f"dec.h{l}.mlp_norm")
            ffn(layer, f"dec.h{l}.mlp")
        norm(model.encoder.norm, "enc.norm_f")
        norm(model.decoder.norm, "dec.norm_f")
    tables = {k: torch.tensor(p[k], requires_grad=True) for k in ("enc.wte", "enc.wpe", "dec.wte", "dec.wpe")}
    xs = tables["enc.wte"][t(src)] + tables["enc.wpe"][:5]
    ys = tables["dec.wte"][t(tgt)] + tables["dec.wpe"][:4]
    pad = t(~src_mask)                          # torch: True = padding
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    out = model(xs, ys, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=pad,
                memory_key_padding_mask=pad)
    out = out @ tables["dec.wte"].T
    out.backward(t(d))
    np.testing.assert_allclose(logits, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k, (tensor, f) in names.items():
        names[k] = f(tensor.grad).numpy()
    names.update({k: v.grad.numpy() for k, v in tables.items()})
    assert set(names) == set(p)
    for k, g in names.items():
        assert np.max(np.abs(grads[k] - g)) <= 1e-10 * max(np.max(np.abs(g)), 1e-3), k


def test_cross_weights_padding_and_causality():
    c = EncDecConfig(**TINY, positional="learned", n_kv_heads=2)
    p, src, tgt, src_mask, rng = _setup(c)
    logits, cache = encdec_forward(p, src, tgt, config=c, src_mask=src_mask)
    assert logits.shape == (2, 4, 7)
    assert len(cache["cross_weights"]) == 2
    for w in cache["cross_weights"]:
        assert w.shape == (2, 4, 4, 5)                         # (B, n_heads, T, S): alignment table
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
        assert np.all(w[1, :, :, 3:] == 0)                     # padded source positions unused
    assert cache["memory"].shape == (2, 5, 8)
    # padded source tokens can be anything: the logits do not change (bitwise)
    other = src.copy()
    other[1, 3:] = (other[1, 3:] + 1) % 9
    assert np.array_equal(encdec_forward(p, other, tgt, config=c, src_mask=src_mask)[0], logits)
    # the decoder is causal in the target; every target position sees the whole source
    for t in range(3):
        changed = tgt.copy()
        changed[:, t + 1:] = rng.integers(0, 7, (2, 3 - t))
        out, _ = encdec_forward(p, src, changed, config=c, src_mask=src_mask)
        assert np.array_equal(out[:, :t + 1], logits[:, :t + 1])
    changed = src.copy()
    changed[0, -1] = (changed[0, -1] + 1) % 9
    out, _ = encdec_forward(p, changed, tgt, config=c, src_mask=src_mask)
    assert np.all(np.abs(out[0] - logits[0]).max(axis=-1) > 0)


@pytest.mark.parametrize("positional", ["learned", "rope"])
@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_greedy_decoding_cached_equals_uncached(positional, n_kv_heads):
    c = EncDecConfig(**TINY, positional=positional, n_kv_heads=n_kv_heads)
    p, src, _, src_mask, _ = _setup(c)
    a, wa = encdec_generate(p, src, config=c, max_new_tokens=6, bos_id=0, src_mask=src_mask,
                            return_cross_weights=True)
    b, wb = encdec_generate(p, src, config=c, max_new_tokens=6, bos_id=0, src_mask=src_mask,
                            use_cache=False, return_cross_weights=True)
    assert a.shape == (2, 7) and np.all(a[:, 0] == 0)
    assert np.array_equal(a, b)
    for x, y in zip(wa, wb):
        assert x.shape == (2, 4, 6, 5)
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)
    # each token is the argmax of the teacher-forced forward pass over the output so far
    logits, cache = encdec_forward(p, src, a[:, :-1], config=c, src_mask=src_mask)
    assert np.array_equal(a[:, 1:], np.argmax(logits, axis=-1))
    np.testing.assert_allclose(wa[0], cache["cross_weights"][0], rtol=1e-12, atol=1e-14)


def test_eos_stops_a_row():
    c = EncDecConfig(**TINY)
    p, src, _, _, _ = _setup(c)
    free = encdec_generate(p, src, config=c, max_new_tokens=6, bos_id=0)
    eos = int(free[0, 2])
    out = encdec_generate(p, src, config=c, max_new_tokens=6, bos_id=0, eos_id=eos)
    stop = 1 + int(np.flatnonzero(free[0, 1:] == eos)[0]) + 1
    assert np.array_equal(out[0, :stop], free[0, :stop]) and np.all(out[0, stop:] == eos)


def test_learns_to_reverse():
    """Source: 4 random tokens; target: them reversed, then eos. Adam, 150 steps: the loss
    falls from ~ln 8 and greedy decoding reverses unseen sources."""
    c = EncDecConfig(src_vocab_size=8, tgt_vocab_size=8, n_enc_layers=1, n_dec_layers=1, d_model=32,
                     n_heads=2, d_ff=64, max_len=8, positional="learned", activation="relu")
    rng = np.random.default_rng(0)
    p = init_encdec(c, rng=rng, dtype=np.float64)
    state = adam_init(p)
    losses = []
    bos, eos = 0, 1
    for _ in range(150):
        src = rng.integers(2, 8, (16, 4))
        tgt = np.concatenate([np.full((16, 1), bos), src[:, ::-1], np.full((16, 1), eos)], axis=1)
        loss, grads = encdec_loss(p, {"src_ids": src, "tgt_ids": tgt}, config=c)
        losses.append(loss)
        p, state = adam_step(p, grads, state, lr=5e-3)
    assert abs(losses[0] - math.log(8)) < 0.1
    assert np.mean(losses[-5:]) < 0.1
    src = rng.integers(2, 8, (100, 4))
    out = encdec_generate(p, src, config=c, max_new_tokens=5, bos_id=bos, eos_id=eos)
    assert np.mean(out[:, 1:5] == src[:, ::-1]) > 0.95
    assert np.mean(out[:, 5] == eos) > 0.95


def test_config_params_and_float32():
    c = EncDecConfig(**TINY, norm="post", tie_embeddings=False)
    assert EncDecConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    p = init_encdec(c, rng=np.random.default_rng(0))
    assert {k: a.shape for k, a in p.items()} == encdec_param_shapes(c)
    assert "enc.norm_f.gamma" not in p and "lm_head.W" in p and "dec.h1.cross.Wq" in p
    assert "enc.h0.cross.Wq" not in p
    src = np.random.default_rng(1).integers(0, 9, (2, 5))
    tgt = np.random.default_rng(2).integers(0, 7, (2, 3))
    logits, cache = encdec_forward(p, src, tgt, config=c)
    assert logits.dtype == np.float32 and cache["cross_weights"][0].dtype == np.float32
    grads = encdec_backward(np.ones_like(logits), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    loss, grads = encdec_loss(p, {"src_ids": src, "tgt_ids": tgt}, config=c)
    assert np.isfinite(loss) and all(g.dtype == np.float32 for g in grads.values())


def test_bad_inputs():
    c = EncDecConfig(**TINY, positional="learned")
    p, src, tgt, src_mask, _ = _setup(c)
    with pytest.raises(ValueError, match="EncDecConfig: n_heads is 4 and n_kv_heads is 3"):
        EncDecConfig(**dict(TINY, n_kv_heads=3))
    with pytest.raises(ValueError, match="EncDecConfig: tgt_vocab_size is 0"):
        EncDecConfig(**dict(TINY, tgt_vocab_size=0))
    with pytest.raises(ValueError, match=r"encdec_forward: src_ids has values in \[0, 9\]"):
        encdec_forward(p, np.array([[0, 9]]), tgt[:1], config=c)
    with pytest.raises(ValueError, match=r"encdec_forward: tgt_ids has values in \[0, 7\]"):
        encdec_forward(p, src, np.array([[0, 7], [1, 1]]), config=c)
    with pytest.raises(ValueError, match="same batch size"):
        encdec_forward(p, src[:1], tgt, config=c)
    with pytest.raises(ValueError, match="encdec_forward: tgt_ids reaches position 8 but max_len=8"):
        encdec_forward(p, src, np.zeros((2, 9), dtype=int), config=c)
    with pytest.raises(ValueError, match="encdec_forward: src_mask"):
        encdec_forward(p, src, tgt, config=c, src_mask=src_mask.astype(int))
    with pytest.raises(ValueError, match="encdec_forward: src_mask"):
        encdec_forward(p, src, tgt, config=c, src_mask=src_mask[:, :3])
    with pytest.raises(ValueError, match="params is missing"):
        encdec_forward({k: a for k, a in p.items() if k != "dec.h0.cross.Wq"}, src, tgt, config=c)
    with pytest.raises(ValueError, match="encdec_generate: bos_id"):
        encdec_generate(p, src, config=c, max_new_tokens=2, bos_id=7)
    with pytest.raises(ValueError, match="encdec_generate: max_new_tokens is 9 but max_len=8"):
        encdec_generate(p, src, config=c, max_new_tokens=9, bos_id=0)
    logits, cache = encdec_forward(p, src, tgt, config=c)
    with pytest.raises(ValueError, match="encdec_backward: dlogits has shape"):
        encdec_backward(logits[:, :1], cache)


def test_loss_reads_a_translation_batch():
    """encdec_loss on a batch dict: teacher forcing on tgt_ids[:, :-1], scored on tgt_ids[:, 1:]
    where loss_mask; equals the cross-entropy written out by hand."""
    c = EncDecConfig(**TINY)
    p, src, _, src_mask, rng = _setup(c)
    tgt = rng.integers(0, 7, (2, 5))
    loss_mask = np.array([[0, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=bool)
    batch = {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "loss_mask": loss_mask}
    loss, grads = encdec_loss(p, batch, config=c)
    logits, cache = encdec_forward(p, src, tgt[:, :-1], config=c, src_mask=src_mask)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, tgt[:, 1:, None], axis=-1)[..., 0]
    assert loss == pytest.approx(-picked[loss_mask[:, 1:]].mean(), rel=1e-12)
    dlogits = np.exp(logp) - np.eye(7)[tgt[:, 1:]]
    dlogits *= loss_mask[:, 1:, None] / loss_mask[:, 1:].sum()
    expected = encdec_backward(dlogits, cache)
    for k in p:
        np.testing.assert_allclose(grads[k], expected[k], rtol=1e-10, atol=1e-14)
    with pytest.raises(TypeError, match="encdec_loss: batch is a tuple"):
        encdec_loss(p, (src, tgt), config=c)
    with pytest.raises(ValueError, match="expected a key 'tgt_ids'"):
        encdec_loss(p, {"src_ids": src}, config=c)
    with pytest.raises(ValueError, match="encdec_loss: loss_mask"):
        encdec_loss(p, dict(batch, loss_mask=loss_mask[:, :3]), config=c)
