"""Tests of numpytfmr.optim: closed forms, convergence, clipping, schedule, PyTorch agreement."""
import math

import numpy as np
import pytest

from numpytfmr.optim import (adam_init, adam_step, adamw_init, adamw_step, clip_grad_norm,
                             decay_exempt_keys, global_norm, lr_schedule, sgd_init, sgd_step,
                             state_step)


def _params(rng, dtype=np.float64):
    return {"W": rng.standard_normal((3, 5)).astype(dtype),
            "b": rng.standard_normal(5).astype(dtype),
            "blocks.0.gamma": (1.0 + 0.1 * rng.standard_normal(7)).astype(dtype)}


def _grads_like(params, rng):
    return {k: rng.standard_normal(p.shape).astype(p.dtype) for k, p in params.items()}


def _copy(d):
    return {k: np.array(v, copy=True) for k, v in d.items()}


def _assert_dict_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---------------------------------------------------------------------------
# closed forms
# ---------------------------------------------------------------------------

def test_sgd_hand_step():
    params = {"w": np.array([1.0, 2.0])}
    grads = {"w": np.array([0.5, -1.0])}
    new, state = sgd_step(params, grads, sgd_init(params), lr=0.1)
    np.testing.assert_allclose(new["w"], [0.95, 2.1], rtol=0, atol=1e-15)
    assert state_step(state) == 1


def test_sgd_weight_decay_hand_step():
    params = {"w": np.array([2.0]), "b": np.array([2.0])}
    grads = {"w": np.array([1.0]), "b": np.array([1.0])}
    new, _ = sgd_step(params, grads, sgd_init(params), lr=0.1, weight_decay=0.5, no_decay={"b"})
    # w: 2 - 0.1 * (1 + 0.5 * 2) = 1.8 ; b is exempt: 2 - 0.1 * 1 = 1.9
    np.testing.assert_allclose(new["w"], [1.8], atol=1e-15)
    np.testing.assert_allclose(new["b"], [1.9], atol=1e-15)


def test_sgd_momentum_accumulates_geometric_series():
    mu, lr, g = 0.9, 0.1, 2.0
    params = {"w": np.array([0.0])}
    state = sgd_init(params)
    for t in range(1, 5):
        params, state = sgd_step(params, {"w": np.array([g])}, state, lr=lr, momentum=mu)
        # buffer b_t = g (1 + mu + ... + mu^{t-1}) = g (1 - mu^t) / (1 - mu)
        np.testing.assert_allclose(state["momentum/w"], [g * (1 - mu ** t) / (1 - mu)], rtol=1e-14)
    # displacement = lr * sum_t b_t
    expected = -lr * sum(g * (1 - mu ** t) / (1 - mu) for t in range(1, 5))
    np.testing.assert_allclose(params["w"], [expected], rtol=1e-14)


def test_sgd_nesterov_first_step_looks_ahead():
    mu, lr = 0.9, 0.1
    params = {"w": np.array([1.0, -1.0])}
    grads = {"w": np.array([1.0, 3.0])}
    new, _ = sgd_step(params, grads, sgd_init(params), lr=lr, momentum=mu, nesterov=True)
    # b_1 = g ; update direction g + mu b_1 = (1 + mu) g
    np.testing.assert_allclose(new["w"], params["w"] - lr * (1 + mu) * grads["w"], rtol=1e-15)


def test_adam_first_step_moves_each_parameter_by_lr_times_sign():
    lr = 1e-2
    g = np.array([1e-3, -2e-2, 0.5, -7.0, 1e3])
    params = {"w": np.zeros_like(g)}
    new, _ = adam_step(params, {"w": g}, adam_init(params), lr=lr)
    # m_hat = g, v_hat = g^2 at t = 1, so the step is lr * g / (|g| + eps)
    np.testing.assert_allclose(new["w"], -lr * g / (np.abs(g) + 1e-8), rtol=1e-13)
    np.testing.assert_allclose(new["w"], -lr * np.sign(g), rtol=1e-4)


