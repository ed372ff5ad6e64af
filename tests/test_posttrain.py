"""Post-training a GPT (numpytfmr.posttrain): LoRA inside the model (000 §2.7), the reward
head and reward model (003 §9.1.2), and DPO with LoRA adapters (003 §9.2)."""
import numpy as np
import pytest

from numpytfmr.run.data import CharTokenizer, EOS_ID, PAD_ID, make_preference_pairs, make_task
from numpytfmr.gpt import GPTConfig, generate, gpt_forward, init_gpt
from numpytfmr.gradcheck import check_gradients, rel_error
from numpytfmr.lora import lora_linear_forward, lora_parameter_count
from numpytfmr.norms import layernorm_forward
from numpytfmr.optim import adam_init, adam_step
from numpytfmr.posttrain import (
    LORA_TARGETS,
    add_lora,
    complete_prompts,
    completion_kl,
    completion_logprobs_backward,
    completion_logprobs_forward,
    dpo_loss_and_grads,
    gpt_lora_backward,
    gpt_lora_forward,
    gpt_lora_loss,
    init_reward_model,
    lora_parameter_counts,
    lora_target_keys,
    lora_trainable_fraction,
    merge_lora,
    preference_pairs_from_samples,
    reward_head_backward,
    reward_head_forward,
    reward_model_backward,
    reward_model_forward,
    reward_model_loss,
    unmerge_lora,
)
from numpytfmr.preference import sequence_logprobs_forward

TINY = dict(vocab_size=13, n_layers=2, d_model=12, n_heads=3, d_ff=20, max_len=16)
CONFIGS = [
    dict(positional="learned", norm="pre", activation="gelu"),
    dict(positional="rope", norm="post", n_kv_heads=1, tie_embeddings=False, bias=False,
         norm_type="rmsnorm", activation="gelu_tanh"),
    dict(positional="sinusoidal", norm="pre", n_kv_heads=3, activation="gelu_tanh"),
]
ALL_TARGETS = tuple(LORA_TARGETS)


def _model(options=None, seed=0, dtype=np.float64):
    c = GPTConfig(**TINY, **(options or {}))
    rng = np.random.default_rng(seed)
    return c, init_gpt(c, rng=rng, dtype=dtype), rng


def _trained_adapters(adapters, rng, scale=0.3):
    """Adapters as after some training: B non-zero, so every gradient path is live."""
    return {k: (a if k.endswith(".A") else scale * rng.standard_normal(a.shape).astype(a.dtype))
            for k, a in adapters.items()}


# ---------------------------------------------------------------------------------------
# LoRA in the model
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: "-".join(map(str, o.values())))
def test_adapter_gradients_match_finite_differences_through_the_whole_gpt(options):
    """Directional derivatives of sum(logits * dout) w.r.t. every A and B (B non-zero),
    <= 1e-6 relative in float64; the base gets no gradient."""
    c, p, rng = _model(options)
    adapters = _trained_adapters(add_lora(p, c, r=2, rng=rng, targets=ALL_TARGETS), rng)
    ids = rng.integers(0, c.vocab_size, (2, 6))
    keys = sorted(adapters)

    def fwd(*arrays):
        return gpt_lora_forward(p, dict(zip(keys, arrays)), ids, config=c, alpha=3.0)

    def bwd(dlogits, cache):
        grads = gpt_lora_backward(dlogits, cache)
        assert set(grads) == set(adapters)            # only the adapters are trainable
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [adapters[k] for k in keys], mode="directional",
                          n_directions=2, n_coordinates=1, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


