"""The recurrent encoder-decoder with additive attention (002 "Seq2seq meets attention",
"Hidden state of the decoder"): GRU cell gradients, closed forms and PyTorch; every model
parameter by finite differences and against PyTorch autograd; padding, attention weights,
the query h_{t-1}, greedy decoding, training, dtypes, errors."""
import numpy as np
import pytest

from numpytfmr.activations import softmax
from numpytfmr.run.data import BOS_ID, EOS_ID, decode_completion, make_translation
from numpytfmr.gradcheck import check_gradients
from numpytfmr.optim import adam_init, adam_step
from numpytfmr.registry.recurrent import _gru_cell_cases
from numpytfmr.rnn import (RNNSeq2SeqConfig, gru_cell_backward, gru_cell_forward,
                           init_seq2seq_rnn, rnn_seq2seq_backward, rnn_seq2seq_forward,
                           rnn_seq2seq_generate, rnn_seq2seq_loss, rnn_seq2seq_param_shapes)
from numpytfmr.scoring import additive_scores_forward

TINY = dict(src_vocab_size=9, tgt_vocab_size=7, d_emb=4, d_hidden=5, d_attn=3)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _setup(bidirectional=False, seed=0, S=5, T=4, dtype=np.float64):
    c = RNNSeq2SeqConfig(**TINY, bidirectional=bidirectional)
    rng = np.random.default_rng(seed)
    p = init_seq2seq_rnn(c, rng=rng, dtype=dtype)
    # biases O(0.3) rather than 0, so their gradients are checked at a generic point
    p = {k: (0.3 * rng.standard_normal(a.shape)).astype(dtype) if k.rsplit(".", 1)[-1].startswith("b")
         else a for k, a in p.items()}
    src = rng.integers(1, c.src_vocab_size, (3, S))
    tgt = rng.integers(0, c.tgt_vocab_size, (3, T))
    src_mask = np.ones((3, S), dtype=bool)
    src_mask[1, S - 2:] = False                     # two padding positions
    src_mask[2, 1:] = False                         # a one-word source
    src = np.where(src_mask, src, 0)
    return c, p, src, tgt, src_mask, rng


# ---------------------------------------------------------------------------------------
# GRU cell
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("i", range(5))
def test_gru_cell_matches_finite_differences(i):
    case = _gru_cell_cases(np.random.default_rng(i), np.float64)[i]
    res = check_gradients(gru_cell_forward, gru_cell_backward, case.args,
                          names=("e", "h_prev", "W_e", "W_h", "b", "c", "W_c"))
    assert res.passed, f"{case.label}\n{res}"
    assert max(res.errors.values()) <= 1e-7, str(res)


def test_gru_cell_equations_by_hand():
    """The slides' four lines written out gate by gate with separate matrices."""
    rng = np.random.default_rng(1)
    d, d_e, d_c = 4, 3, 5
    e, h, ctx = rng.standard_normal((2, d_e)), rng.standard_normal((2, d)), rng.standard_normal((2, d_c))
    W = {g: (rng.standard_normal((d_e, d)), rng.standard_normal((d, d)), rng.standard_normal((d_c, d)),
             rng.standard_normal(d)) for g in "rzh"}
    R = _sigmoid(h @ W["r"][1] + e @ W["r"][0] + ctx @ W["r"][2] + W["r"][3])
    Z = _sigmoid(h @ W["z"][1] + e @ W["z"][0] + ctx @ W["z"][2] + W["z"][3])
    h_tilde = np.tanh((R * h) @ W["h"][1] + e @ W["h"][0] + ctx @ W["h"][2] + W["h"][3])
    expected = Z * h + (1 - Z) * h_tilde
    stack = lambda j: np.concatenate([W[g][j] for g in "rzh"], axis=-1)   # noqa: E731
    out, cache = gru_cell_forward(e, h, stack(0), stack(1), stack(3), ctx, stack(2))
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(cache["R"], R, rtol=1e-13)
    np.testing.assert_allclose(cache["Z"], Z, rtol=1e-13)