def test_adam_bias_correction_makes_constant_gradient_steps_equal():
    lr, beta1, beta2 = 1e-3, 0.9, 0.999
    g = np.array([0.3, -4.0])
    params = {"w": np.array([1.0, 1.0])}
    state = adam_init(params)
    for t in range(1, 6):
        params, state = adam_step(params, {"w": g}, state, lr=lr, beta1=beta1, beta2=beta2)
        # uncorrected moments are biased towards 0 by exactly (1 - beta^t)
        np.testing.assert_allclose(state["m/w"], (1 - beta1 ** t) * g, rtol=1e-13)
        np.testing.assert_allclose(state["v/w"], (1 - beta2 ** t) * g * g, rtol=1e-13)
    # corrected: m_hat = g, v_hat = g^2, so every one of the 5 steps is lr * g / (|g| + eps)
    np.testing.assert_allclose(params["w"], 1.0 - 5 * lr * g / (np.abs(g) + 1e-8), rtol=1e-13)
    assert state_step(state) == 5


def test_adamw_decay_is_decoupled_from_the_moments():
    lr, wd = 0.1, 0.5
    params = {"w": np.array([2.0, -3.0]), "b": np.array([4.0])}
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    new, state = adamw_step(params, zeros, adamw_init(params), lr=lr, weight_decay=wd,
                            no_decay=["b"])
    # zero gradient: m = v = 0 so only the decay theta <- theta (1 - lr wd) acts
    np.testing.assert_allclose(new["w"], params["w"] * (1 - lr * wd), rtol=1e-15)
    np.testing.assert_array_equal(new["b"], params["b"])
    np.testing.assert_array_equal(state["m/w"], 0.0)
    # Adam with L2 decay instead sends wd * theta through the moments: first step ~ lr * sign
    new_l2, state_l2 = adam_step(params, zeros, adam_init(params), lr=lr, weight_decay=wd)
    np.testing.assert_allclose(new_l2["w"], params["w"] - lr * np.sign(params["w"]), rtol=1e-7)
    np.testing.assert_allclose(state_l2["m/w"], 0.1 * wd * params["w"], rtol=1e-14)


def test_no_decay_predicate_and_decay_exempt_keys():
    rng = np.random.default_rng(0)
    params = _params(rng)
    assert decay_exempt_keys(params) == {"b", "blocks.0.gamma"}
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    new, _ = adamw_step(params, zeros, adamw_init(params), lr=0.1, weight_decay=0.1,
                        no_decay=lambda k: k.endswith("gamma"))
    np.testing.assert_array_equal(new["blocks.0.gamma"], params["blocks.0.gamma"])
    np.testing.assert_allclose(new["b"], params["b"] * 0.99, rtol=1e-15)


# ---------------------------------------------------------------------------
# a quadratic bowl is minimised by every optimizer
# ---------------------------------------------------------------------------

_A = np.array([1.0, 4.0, 10.0])  # diagonal Hessian, condition number 10
_C = np.array([1.5, -2.0, 0.5])


def _quadratic_grads(params):
    # f = 1/2 sum A (theta - c)^2 + 1/2 ||u - 1||^2 ;  grad = A (theta - c), u - 1
    return {"theta": _A * (params["theta"] - _C), "u": params["u"] - 1.0}


@pytest.mark.parametrize("name, kwargs, steps", [
    ("sgd", dict(lr=0.09), 200),
    ("sgd", dict(lr=0.02, momentum=0.9), 300),
    ("sgd", dict(lr=0.02, momentum=0.9, nesterov=True), 300),
    ("adam", dict(lr=0.1), 1000),
    ("adamw", dict(lr=0.1, weight_decay=0.0), 1000),
])
def test_quadratic_is_minimised(name, kwargs, steps):
    params = {"theta": np.zeros(3), "u": np.array([[5.0, -5.0]])}
    init, step_fn = {"sgd": (sgd_init, sgd_step), "adam": (adam_init, adam_step),
                     "adamw": (adamw_init, adamw_step)}[name]
    state = init(params)
    base_lr = kwargs.pop("lr")
    for t in range(steps):
        # Adam's step stays ~lr near the optimum (g / sqrt(v) does not shrink with g);
        # the cosine decay of lr to 0 lets it settle. SGD's step shrinks with g by itself.
        lr = (lr_schedule(t, base_lr=base_lr, warmup_steps=10, total_steps=steps)
              if name != "sgd" else base_lr)
        params, state = step_fn(params, _quadratic_grads(params), state, lr=lr, **kwargs)
    np.testing.assert_allclose(params["theta"], _C, atol=1e-4)
    np.testing.assert_allclose(params["u"], 1.0, atol=1e-4)