def test_adapter_gradient_is_the_chain_rule_through_the_effective_weight():
    """dA = s dW' B^T and dB = s A^T dW', with dW' the plain GPT's gradient at W'."""
    from numpytfmr.gpt import gpt_backward
    c, p, rng = _model()
    adapters = _trained_adapters(add_lora(p, c, r=3, rng=rng), rng)
    ids = rng.integers(0, c.vocab_size, (2, 5))
    logits, cache = gpt_lora_forward(p, adapters, ids, config=c, alpha=6.0)
    dlogits = rng.standard_normal(logits.shape)
    grads = gpt_lora_backward(dlogits, cache)
    merged = merge_lora(p, adapters, alpha=6.0)
    _, mcache = gpt_forward(merged, ids, config=c)
    dW = gpt_backward(dlogits, mcache)
    s = 6.0 / 3
    for key in lora_target_keys(c):
        A, B = adapters[key + ".A"], adapters[key + ".B"]
        assert rel_error(grads[key + ".A"], s * dW[key] @ B.T) < 1e-12
        assert rel_error(grads[key + ".B"], s * A.T @ dW[key]) < 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adapted_model_equals_its_base_bitwise_at_initialisation(dtype):
    c, p, rng = _model(CONFIGS[1], dtype=dtype)
    adapters = add_lora(p, c, r=4, rng=rng, targets=ALL_TARGETS)
    assert all(a.dtype == dtype for a in adapters.values())
    assert all(not np.any(a) for k, a in adapters.items() if k.endswith(".B"))
    ids = rng.integers(0, c.vocab_size, (3, 7))
    base, _ = gpt_forward(p, ids, config=c)
    adapted, _ = gpt_lora_forward(p, adapters, ids, config=c, alpha=16.0)
    assert adapted.dtype == dtype
    assert adapted.tobytes() == base.tobytes()
    merged = merge_lora(p, adapters, alpha=16.0)
    assert all(merged[k].tobytes() == p[k].tobytes() for k in p)
    prompt = ids[:, :3]
    assert np.array_equal(generate(merged, prompt, config=c, max_new_tokens=5, top_k=1),
                          generate(p, prompt, config=c, max_new_tokens=5, top_k=1))


def test_merged_and_unmerged_agree_and_unmerge_restores_the_base():
    c, p, rng = _model(CONFIGS[0])
    adapters = _trained_adapters(add_lora(p, c, r=3, rng=rng, targets=("Wq", "Wv", "W2")), rng)
    ids = rng.integers(0, c.vocab_size, (2, 8))
    unmerged, cache = gpt_lora_forward(p, adapters, ids, config=c, alpha=5.0)
    merged_params = merge_lora(p, adapters, alpha=5.0)
    merged, _ = gpt_forward(merged_params, ids, config=c)
    assert np.max(np.abs(unmerged - merged)) <= 1e-12
    assert not np.allclose(merged, gpt_forward(p, ids, config=c)[0])    # the update is real
    restored = unmerge_lora(merged_params, adapters, alpha=5.0)
    assert set(restored) == set(p)
    assert max(np.max(np.abs(restored[k] - p[k])) for k in p) <= 1e-12
    # the notes' two-path form h W + s (h A) B of the query projection, from the attention's
    # input in block 0: h = N1(E[ids] + P) (pre-norm, learned positions)
    x0 = p["wte"][ids] + p["wpe"][:ids.shape[1]]
    h, _ = layernorm_forward(x0, p["h0.attn_norm.gamma"], p["h0.attn_norm.beta"], eps=c.norm_eps)
    assert np.max(np.abs(h - cache["gpt"]["h0"]["attn_norm"]["xhat"] * p["h0.attn_norm.gamma"]
                         - p["h0.attn_norm.beta"])) <= 1e-12           # the block read this h
    Q_lora, _ = lora_linear_forward(h, p["h0.attn.Wq"], adapters["h0.attn.Wq.A"],
                                    adapters["h0.attn.Wq.B"], p["h0.attn.bq"], alpha=5.0)
    Q_merged = h @ merged_params["h0.attn.Wq"] + p["h0.attn.bq"]
    assert np.max(np.abs(Q_lora - Q_merged)) <= 1e-12
    # merging leaves the inputs alone
    assert not any(np.shares_memory(merged_params[k], p[k]) for k in lora_target_keys(c, ("Wq",)))


def test_parameter_counts_follow_the_notes_formula():
    """Each adapted d x k weight trains d r + r k parameters instead of d k (000 §2.7.2)."""
    c, p, rng = _model(dict(n_kv_heads=1))
    r = 2
    adapters = add_lora(p, c, r=r, rng=rng, targets=("Wq", "Wk", "W1"))
    counts = lora_parameter_counts(p, adapters)
    keys = lora_target_keys(c, ("Wq", "Wk", "W1"))
    expected = sum(lora_parameter_count(*p[k].shape, r)["lora"] for k in keys)
    d, hd, kvd, ff = c.d_model, c.n_heads * c.d_head, c.d_head, c.d_ff
    assert expected == c.n_layers * ((d * r + r * hd) + (d * r + r * kvd) + (d * r + r * ff))
    assert counts["lora"] == expected == sum(a.size for a in adapters.values())
    assert counts["adapted"] == c.n_layers * (d * hd + d * kvd + d * ff)
    assert counts["base"] == sum(a.size for a in p.values())
    assert lora_trainable_fraction(p, adapters) == counts["fraction"] == expected / counts["base"]
    assert lora_target_keys(c, ("Wv", "Wo")) == ["h0.attn.Wv", "h0.attn.Wo", "h1.attn.Wv",
                                                 "h1.attn.Wo"]