def test_gru_cell_closed_forms():
    """Zero weights: R = Z = 1/2, h = h_prev/2 + tanh(b_h)/2. A saturated update gate
    (b_z = +40) keeps the state; a closed one (b_z = -40) takes the candidate."""
    d, d_e = 3, 2
    e, h = np.ones((1, d_e)), np.array([[0.5, -1.0, 2.0]])
    W_e, W_h = np.zeros((d_e, 3 * d)), np.zeros((d, 3 * d))
    b = np.concatenate([np.zeros(d), np.zeros(d), [0.1, -0.2, 0.3]])
    out, _ = gru_cell_forward(e, h, W_e, W_h, b)
    np.testing.assert_allclose(out, 0.5 * h + 0.5 * np.tanh([[0.1, -0.2, 0.3]]), rtol=1e-15)
    b_keep = b.copy()
    b_keep[d:2 * d] = 40.0
    np.testing.assert_allclose(gru_cell_forward(e, h, W_e, W_h, b_keep)[0], h, rtol=1e-15)
    b_take = b.copy()
    b_take[d:2 * d] = -40.0
    np.testing.assert_allclose(gru_cell_forward(e, h, W_e, W_h, b_take)[0],
                               np.tanh([[0.1, -0.2, 0.3]]), rtol=1e-15)