# ---------------------------------------------------------------------------
# gradient clipping
# ---------------------------------------------------------------------------

def test_clip_grad_norm_scales_to_max_norm():
    grads = {"a": np.array([3.0, 4.0]), "b": np.array([[12.0]])}   # global norm 13
    clipped, total = clip_grad_norm(grads, 1.0)
    assert total == pytest.approx(13.0, rel=1e-15)
    assert global_norm(clipped) == pytest.approx(1.0, rel=1e-6)     # max_norm * N / (N + 1e-6)
    np.testing.assert_allclose(clipped["a"], np.array([3.0, 4.0]) / (13.0 + 1e-6), rtol=1e-15)
    # direction unchanged
    np.testing.assert_allclose(clipped["b"] / clipped["a"][0], [[4.0]], rtol=1e-14)
    np.testing.assert_array_equal(grads["a"], [3.0, 4.0])             # input untouched


def test_clip_grad_norm_below_max_is_unchanged():
    rng = np.random.default_rng(1)
    grads = {"a": 0.01 * rng.standard_normal((4, 3)).astype(np.float32)}
    clipped, total = clip_grad_norm(grads, 5.0)
    assert total == pytest.approx(float(np.linalg.norm(grads["a"].astype(np.float64))), rel=1e-12)
    np.testing.assert_array_equal(clipped["a"], grads["a"])
    assert clipped["a"] is not grads["a"] and clipped["a"].dtype == np.float32


def test_clip_grad_norm_float32_and_errors():
    grads = {"a": np.full((2, 2), 1e30, dtype=np.float32)}  # squares overflow float32
    clipped, total = clip_grad_norm(grads, 2.0)
    assert total == pytest.approx(2e30, rel=1e-6) and clipped["a"].dtype == np.float32
    np.testing.assert_allclose(clipped["a"], 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match=r"clip_grad_norm: grads\['a'\] holds non-finite"):
        clip_grad_norm({"a": np.array([1.0, np.nan])}, 1.0)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm({"a": np.ones(2)}, 0.0)
    with pytest.raises(TypeError, match=r"grads\['a'\]"):
        clip_grad_norm({"a": np.ones(2, dtype=np.int64)}, 1.0)


# ---------------------------------------------------------------------------
# learning-rate schedule
# ---------------------------------------------------------------------------

def test_lr_schedule_values():
    kw = dict(base_lr=1e-3, warmup_steps=9, total_steps=109, min_lr=1e-4)
    assert lr_schedule(0, **kw) == pytest.approx(1e-4, rel=1e-14)          # base / (W + 1)
    assert lr_schedule(4, **kw) == pytest.approx(5e-4, rel=1e-14)
    assert lr_schedule(9, **kw) == pytest.approx(1e-3, rel=1e-14)          # peak at step W
    assert lr_schedule(59, **kw) == pytest.approx(5.5e-4, rel=1e-14)       # halfway: mean
    assert lr_schedule(34, **kw) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi / 4)) / 2,
                                                  rel=1e-14)
    assert lr_schedule(109, **kw) == pytest.approx(1e-4, rel=1e-14)        # end: min_lr
    assert lr_schedule(500, **kw) == 1e-4
    lrs = [lr_schedule(s, **kw) for s in range(110)]
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))                 # rises in warmup
    assert all(a > b for a, b in zip(lrs[9:109], lrs[10:110]))            # falls in decay
    assert lr_schedule(0, base_lr=0.1, warmup_steps=0, total_steps=10) == pytest.approx(0.1)


def test_lr_schedule_errors():
    with pytest.raises(ValueError, match="lr_schedule: total_steps is 5 but warmup_steps is 5"):
        lr_schedule(0, base_lr=0.1, warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match="lr_schedule: step is -1"):
        lr_schedule(-1, base_lr=0.1, warmup_steps=1, total_steps=5)
    with pytest.raises(TypeError, match="lr_schedule: step is 1.5"):
        lr_schedule(1.5, base_lr=0.1, warmup_steps=1, total_steps=5)
    with pytest.raises(ValueError, match="lr_schedule: min_lr is 0.2"):
        lr_schedule(0, base_lr=0.1, warmup_steps=1, total_steps=5, min_lr=0.2)
    with pytest.raises(ValueError, match="lr_schedule: base_lr is -0.1"):
        lr_schedule(0, base_lr=-0.1, warmup_steps=1, total_steps=5)