def test_training_updates_adapters_only_and_leaves_the_base_bitwise_unchanged():
    c, p, rng = _model(dtype=np.float32)
    before = {k: a.copy() for k, a in p.items()}
    adapters = add_lora(p, c, r=2, rng=rng, targets=("Wv", "Wo", "W2"))
    ids = rng.integers(4, c.vocab_size, (4, 8))
    state = adam_init(adapters)
    losses = []
    for _ in range(30):
        # fit a fixed batch of next tokens: possible through the adapters alone
        loss, grads = gpt_lora_loss(p, adapters, ids[:, :-1], ids[:, 1:], config=c, alpha=4.0)
        assert set(grads) == set(adapters)
        assert all(g.dtype == np.float32 for g in grads.values())
        adapters, state = adam_step(adapters, grads, state, lr=5e-2)
        losses.append(loss)
    assert losses[-1] < losses[0] - 0.03      # (small: the random base has near-uniform logits)
    assert all(p[k].tobytes() == before[k].tobytes() for k in p)
    assert any(np.any(a) for k, a in adapters.items() if k.endswith(".B"))


def test_loss_mask_and_ignore_index_agree():
    c, p, rng = _model()
    adapters = _trained_adapters(add_lora(p, c, r=2, rng=rng), rng)
    ids = rng.integers(0, c.vocab_size, (2, 6))
    mask = rng.random((2, 5)) < 0.6
    mask[:, 0] = True
    a, ga = gpt_lora_loss(p, adapters, ids[:, :-1], ids[:, 1:], config=c, alpha=2.0, loss_mask=mask)
    b, gb = gpt_lora_loss(p, adapters, ids[:, :-1], np.where(mask, ids[:, 1:], -1), config=c,
                          alpha=2.0, ignore_index=-1)
    assert a == b and all(np.array_equal(ga[k], gb[k]) for k in ga)


def test_rank_stabilised_scaling():
    c, p, rng = _model()
    adapters = _trained_adapters(add_lora(p, c, r=4, rng=rng), rng)
    ids = rng.integers(0, c.vocab_size, (1, 4))
    a, _ = gpt_lora_forward(p, adapters, ids, config=c, alpha=2.0, rank_stabilized=True)
    b, _ = gpt_lora_forward(p, adapters, ids, config=c, alpha=4.0)   # 2/sqrt(4) == 4/4
    assert np.max(np.abs(a - b)) <= 1e-12