@pytest.mark.torch
def test_gru_cell_matches_torch_grucell_with_diagonal_W_hh():
    """torch.nn.GRUCell resets after the matrix product, tanh(W x + r * (U h)); the slides
    (and Cho et al.) before it, tanh(W x + U (r * h)). The two agree when U is diagonal,
    and then the gates and the update h = Z h_prev + (1 - Z) h~ must match torch's."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    d, d_e = 4, 3
    e, h = rng.standard_normal((5, d_e)), rng.standard_normal((5, d))
    W_e, W_h = rng.standard_normal((d_e, 3 * d)), rng.standard_normal((d, 3 * d))
    W_h[:, 2 * d:] = np.diag(rng.standard_normal(d))
    b = rng.standard_normal(3 * d)
    out, cache = gru_cell_forward(e, h, W_e, W_h, b)
    dout = rng.standard_normal(out.shape)
    de, dh, dW_e, dW_h, db, _, _ = gru_cell_backward(dout, cache)

    cell = torch.nn.GRUCell(d_e, d, dtype=torch.float64)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.from_numpy(W_e.T.copy()))      # torch: (3d, d_e), gates r, z, n
        cell.weight_hh.copy_(torch.from_numpy(W_h.T.copy()))
        cell.bias_ih.copy_(torch.from_numpy(b))
        cell.bias_hh.zero_()
    te = torch.tensor(e, requires_grad=True)
    th = torch.tensor(h, requires_grad=True)
    tout = cell(te, th)
    tout.backward(torch.from_numpy(dout))
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(de, te.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dh, th.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dW_e, cell.weight_ih.grad.numpy().T, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(db, cell.bias_ih.grad.numpy(), rtol=1e-10, atol=1e-13)
    # the off-diagonal entries of W_hh get a gradient here (torch's, restricted to a diagonal, does not)
    np.testing.assert_allclose(dW_h[:, :2 * d], cell.weight_hh.grad.numpy().T[:, :2 * d],
                               rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(np.diag(dW_h[:, 2 * d:]), np.diag(cell.weight_hh.grad.numpy().T[:, 2 * d:]),
                               rtol=1e-10, atol=1e-13)


# ---------------------------------------------------------------------------------------
# The whole model: gradients
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_every_parameter_matches_finite_differences(bidirectional):
    c, p, src, tgt, src_mask, _ = _setup(bidirectional)
    keys = sorted(p)
    assert set(keys) == set(rnn_seq2seq_param_shapes(c))

    def fwd(*arrays):
        return rnn_seq2seq_forward({**p, **dict(zip(keys, arrays))}, src, tgt, config=c,
                                   src_mask=src_mask)

    def bwd(dlogits, cache):
        grads = rnn_seq2seq_backward(dlogits, cache)
        assert list(grads) == list(rnn_seq2seq_param_shapes(c))
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [p[k] for k in keys], mode="directional", n_directions=4,
                          n_coordinates=2, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


def _torch_model(tp, src, tgt, src_mask, c):
    """The model of the module docstring written with torch ops, for autograd."""
    import torch
    d = c.d_hidden
    m = torch.from_numpy(src_mask)

    def cell(x, h, pre, W_e, W_h, b, ctx=None, W_c=None):
        P = x @ W_e + b
        if ctx is not None:
            P = P + ctx @ W_c
        R = torch.sigmoid(P[:, :d] + h @ W_h[:, :d])
        Z = torch.sigmoid(P[:, d:2 * d] + h @ W_h[:, d:2 * d])
        h_tilde = torch.tanh(P[:, 2 * d:] + (R * h) @ W_h[:, 2 * d:])
        return Z * h + (1 - Z) * h_tilde

    X = tp["enc.E"][torch.from_numpy(src)]
    B, S = src.shape

    def scan(pre, order):
        h = torch.zeros(B, d, dtype=torch.float64)
        H = [None] * S
        for s in order:
            h = torch.where(m[:, s, None], cell(X[:, s], h, pre, tp[pre + "W_e"], tp[pre + "W_h"],
                                                  tp[pre + "b"]), h)
            H[s] = h
        return torch.stack(H, 1), h

    H, h_fin = scan("enc.", range(S))
    if c.bidirectional:
        H_rev, h_fin = scan("enc_rev.", range(S - 1, -1, -1))
        H = torch.cat([H, H_rev], -1)
    h = torch.tanh(h_fin @ tp["dec.W_init"] + tp["dec.b_init"])
    E = tp["dec.E"][torch.from_numpy(tgt)]
    Hk = H @ tp["attn.Wk"]
    logits = []
    for t in range(tgt.shape[1]):
        a = torch.tanh((h @ tp["attn.Wq"])[:, None, :] + Hk) @ tp["attn.w"]       # (B, S)
        alpha = torch.softmax(a.masked_fill(~m, -torch.inf), -1)
        ctx = (alpha[:, :, None] * H).sum(1)
        h = cell(E[:, t], h, "dec.", tp["dec.W_e"], tp["dec.W_h"], tp["dec.b"], ctx, tp["dec.W_c"])
        logits.append(h @ tp["out.W_yh"] + E[:, t] @ tp["out.W_ye"] + ctx @ tp["out.W_yc"] + tp["out.b_y"])
    return torch.stack(logits, 1)


@pytest.mark.torch
@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_logits_and_gradients_match_torch_autograd(bidirectional):
    torch = pytest.importorskip("torch")
    c, p, src, tgt, src_mask, rng = _setup(bidirectional)
    logits, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    d = rng.standard_normal(logits.shape)
    grads = rnn_seq2seq_backward(d, cache)
    tp = {k: torch.tensor(a, requires_grad=True) for k, a in p.items()}
    tlogits = _torch_model(tp, src, tgt, src_mask, c)
    tlogits.backward(torch.from_numpy(d))
    np.testing.assert_allclose(logits, tlogits.detach().numpy(), rtol=1e-10, atol=1e-13)
    for k in p:
        np.testing.assert_allclose(grads[k], tp[k].grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=k)


# ---------------------------------------------------------------------------------------
# Padding, attention weights, the query h_{t-1}
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_attention_weights_rows_sum_to_one_and_skip_padding(bidirectional):
    c, p, src, tgt, src_mask, _ = _setup(bidirectional)
    _, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    A = cache["weights"]
    assert A.shape == (3, 4, 5)
    np.testing.assert_allclose(A.sum(-1), 1.0, rtol=1e-13)
    assert np.all(A[~np.broadcast_to(src_mask[:, None, :], A.shape)] == 0.0)
    assert np.all(A[2, :, 0] == 1.0)                # a one-word source: all weight on it
    # c_t = sum_s alpha_ts h'_s
    np.testing.assert_allclose(cache["contexts"], A @ cache["enc_states"], rtol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_padding_changes_nothing(bidirectional):
    """Appending padding positions (with arbitrary ids behind the mask) leaves the logits,
    the weights on real words and the parameter gradients as they were."""
    c, p, src, tgt, src_mask, rng = _setup(bidirectional)
    logits, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    d = rng.standard_normal(logits.shape)
    grads = rnn_seq2seq_backward(d, cache)
    junk = rng.integers(0, c.src_vocab_size, (3, 3))
    src2 = np.concatenate([np.where(src_mask, src, rng.integers(0, 9, src.shape)), junk], axis=1)
    mask2 = np.concatenate([src_mask, np.zeros((3, 3), dtype=bool)], axis=1)
    logits2, cache2 = rnn_seq2seq_forward(p, src2, tgt, config=c, src_mask=mask2)
    np.testing.assert_allclose(logits2, logits, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(cache2["weights"][..., :5], cache["weights"], rtol=1e-12, atol=1e-15)
    grads2 = rnn_seq2seq_backward(d, cache2)
    for k in p:
        np.testing.assert_allclose(grads2[k], grads[k], rtol=1e-10, atol=1e-13, err_msg=k)


def test_source_of_padded_row_equals_unpadded_sentence():
    """Row 1 (3 words + 2 padding) gives the same logits as the 3-word sentence alone."""
    c, p, src, tgt, src_mask, _ = _setup()
    logits, _ = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    alone, _ = rnn_seq2seq_forward(p, src[1:2, :3], tgt[1:2], config=c)
    np.testing.assert_allclose(logits[1:2], alone, rtol=1e-12, atol=1e-14)


def test_attention_query_is_the_previous_state():
    """The weights of step t depend on x_1 .. x_{t-1} only (the query is h_{t-1}, as in
    Bahdanau et al. and 003 §5.1; the slides' query h_t would be circular): changing the
    input word at step t changes h_t but not alpha_t."""
    c, p, src, tgt, src_mask, _ = _setup()
    _, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    tgt2 = tgt.copy()
    tgt2[:, 2] = (tgt[:, 2] + 1) % c.tgt_vocab_size
    _, cache2 = rnn_seq2seq_forward(p, src, tgt2, config=c, src_mask=src_mask)
    np.testing.assert_array_equal(cache2["weights"][:, :3], cache["weights"][:, :3])
    assert np.abs(cache2["dec_states"][:, 2] - cache["dec_states"][:, 2]).max() > 1e-3
    assert np.abs(cache2["weights"][:, 3] - cache["weights"][:, 3]).max() > 1e-6
    # alpha_1 is scored against h_0 = tanh(h'_fin W_init + b_init)
    S, _ = additive_scores_forward(cache["h0"][:, None, :], cache["enc_states"], p["attn.Wq"],
                                   p["attn.Wk"], p["attn.w"])
    S = np.where(src_mask[:, None, :], S, -np.inf)
    alpha = np.exp(S - S.max(-1, keepdims=True))
    np.testing.assert_allclose(cache["weights"][:, :1], alpha / alpha.sum(-1, keepdims=True), rtol=1e-12)


def test_slides_score_without_tanh_ignores_the_query():
    """Erratum, 002 "Seq2seq meets attention": a(h_t, h'_s) = v_a^T (W_ah h_t + W'_ah h'_s)
    without a tanh adds the same v_a^T W_ah h_t to every source position, so the softmax
    weights are the same for every decoder state. With the tanh they are not."""
    rng = np.random.default_rng(3)
    H = rng.standard_normal((6, 5))                  # encoder states h'_s
    q = rng.standard_normal((4, 5))                  # four different decoder states
    Wq, Wk, w = rng.standard_normal((5, 3)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    linear = softmax((q @ Wq)[:, None, :] @ w + (H @ Wk) @ w)   # (4, 6)
    np.testing.assert_allclose(linear, np.broadcast_to(linear[0], linear.shape), rtol=1e-12)
    S, _ = additive_scores_forward(q, H, Wq, Wk, w)
    assert np.abs(softmax(S) - softmax(S)[0]).max() > 1e-2


# ---------------------------------------------------------------------------------------
# Decoding and training
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_greedy_generation_agrees_with_teacher_forced_forward(bidirectional):
    """Feeding the generated words back through the teacher-forced forward gives logits
    whose argmax is the next generated word, and the same attention weights."""
    c, p, src, _, src_mask, _ = _setup(bidirectional)
    out, A = rnn_seq2seq_generate(p, src, config=c, max_new_tokens=5, bos_id=BOS_ID,
                                  src_mask=src_mask, return_weights=True)
    assert out.shape == (3, 6) and np.all(out[:, 0] == BOS_ID)
    logits, cache = rnn_seq2seq_forward(p, src, out[:, :-1], config=c, src_mask=src_mask)
    np.testing.assert_array_equal(np.argmax(logits, -1), out[:, 1:])
    np.testing.assert_allclose(A, cache["weights"], rtol=1e-12, atol=1e-15)


def test_generation_stops_at_eos():
    c, p, src, _, src_mask, _ = _setup()
    p = dict(p)
    b = np.zeros(c.tgt_vocab_size)
    b[EOS_ID] = 50.0                                 # the model always says <eos>
    p["out.b_y"] = b
    out = rnn_seq2seq_generate(p, src, config=c, max_new_tokens=6, bos_id=BOS_ID, eos_id=EOS_ID,
                               src_mask=src_mask)
    np.testing.assert_array_equal(out, np.array([[BOS_ID] + [EOS_ID] * 6] * 3))


def test_loss_matches_cross_entropy_and_falls_with_adam():
    """A few dozen Adam steps on eight toy translation pairs: the loss falls from about
    ln V to near 0 and greedy decoding reproduces the eight translations;
    rnn_seq2seq_loss equals the masked mean -log p of the next target word."""
    data = make_translation(8, rng=0)
    c = RNNSeq2SeqConfig(src_vocab_size=data["src_tokenizer"].vocab_size,
                         tgt_vocab_size=data["tgt_tokenizer"].vocab_size, d_emb=12, d_hidden=16,
                         bidirectional=True)
    batch = {k: data[k] for k in ("src_ids", "src_mask", "tgt_ids", "loss_mask")}
    params = init_seq2seq_rnn(c, rng=np.random.default_rng(0), dtype=np.float64)

    loss0, grads = rnn_seq2seq_loss(params, batch, config=c)
    logits, _ = rnn_seq2seq_forward(params, batch["src_ids"], batch["tgt_ids"][:, :-1], config=c,
                                    src_mask=batch["src_mask"])
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, batch["tgt_ids"][:, 1:, None], -1)[..., 0]
    m = batch["loss_mask"][:, 1:]
    assert loss0 == pytest.approx(nll[m].mean(), rel=1e-12)
    assert loss0 == pytest.approx(np.log(c.tgt_vocab_size), rel=0.5)   # near uniform at the start

    state = adam_init(params)
    for _ in range(40):
        loss, grads = rnn_seq2seq_loss(params, batch, config=c)
        params, state = adam_step(params, grads, state, lr=0.03)
    assert loss < 0.05 * loss0, (loss0, loss)
    out = rnn_seq2seq_generate(params, batch["src_ids"], config=c, max_new_tokens=9, bos_id=BOS_ID,
                               eos_id=EOS_ID, src_mask=batch["src_mask"])
    tok = data["tgt_tokenizer"]
    assert [decode_completion(row[1:], tok) for row in out] == data["targets"]


# ---------------------------------------------------------------------------------------
# dtypes and errors
# ---------------------------------------------------------------------------------------

def test_float32_stays_float32():
    c, p, src, tgt, src_mask, rng = _setup(bidirectional=True, dtype=np.float32)
    logits, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    assert logits.dtype == np.float32 and cache["weights"].dtype == np.float32
    grads = rnn_seq2seq_backward(rng.standard_normal(logits.shape).astype(np.float32), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    grads64 = rnn_seq2seq_backward(rng.standard_normal(logits.shape), cache)   # float64 dout
    assert all(g.dtype == np.float32 for g in grads64.values())
    loss, grads = rnn_seq2seq_loss(p, {"src_ids": src, "src_mask": src_mask, "tgt_ids": tgt}, config=c)
    assert np.isfinite(loss) and all(g.dtype == np.float32 for g in grads.values())
    _, A = rnn_seq2seq_generate(p, src, config=c, max_new_tokens=2, bos_id=1, src_mask=src_mask,
                                return_weights=True)
    assert A.dtype == np.float32
    h, gc = gru_cell_forward(*_gru_cell_cases(rng, np.float32)[0].args)
    assert h.dtype == np.float32
    assert all(g.dtype == np.float32 for g in gru_cell_backward(np.ones_like(h), gc))


def test_inputs_and_cache_untouched():
    c, p, src, tgt, src_mask, rng = _setup()
    before = {k: a.copy() for k, a in p.items()}
    logits, cache = rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask)
    d = rng.standard_normal(logits.shape)
    d0 = d.copy()
    g1 = rnn_seq2seq_backward(d, cache)
    g2 = rnn_seq2seq_backward(d, cache)              # a second call sees the same cache
    for k in p:
        np.testing.assert_array_equal(p[k], before[k])
        np.testing.assert_array_equal(g1[k], g2[k])
    np.testing.assert_array_equal(d, d0)


def test_config_round_trip_and_init():
    c = RNNSeq2SeqConfig(**TINY, bidirectional=True)
    assert RNNSeq2SeqConfig.from_dict(c.to_dict()) == c
    assert RNNSeq2SeqConfig(src_vocab_size=3, tgt_vocab_size=4, d_hidden=6).d_attn == 6
    p = init_seq2seq_rnn(c, rng=np.random.default_rng(0))
    assert {k: a.shape for k, a in p.items()} == rnn_seq2seq_param_shapes(c)
    assert all(a.dtype == np.float32 for a in p.values())
    for key in ("enc.W_h", "enc_rev.W_h", "dec.W_h"):      # orthogonal gate blocks
        for g in range(3):
            U = p[key][:, 5 * g:5 * g + 5].astype(np.float64)
            np.testing.assert_allclose(U.T @ U, np.eye(5), atol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda c, p, s, t, m: rnn_seq2seq_forward(p, np.where(m, s, 9), t, config=c, src_mask=m),
     r"rnn_seq2seq_forward: src_ids has values in \[\d, 9\]; expected values in \[0, 9\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward(p, s, t - 1, config=c, src_mask=m),
     r"rnn_seq2seq_forward: tgt_in_ids has values in \[-1, \d\]"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward(p, s, t[:2], config=c, src_mask=m),
     r"rnn_seq2seq_forward: src_ids has shape \(3, 5\) and tgt_in_ids has shape \(2, 4\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward(p, s, t, config=c, src_mask=m[:, :4]),
     r"rnn_seq2seq_forward: src_mask has shape \(3, 4\) but src_ids has shape \(3, 5\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward(p, s[0], t, config=c),
     r"rnn_seq2seq_forward: src_ids has shape \(5,\); expected \(batch, length\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward({**p, "dec.W_c": p["dec.W_c"][:-1]}, s, t, config=c),
     r"rnn_seq2seq_forward: params\['dec.W_c'\] has shape \(4, 15\); expected \(5, 15\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_forward({k: a for k, a in p.items() if k != "attn.w"}, s, t,
                                               config=c),
     r"rnn_seq2seq_forward: params has missing keys \['attn.w'\]"),
    (lambda c, p, s, t, m: rnn_seq2seq_backward(np.ones((3, 4, 6)),
                                                rnn_seq2seq_forward(p, s, t, config=c)[1]),
     r"rnn_seq2seq_backward: dlogits has shape \(3, 4, 6\); expected the logits' shape \(3, 4, 7\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_generate(p, s, config=c, max_new_tokens=2, bos_id=7),
     r"rnn_seq2seq_generate: bos_id has values in \[7, 7\]; expected values in \[0, 7\)"),
    (lambda c, p, s, t, m: rnn_seq2seq_loss(p, {"src_ids": s}, config=c),
     r"rnn_seq2seq_loss: batch has keys \['src_ids'\]; expected a key 'tgt_ids'"),
])
def test_bad_input_raises_value_error(call, match):
    c, p, src, tgt, src_mask, _ = _setup()
    with pytest.raises(ValueError, match=match):
        call(c, p, src, tgt, src_mask)


def test_bad_input_type_errors():
    c, p, src, tgt, src_mask, _ = _setup()
    with pytest.raises(TypeError, match="rnn_seq2seq_forward: src_ids has dtype float64"):
        rnn_seq2seq_forward(p, src.astype(float), tgt, config=c)
    with pytest.raises(TypeError, match="rnn_seq2seq_forward: src_mask has dtype int64"):
        rnn_seq2seq_forward(p, src, tgt, config=c, src_mask=src_mask.astype(np.int64))
    with pytest.raises(TypeError, match="rnn_seq2seq_forward: config is a dict"):
        rnn_seq2seq_forward(p, src, tgt, config=c.to_dict())
    with pytest.raises(TypeError, match="params mix dtypes"):
        rnn_seq2seq_forward({**p, "out.b_y": p["out.b_y"].astype(np.float32)}, src, tgt, config=c)
    with pytest.raises(ValueError, match="RNNSeq2SeqConfig: d_hidden is 0"):
        RNNSeq2SeqConfig(src_vocab_size=3, tgt_vocab_size=3, d_hidden=0)
    with pytest.raises(TypeError, match="RNNSeq2SeqConfig: bidirectional is 'yes'"):
        RNNSeq2SeqConfig(src_vocab_size=3, tgt_vocab_size=3, bidirectional="yes")


def test_gru_cell_bad_input():
    e, h, W_e, W_h, b, ctx, W_c = _gru_cell_cases(np.random.default_rng(0), np.float64)[0].args
    with pytest.raises(ValueError, match=r"gru_cell_forward: W_h has shape \(7, 14\) but h_prev"):
        gru_cell_forward(e, h, W_e, W_h[:, :14], b, ctx, W_c)
    with pytest.raises(ValueError, match=r"gru_cell_forward: W_e has shape \(4, 21\) but e has shape \(3, 5\)"):
        gru_cell_forward(e, h, W_e[:4], W_h, b, ctx, W_c)
    with pytest.raises(ValueError, match=r"gru_cell_forward: the leading \(batch\) axes of e \(2, 5\), h_prev \(3, 7\)"):
        gru_cell_forward(e[:2], h, W_e, W_h, b, ctx, W_c)
    with pytest.raises(ValueError, match="gru_cell_forward: c is given but W_c is None"):
        gru_cell_forward(e, h, W_e, W_h, b, ctx, None)
    with pytest.raises(ValueError, match=r"gru_cell_forward: W_c has shape \(3, 21\) but c has shape \(3, 4\)"):
        gru_cell_forward(e, h, W_e, W_h, b, ctx, W_c[:3])
    with pytest.raises(ValueError, match=r"gru_cell_forward: b has shape \(20,\)"):
        gru_cell_forward(e, h, W_e, W_h, b[:20], ctx, W_c)
    with pytest.raises(TypeError, match="gru_cell_forward: e has integer dtype"):
        gru_cell_forward([[1, 2, 3, 4, 5]] * 3, h, W_e, W_h, b, ctx, W_c)
    _, cache = gru_cell_forward(e, h, W_e, W_h, b, ctx, W_c)
    with pytest.raises(ValueError, match=r"gru_cell_backward: dout has shape \(3, 6\)"):
        gru_cell_backward(np.ones((3, 6)), cache)