# ---------------------------------------------------------------------------
# purity, dtypes, saving the state, errors
# ---------------------------------------------------------------------------

_STEPPERS = [
    (sgd_init, sgd_step, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (adam_init, adam_step, dict(lr=0.01, weight_decay=0.01)),
    (adamw_init, adamw_step, dict(lr=0.01, weight_decay=0.1, no_decay={"b"})),
]


@pytest.mark.parametrize("init, step_fn, kw", _STEPPERS)
def test_inputs_not_mutated(init, step_fn, kw):
    rng = np.random.default_rng(2)
    params = _params(rng)
    state = init(params)
    params, state = step_fn(params, _grads_like(params, rng), state, **kw)  # non-zero buffers
    grads = _grads_like(params, rng)
    p0, g0, s0 = _copy(params), _copy(grads), _copy(state)
    new_params, new_state = step_fn(params, grads, state, **kw)
    _assert_dict_equal(params, p0)
    _assert_dict_equal(grads, g0)
    _assert_dict_equal(state, s0)
    assert all(new_params[k] is not params[k] for k in params)
    assert state_step(new_state) == state_step(state) + 1


@pytest.mark.parametrize("init, step_fn, kw", _STEPPERS)
def test_float32_preserved(init, step_fn, kw):
    rng = np.random.default_rng(3)
    params = _params(rng, np.float32)
    state = init(params)
    for t in range(3):
        lr = lr_schedule(t, base_lr=kw["lr"], warmup_steps=1, total_steps=3)
        grads, _ = clip_grad_norm(_grads_like(params, rng), 1.0)
        params, state = step_fn(params, grads, state, **{**kw, "lr": lr})
    assert all(p.dtype == np.float32 for p in params.values())
    assert all(v.dtype == np.float32 for k, v in state.items() if k != "step")
    assert state["step"].dtype == np.int64


@pytest.mark.parametrize("init, step_fn, kw", _STEPPERS)
def test_state_round_trips_through_npz(init, step_fn, kw, tmp_path):
    rng = np.random.default_rng(4)
    params = _params(rng)
    grads = [_grads_like(params, rng) for _ in range(5)]
    straight_p, straight_s = params, init(params)
    for g in grads:
        straight_p, straight_s = step_fn(straight_p, g, straight_s, **kw)
    p, s = params, init(params)
    for g in grads[:3]:
        p, s = step_fn(p, g, s, **kw)
    np.savez(tmp_path / "opt.npz", **s)
    with np.load(tmp_path / "opt.npz") as f:
        s = dict(f)
    for g in grads[3:]:
        p, s = step_fn(p, g, s, **kw)
    _assert_dict_equal(p, straight_p)
    _assert_dict_equal(s, straight_s)


def test_errors_name_the_argument():
    params = {"W": np.ones((2, 3)), "b": np.zeros(3)}
    grads = {"W": np.ones((2, 3)), "b": np.zeros(3)}
    state = adam_init(params)
    with pytest.raises(ValueError, match=r"adam_step: lr is -0.1; expected a value in \[0.0"):
        adam_step(params, grads, state, lr=-0.1)
    with pytest.raises(ValueError, match=r"sgd_step: grads keys do not match params keys "
                                         r"\(missing \['b'\]; unexpected \['c'\]\)"):
        sgd_step(params, {"W": grads["W"], "c": grads["b"]}, sgd_init(params), lr=0.1)
    with pytest.raises(ValueError, match=r"adamw_step: grads\['W'\] has shape \(3, 2\) but "
                                         r"params\['W'\] has shape \(2, 3\)"):
        adamw_step(params, {"W": np.ones((3, 2)), "b": grads["b"]}, state, lr=0.1)
    with pytest.raises(TypeError, match=r"adam_step: grads\['b'\] has dtype float32 but "
                                        r"params\['b'\] has dtype float64"):
        adam_step(params, {"W": grads["W"], "b": grads["b"].astype(np.float32)}, state, lr=0.1)
    with pytest.raises(ValueError, match=r"adam_step: state has no 'm/W' entry"):
        adam_step(params, grads, sgd_init(params), lr=0.1)
    with pytest.raises(ValueError, match="sgd_step: nesterov=True needs momentum > 0"):
        sgd_step(params, grads, sgd_init(params), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"adam_step: beta2 is 1.0"):
        adam_step(params, grads, state, lr=0.1, beta2=1.0)
    with pytest.raises(ValueError, match=r"adamw_step: no_decay names \['gamma'\]"):
        adamw_step(params, grads, state, lr=0.1, no_decay={"gamma"})
    with pytest.raises(TypeError, match=r"sgd_init: params\['W'\] has dtype int64"):
        sgd_init({"W": np.ones(2, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"state_step: state\['step'\] is"):
        adam_step(params, grads, {**state, "step": np.array(-1)}, lr=0.1)


# ---------------------------------------------------------------------------
# agreement with torch.optim (float64)
# ---------------------------------------------------------------------------

def _run_ours(init, step_fn, params, grad_seq, kw):
    state = init(params)
    for g in grad_seq:
        params, state = step_fn(params, g, state, **kw)
    return params


def _run_torch(torch, make_opt, params, grad_seq, no_decay=(), weight_decay=0.0):
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    groups = [{"params": [tp[k] for k in params if k not in no_decay], "weight_decay": weight_decay},
              {"params": [tp[k] for k in params if k in no_decay], "weight_decay": 0.0}]
    opt = make_opt([g for g in groups if g["params"]])
    for g in grad_seq:
        for k in tp:
            tp[k].grad = torch.tensor(g[k])
        opt.step()
    return {k: v.detach().numpy() for k, v in tp.items()}


def _compare(ours, theirs):
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-12, atol=1e-14, err_msg=k)


@pytest.mark.torch
@pytest.mark.parametrize("kw", [
    dict(lr=0.05),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.05, momentum=0.9, weight_decay=0.1, no_decay={"b"}),
])
def test_sgd_matches_torch(kw):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    params = _params(rng)
    grad_seq = [_grads_like(params, rng) for _ in range(6)]
    ours = _run_ours(sgd_init, sgd_step, params, grad_seq, kw)
    tkw = {k: v for k, v in kw.items() if k not in ("weight_decay", "no_decay")}
    theirs = _run_torch(torch, lambda groups: torch.optim.SGD(groups, **tkw), params, grad_seq,
                        no_decay=kw.get("no_decay", ()), weight_decay=kw.get("weight_decay", 0.0))
    _compare(ours, theirs)


@pytest.mark.torch
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("kw", [
    dict(lr=0.01),
    dict(lr=0.02, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1),
    dict(lr=0.02, weight_decay=0.3, no_decay={"b", "blocks.0.gamma"}),
])
def test_adam_and_adamw_match_torch(kw, decoupled):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    params = _params(rng)
    grad_seq = [_grads_like(params, rng) for _ in range(7)]
    init, step_fn, cls = ((adamw_init, adamw_step, torch.optim.AdamW) if decoupled
                          else (adam_init, adam_step, torch.optim.Adam))
    kw = {"weight_decay": 0.0, **kw}
    ours = _run_ours(init, step_fn, params, grad_seq, kw)
    tkw = dict(lr=kw["lr"], betas=(kw.get("beta1", 0.9), kw.get("beta2", 0.999)),
               eps=kw.get("eps", 1e-8))
    theirs = _run_torch(torch, lambda groups: cls(groups, **tkw), params, grad_seq,
                        no_decay=kw.get("no_decay", ()), weight_decay=kw["weight_decay"])
    _compare(ours, theirs)


@pytest.mark.torch
def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    grads = {"a": 3 * rng.standard_normal((4, 5)), "b": rng.standard_normal(6)}
    for max_norm in (0.5, 100.0):
        ours, total = clip_grad_norm(grads, max_norm)
        ts = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads.values()]
        for t, g in zip(ts, grads.values()):
            t.grad = torch.tensor(g)
        t_total = torch.nn.utils.clip_grad_norm_(ts, max_norm)
        assert total == pytest.approx(float(t_total), rel=1e-13)
        for t, k in zip(ts, grads):
            np.testing.assert_allclose(ours[k], t.grad.numpy(), rtol=1e-13, atol=0)