def test_bad_lora_inputs():
    c, p, rng = _model()
    with pytest.raises(ValueError, match="add_lora: r is 99"):
        add_lora(p, c, r=99, rng=rng)
    with pytest.raises(ValueError, match="lora_target_keys: targets is 'Wx'"):
        add_lora(p, c, r=2, rng=rng, targets=("Wx",))
    with pytest.raises(TypeError, match="add_lora: rng"):
        add_lora(p, c, r=2, rng=0)
    adapters = add_lora(p, c, r=2, rng=rng)
    with pytest.raises(ValueError, match="merge_lora: adapters has 'h0.attn.Wq.A' but no"):
        merge_lora(p, {k: a for k, a in adapters.items() if k != "h0.attn.Wq.B"}, alpha=1.0)
    with pytest.raises(ValueError, match="gpt_lora_forward: adapters for 'h0.attn.Wq'"):
        bad = dict(adapters, **{"h0.attn.Wq.B": np.zeros((3, 12))})
        gpt_lora_forward(p, bad, np.zeros((1, 2), dtype=int), config=c, alpha=1.0)
    with pytest.raises(TypeError, match="dtypes"):
        merge_lora(p, {k: a.astype(np.float32) for k, a in adapters.items()}, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        merge_lora(p, adapters, alpha=0.0)


# ---------------------------------------------------------------------------------------
# Reward head and reward model (003 §9.1.2)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_reward_head_matches_finite_differences(pooling, lead):
    rng = np.random.default_rng(1)
    h = rng.standard_normal(lead + (5, 7))
    w = rng.standard_normal(7)
    b = rng.standard_normal(())
    mask = rng.random(lead + (5,)) < 0.6
    mask[..., 0] = True
    fwd = lambda h, w, b: reward_head_forward(h, w, b, mask=mask, pooling=pooling)   # noqa: E731
    res = check_gradients(fwd, reward_head_backward, [h, w, b])
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-7, str(res)


def test_reward_head_pools_the_last_token_or_the_mean():
    rng = np.random.default_rng(2)
    h = rng.standard_normal((2, 4, 3))
    w, b = rng.standard_normal(3), np.array([0.5])
    mask = np.array([[True, True, False, False], [True, True, True, True]])
    r_last, _ = reward_head_forward(h, w, b, mask=mask, pooling="last")
    assert np.allclose(r_last, [h[0, 1] @ w + 0.5, h[1, 3] @ w + 0.5], rtol=1e-14)
    r_mean, _ = reward_head_forward(h, w, None, mask=mask, pooling="mean")
    assert np.allclose(r_mean, [h[0, :2].mean(0) @ w, h[1].mean(0) @ w], rtol=1e-14)
    r32, _ = reward_head_forward(h.astype(np.float32), w.astype(np.float32), b.astype(np.float32))
    assert r32.dtype == np.float32 and r32.shape == (2,)
    _, cache32 = reward_head_forward(h.astype(np.float32), w.astype(np.float32),
                                     b.astype(np.float32))
    dh, dw, db = reward_head_backward(np.ones(2, np.float32), cache32)
    assert dh.dtype == dw.dtype == db.dtype == np.float32 and db.shape == (1,)
    with pytest.raises(ValueError, match="reward_head_forward: mask has a row with no True"):
        reward_head_forward(h, w, b, mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="reward_head_forward: w_r has shape"):
        reward_head_forward(h, np.ones(4), b)
    with pytest.raises(ValueError, match="pooling"):
        reward_head_forward(h, w, b, pooling="max")


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_reward_model_gradients_match_finite_differences(pooling):
    c, _, rng = _model(dict(tie_embeddings=False))
    p = init_reward_model(c, rng=rng, dtype=np.float64)
    ids = rng.integers(1, c.vocab_size, (3, 6))
    ids[0, 4:] = PAD_ID
    keys = sorted(p)

    def fwd(*arrays):
        return reward_model_forward(dict(zip(keys, arrays)), ids, config=c, pooling=pooling)

    def bwd(dr, cache):
        grads = reward_model_backward(dr, cache)
        assert set(grads) == set(p)
        assert not np.any(grads["lm_head.W"])            # the vocabulary head is unused
        return tuple(grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [p[k] for k in keys], mode="directional", n_directions=2,
                          n_coordinates=1, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)
    # padding never changes the reward ("last" reads the last real token)
    other = ids.copy()
    other[0, 4:] = 7
    r1, _ = reward_model_forward(p, ids, config=c, pooling=pooling)
    r2, _ = reward_model_forward(p, other, config=c, mask=ids != PAD_ID, pooling=pooling)
    assert r1[0] == r2[0]


def test_reward_model_learns_to_prefer_the_chosen_answers():
    """Bradley-Terry training on ascending-over-descending pairs: held-out accuracy ~1."""
    tok = CharTokenizer()
    c = GPTConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, max_len=9,
                  activation="relu")
    rng = np.random.default_rng(0)
    p = init_reward_model(c, rng=rng, dtype=np.float64)
    test = make_preference_pairs(100, rng=1, split="test", min_len=2, max_len=3)

    def held_out(params):
        return reward_model_loss(params, test["chosen_ids"], test["rejected_ids"], config=c)

    loss0, _, m0 = held_out(p)
    assert abs(loss0 - np.log(2)) < 0.05 and abs(m0["margin"]) < 0.1
    state = adam_init(p)
    for step in range(50):
        b = make_preference_pairs(32, rng=np.random.default_rng((5, step)), min_len=2, max_len=3)
        _, grads, _ = reward_model_loss(p, b["chosen_ids"], b["rejected_ids"], config=c)
        p, state = adam_step(p, grads, state, lr=1e-2)
    loss1, _, m1 = held_out(p)
    assert m1["accuracy"] >= 0.95 and m1["margin"] > 2.0 and loss1 < 0.2


# ---------------------------------------------------------------------------------------
# DPO with LoRA (003 §9.2)
# ---------------------------------------------------------------------------------------

def _pairs(n, seed, split="train"):
    return make_preference_pairs(n, rng=seed, split=split, min_len=2, max_len=3)


def _dpo_model(seed=0):
    tok = CharTokenizer()
    c = GPTConfig(vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2, max_len=9)
    rng = np.random.default_rng(seed)
    return c, init_gpt(c, rng=rng, dtype=np.float64), rng


def test_completion_logprobs_are_the_completion_tokens_log_probabilities():
    c, p, rng = _dpo_model()
    d = _pairs(4, 3)
    ids, mask = d["chosen_ids"], d["chosen_mask"]
    logp, cache = completion_logprobs_forward(p, None, ids, mask, config=c)
    logits, _ = gpt_forward(p, ids[:, :-1], config=c)
    expected, _ = sequence_logprobs_forward(logits, ids[:, 1:], mask[:, 1:])
    assert np.array_equal(logp, expected)
    # by hand for row 0: sum over the answer tokens and <eos>
    ls = logits[0] - np.log(np.sum(np.exp(logits[0]), -1, keepdims=True))
    by_hand = sum(ls[t - 1, ids[0, t]] for t in np.flatnonzero(mask[0]))
    assert abs(logp[0] - by_hand) < 1e-12
    with pytest.raises(ValueError, match="no trainable parameters"):
        completion_logprobs_backward(np.ones(4), cache)


@pytest.mark.parametrize("nll_weight", [0.0, 0.7])
def test_dpo_adapter_gradients_match_finite_differences(nll_weight):
    c, p, rng = _dpo_model()
    adapters = _trained_adapters(add_lora(p, c, r=2, rng=rng, targets=("Wq", "Wv", "W1")), rng)
    batch = _pairs(3, 4)
    keys = sorted(adapters)

    def fwd(*arrays):
        loss, grads, _ = dpo_loss_and_grads(p, dict(zip(keys, arrays)), batch, config=c,
                                            alpha=2.0, beta=0.5, nll_weight=nll_weight)
        return np.asarray(loss), grads

    def bwd(dout, grads):
        return tuple(float(dout) * grads[k] for k in keys)

    res = check_gradients(fwd, bwd, [adapters[k] for k in keys], mode="directional",
                          n_directions=2, n_coordinates=1, names=keys)
    assert res.passed, str(res)
    assert max(res.errors.values()) <= 1e-6, str(res)


def test_dpo_starts_at_log_2_and_given_reference_logprobs_change_nothing():
    c, p, rng = _dpo_model()
    adapters = add_lora(p, c, r=2, rng=rng)
    batch = _pairs(5, 6)
    loss, grads, m = dpo_loss_and_grads(p, adapters, batch, config=c, alpha=2.0)
    assert abs(loss - np.log(2)) < 1e-12 and m["rewards/margins"] == 0.0   # policy == reference
    rc, _ = completion_logprobs_forward(p, None, batch["chosen_ids"], batch["chosen_mask"],
                                        config=c)
    rr, _ = completion_logprobs_forward(p, None, batch["rejected_ids"], batch["rejected_mask"],
                                        config=c)
    loss2, grads2, _ = dpo_loss_and_grads(p, adapters, batch, config=c, alpha=2.0, ref_chosen=rc,
                                          ref_rejected=rr)
    assert loss2 == loss and all(np.array_equal(grads[k], grads2[k]) for k in grads)


def test_dpo_training_moves_the_policy_towards_the_chosen_answers():
    """A few DPO steps on ascending-over-descending pairs: held-out implicit rewards order
    the pairs correctly, the policy prefers ascending answers where the reference was a
    coin flip, the base is bitwise unchanged and the KL from it grows from exactly 0."""
    c, p, rng = _dpo_model(1)
    before = {k: a.copy() for k, a in p.items()}
    adapters = add_lora(p, c, r=4, rng=rng, targets=("Wq", "Wv", "W1", "W2"))
    test = _pairs(60, 9, split="test")
    seqs, mask = complete_prompts(p, test["chosen_ids"], test["prompt_lengths"], config=c,
                                  max_new_tokens=4)
    assert completion_kl(p, adapters, seqs, mask, config=c, alpha=8.0)["kl_per_token"] == 0.0

    def prefers(params, ads):
        pc, _ = completion_logprobs_forward(params, ads, test["chosen_ids"], test["chosen_mask"],
                                            config=c, alpha=8.0)
        pr, _ = completion_logprobs_forward(params, ads, test["rejected_ids"],
                                            test["rejected_mask"], config=c, alpha=8.0)
        return pc, pr

    rc, rr = prefers(p, None)
    state = adam_init(adapters)
    for step in range(60):
        batch = _pairs(32, np.random.default_rng((7, step)))
        _, grads, _ = dpo_loss_and_grads(p, adapters, batch, config=c, alpha=8.0, beta=0.5)
        adapters, state = adam_step(adapters, grads, state, lr=1e-2)
    pc, pr = prefers(p, adapters)
    margin = 0.5 * ((pc - rc) - (pr - rr))          # held-out implicit reward margins
    # (small margins: a random base's tiny tied embeddings give near-uniform logits)
    assert np.mean(margin > 0) >= 0.9 and np.mean(margin) > 0.2
    assert np.mean(pc > pr) >= 0.85 and np.mean(rc > rr) < 0.6
    assert all(p[k].tobytes() == before[k].tobytes() for k in p)
    seqs, mask = complete_prompts(merge_lora(p, adapters, alpha=8.0), test["chosen_ids"],
                                  test["prompt_lengths"], config=c, max_new_tokens=4)
    kl = completion_kl(p, adapters, seqs, mask, config=c, alpha=8.0)
    assert kl["kl_per_token"] > 0.0 and kl["kl_per_sequence"] >= kl["kl_per_token"]


def test_completion_kl_is_the_exact_kl_of_the_next_token_distributions():
    c, p, rng = _dpo_model(2)
    adapters = _trained_adapters(add_lora(p, c, r=2, rng=rng), rng, scale=1.0)
    d = _pairs(3, 11)
    seqs, mask = d["chosen_ids"], d["chosen_mask"]
    kl = completion_kl(p, adapters, seqs, mask, config=c, alpha=4.0)
    lp, _ = gpt_forward(merge_lora(p, adapters, alpha=4.0), seqs[:, :-1], config=c)
    lq, _ = gpt_forward(p, seqs[:, :-1], config=c)
    total, n, per_seq = 0.0, 0, []
    for i in range(3):
        s = 0.0
        for t in np.flatnonzero(mask[i, 1:]):
            P = np.exp(lp[i, t] - lp[i, t].max()); P /= P.sum()
            Q = np.exp(lq[i, t] - lq[i, t].max()); Q /= Q.sum()
            s += float(np.sum(P * np.log(P / Q)))
            n += 1
        total += s
        per_seq.append(s)
    assert abs(kl["kl_per_token"] - total / n) < 1e-12
    assert abs(kl["kl_per_sequence"] - np.mean(per_seq)) < 1e-12


def test_complete_prompts_and_pairs_from_samples():
    c, p, rng = _dpo_model(3)
    data = make_task("sort", 6, rng=0, min_len=1, max_len=3)
    seqs, mask = complete_prompts(p, data["ids"], data["prompt_lengths"], config=c,
                                  max_new_tokens=4)
    for i, L in enumerate(data["prompt_lengths"]):
        assert np.array_equal(seqs[i, :L], data["ids"][i, :L])
        m = np.flatnonzero(mask[i])
        assert m[0] == L and np.array_equal(m, np.arange(L, m[-1] + 1))       # contiguous
        eos = np.flatnonzero(seqs[i, L:] == EOS_ID)
        assert eos.size == 0 or m[-1] == L + eos[0]                          # stops at <eos>
        assert np.all(seqs[i, m[-1] + 1:] == PAD_ID)
    sampled, _ = complete_prompts(p, data["ids"], data["prompt_lengths"], config=c,
                                  max_new_tokens=4, temperature=1.0, rng=np.random.default_rng(0))
    assert sampled.shape == seqs.shape
    index = np.array([0, 0, 1, 1, 2, 2])
    preferred = np.array([False, True, True, True, True, False])
    pairs = preference_pairs_from_samples(seqs, mask, index, preferred)
    assert np.array_equal(pairs["prompt_index"], [0, 2])                    # prompt 1: all agree
    assert np.array_equal(pairs["chosen_ids"], seqs[[1, 4]])
    assert np.array_equal(pairs["rejected_ids"], seqs[[0, 5]])
    assert np.array_equal(pairs["rejected_mask"], mask[[0, 5]])
