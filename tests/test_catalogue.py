"""The catalogue of known wrong backwards (numpytfmr/checking/catalogue.py and the
``mistakes`` of every registration in numpytfmr/registry/).

Every declared variant must be named by the checker when a backward returns it (alone and
times a wrong factor), on a case of its op where it differs from the right gradient; no
correct backward may match any variant; and a variant must be a real mistake (it differs
from the right gradient on some case of its op).
"""
import functools

import numpy as np
import pytest

from numpytfmr.checking.catalogue import catalogue_diagnoses
from numpytfmr.checking.evidence import Case as CheckCase
from numpytfmr.gradcheck import check_gradients
from numpytfmr.registry import Mistake, bind, registry
from numpytfmr.registry import input_names

VARIANTS = [(name, m) for name, spec in registry().items() for m in spec.mistakes]
_FAMILIES = ("attention", "mha", "layernorm", "rmsnorm", "gelu", "relu", "silu", "softmax",
             "log_softmax", "cross_entropy", "embedding", "dropout", "rope", "lora_linear",
             "dpo_loss", "bradley_terry_loss", "dot_scores", "scaled_dot_scores",
             "neg_sq_dist_scores", "bilinear_scores", "additive_scores", "additive_attention",
             "flash_attention", "sliding_window_attention", "linear_attention", "gru_cell",
             "sequence_logprobs", "reward_head", "linear", "ffn", "swiglu_ffn")


def _dout(out, seed):
    return np.random.default_rng([0x67726164, seed]).standard_normal(np.shape(out))


@functools.lru_cache(maxsize=None)
def _cases(name):
    spec = registry()[name]
    return [c for c in spec.make_cases(np.random.default_rng(0), np.float64) if c.check]


def _differs(spec, case, m, seed):
    """Whether the variant differs from the right gradient on this case (and applies):
    False, or "scaled" when it is the right gradient times a constant (a missing scale),
    else True."""
    names = input_names(spec.forward)
    p = names.index(m.of)
    if p >= len(case.args) or case.args[p] is None:
        return False
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    dout = _dout(out, seed)
    right = spec.backward(dout, cache)
    right = right[p] if isinstance(right, tuple) else right
    try:
        with np.errstate(all="ignore"):
            v = np.asarray(m.gradient(dout.copy(), cache), dtype=np.float64)
    except Exception:  # noqa: BLE001 -- the variant does not apply to this case
        return False
    if v.shape != np.shape(right) or not np.isfinite(v).all():
        return False
    right = np.asarray(right, dtype=np.float64)
    scale = max(float(np.max(np.abs(right))), 1e-12)
    if float(np.max(np.abs(v - right))) <= 1e-4 * scale:
        return False
    k = float(np.vdot(v, right)) / max(float(np.vdot(right, right)), 1e-300)
    return "scaled" if float(np.max(np.abs(v - k * right))) <= 1e-9 * scale else True


def _planted(spec, m, factor):
    """The reference backward with the gradient of ``m.of`` replaced by factor x the variant."""
    p = input_names(spec.forward).index(m.of)

    def backward(dout, cache):
        grads = spec.backward(dout, cache)
        single = not isinstance(grads, tuple)
        grads = [grads] if single else list(grads)
        grads[p] = factor * np.asarray(m.gradient(dout.copy(), cache), dtype=grads[p].dtype)
        return grads[0] if single else tuple(grads)
    return backward, p


def test_every_op_family_declares_its_catalogue():
    ops = registry()
    missing = [name for name in _FAMILIES if not ops[name].mistakes]
    assert not missing, f"ops without known wrong backwards: {missing}"
    for name, spec in ops.items():
        names = input_names(spec.forward)
        for m in spec.mistakes:
            assert isinstance(m, Mistake) and m.of in names, (name, m.name, m.of)
            assert len(m.text) > 30 and not m.text.endswith("."), (name, m.name)
    labels = {(name, m.name, m.of) for name, m in VARIANTS}
    assert len(labels) == len(VARIANTS), "a variant is declared twice"


@pytest.mark.parametrize("name, m", VARIANTS, ids=[f"{n}: {m.name} ({m.of})" for n, m in VARIANTS])
def test_every_variant_is_recognised_alone_and_with_a_factor(name, m):
    spec = registry()[name]
    seeds = [(case, i, kind) for i, case in enumerate(_cases(name))
             for kind in [_differs(spec, case, m, i)] if kind]
    assert seeds, f"{name}: {m.name!r} equals the right gradient on every case: not a mistake"
    case, i, kind = seeds[0]
    names = input_names(spec.forward)[:len(case.args)]
    # a variant that is the right gradient times a constant (a missing scale) is named alone;
    # times another factor it is just a wrong factor, which the factor diagnosis names
    for factor in (1.0,) if kind == "scaled" else (1.0, 3.0):
        backward, p = _planted(spec, m, factor)
        res = check_gradients(bind(spec.forward, case.kwargs), backward, case.args, seed=i,
                              mode=spec.mode, names=names)
        assert not res.passed, f"{name} [{case.label}]: {m.name!r} passed\n{res}"
        found = [s for s in res.diagnoses.get(p, []) if s.kind == "known_mistake"]
        assert any(s.mistake == m.name for s in found), f"{name} [{case.label}] x{factor}\n{res}"
        assert found[0].startswith(f"d{m.of} ") or found[0].startswith("the gradient of")
        if factor != 1.0:
            assert "3 x" in found[0] and "two mistakes" in found[0], found[0]


@pytest.mark.parametrize("name", sorted({n for n, _ in VARIANTS}))
def test_correct_backwards_match_no_variant(name):
    """The reference gradient itself, offered to the matcher on every case: never a match
    (a variant equal to it on a case tells nothing and is skipped)."""
    spec = registry()[name]
    names = input_names(spec.forward)
    for i, case in enumerate(_cases(name)):
        forward = bind(spec.forward, case.kwargs)
        out, cache = forward(*case.args)
        dout = _dout(out, i)
        grads = spec.backward(dout, cache)
        grads = grads if isinstance(grads, tuple) else (grads,)
        for p, g in enumerate(grads):
            if g is None:
                continue
            inputs = [np.array(a, dtype=np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f"
                      else a for a in case.args]
            check = CheckCase(forward, inputs, p, np.asarray(out, dtype=np.float64), dout,
                              names[:len(inputs)], None)
            flat = np.asarray(g, dtype=np.float64).reshape(-1)
            found = catalogue_diagnoses(check, flat, flat, lambda T: np.asarray(T).reshape(-1),
                                        np.ones(flat.size, dtype=bool), 1e-9)
            assert found == [], (name, case.label, names[p], found)


@pytest.mark.parametrize("name", ["softmax", "layernorm", "attention", "mha", "dpo_loss"])
def test_correct_registry_backwards_get_no_diagnosis(name):
    spec = registry()[name]
    names = input_names(spec.forward)
    for i, case in enumerate(_cases(name)):
        res = check_gradients(bind(spec.forward, case.kwargs), spec.backward, case.args, seed=i,
                              mode=spec.mode, names=names[:len(case.args)])
        assert res.passed and res.diagnoses == {}, f"{name} [{case.label}]\n{res}"


def test_the_user_guide_lists_the_whole_catalogue():
    """docs/gradcheck.md lists every op's known wrong backwards with their sentences."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "gradcheck.md").read_text()
    plain = re.sub(r"\\([*_\[\]])", r"\1", doc)            # markdown escapes removed
    for name, m in VARIANTS:
        section = plain.split(f"### {name}\n", 1)
        assert len(section) == 2, f"docs/gradcheck.md has no section for {name}"
        body = section[1].split("\n### ", 1)[0]
        assert f"**{m.name}**" in body and m.text in body, (name, m.name)
    count = re.search(r"The catalogue has (\d+) variants", doc)
    assert count and int(count.group(1)) == len(VARIANTS)


def test_known_mistakes_are_named_in_directional_mode_and_through_wrappers():
    import numpytfmr as nt

    x = np.random.default_rng(4).standard_normal((6, 40))

    def diagonal(dout, cache):
        y = cache["y"]
        return dout * y * (1 - y)
    res = check_gradients(nt.softmax_forward, diagonal, (x,), mode="directional", names=("x",))
    assert [s.mistake for s in res.diagnoses[0] if s.kind == "known_mistake"] == ["diagonal only"]

    def my_forward(x):                    # a wrapper with its own cache keys
        y, _ = nt.softmax_forward(x)
        return y, {"s": y}

    def my_backward(dout, cache):
        return 0.5 * dout * cache["s"] * (1 - cache["s"])
    res = check_gradients(my_forward, my_backward, (x[:2, :7],), names=("x",))
    text = " | ".join(res.diagnoses[0])
    assert 'dx = 0.5 x softmax\'s known wrong backward "diagonal only"' in text, text

    def own_softmax(x):                   # no reference op behind it: recognised by its output
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True), {"s": e / e.sum(-1, keepdims=True)}
    res = check_gradients(own_softmax, my_backward, (x[:2, :7],), names=("x",))
    text = " | ".join(res.diagnoses[0])
    assert ("your forward computes softmax (axis=-1); your dx = 0.5 x softmax's known wrong "
            'backward "diagonal only"') in text, text

    def own_cube(x):                      # no registered op computes it: no catalogue, no error
        return x ** 3, {"x": x}
    res = check_gradients(own_cube, lambda dout, c: dout * 2 * c["x"] ** 2, (x[:2, :7],),
                          names=("x",))
    assert not res.passed and all(s.kind != "known_mistake" for s in res.diagnoses[0])


def test_a_float32_gradient_is_still_recognised():
    """A backward computed in float32 (its dtype is reported too) still names the mistake."""
    import numpytfmr as nt

    x = np.random.default_rng(5).standard_normal((3, 7))

    def diagonal32(dout, cache):
        y = cache["y"].astype(np.float32)
        return dout.astype(np.float32) * y * (1 - y)
    res = check_gradients(nt.softmax_forward, diagonal32, (x,), names=("x",))
    kinds = {s.kind for s in res.diagnoses[0]}
    assert "dtype" in kinds and "known_mistake" in kinds, str(res)


# --- recognising the op a forward written independently computes (checking/recognise.py) ---

def _own_layernorm(eps=1e-6, add_beta=True):
    def forward(x, gamma, beta):
        mu = x.mean(-1, keepdims=True)
        sd = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        xn = (x - mu) / sd
        return gamma * xn + (beta if add_beta else 0.0), (xn, sd, gamma)
    return forward


def _unbiased_backward(dout, cache):
    xn, sd, gamma = cache
    d = xn.shape[-1]
    g = dout * gamma
    dx = (g - g.mean(-1, keepdims=True) - xn * (g * xn).sum(-1, keepdims=True) / (d - 1)) / sd
    rows = lambda t: t.reshape(-1, d)  # noqa: E731
    return dx, rows(dout * xn).sum(0), rows(dout).sum(0)


def test_recognise_names_the_op_and_the_options_the_output_tells_apart():
    from numpytfmr.checking.recognise import recognise
    from numpytfmr.attention import causal_mask

    rng = np.random.default_rng(7)
    x, g, b = rng.standard_normal((3, 7)), rng.standard_normal(7), rng.standard_normal(7)
    forward = _own_layernorm(1e-6)
    rec = recognise(forward, (x, g, b), forward(x, g, b)[0])
    assert rec.op == "layernorm" and rec.options == {"eps": 1e-6} and rec.exact
    assert rec.describe() == "layernorm (eps=1e-06)"

    k = np.sqrt(2 / np.pi)
    z = 2 * rng.standard_normal((3, 5))
    rec = recognise(None, (z,), 0.5 * z * (1 + np.tanh(k * (z + 0.044715 * z ** 3))))
    assert (rec.op, rec.options) == ("gelu", {"approximate": "tanh"})

    Q, K, V = rng.standard_normal((4, 16)), rng.standard_normal((4, 16)), rng.standard_normal((4, 3))
    S = np.where(causal_mask(4), Q @ K.T / 16, -np.inf)           # a scale of 1/d_k, causal
    A = np.exp(S - S.max(-1, keepdims=True))
    out = (A / A.sum(-1, keepdims=True)) @ V
    rec = recognise(None, (Q, K, V), out)
    assert rec.op == "attention" and rec.options["scale"] == 0.0625 and rec.solved == ("scale",)
    assert rec.describe() == "attention (mask=causal, scale=0.0625)"

    assert recognise(None, (x,), x ** 3) is None                  # nothing fits: nothing said
    assert recognise(None, (x,), np.zeros_like(x)) is None


def test_a_forward_close_to_an_op_is_said_so_first_and_the_backward_judged_against_it():
    rng = np.random.default_rng(8)
    inputs = (rng.standard_normal((2, 3, 7)), rng.standard_normal(7), rng.standard_normal(7))
    res = check_gradients(_own_layernorm(1e-5, add_beta=False), _unbiased_backward, inputs,
                          names=("x", "gamma", "beta"))
    first = res.diagnoses[0][0]
    assert first.kind == "forward_differs" and "with beta left out" in first, str(res)
    known = [s for s in res.diagnoses[0] if s.kind == "known_mistake"]
    assert known and known[0].mistake == "unbiased variance"
    assert known[0].startswith("against your own forward (close to layernorm (eps=1e-05))")

    x = rng.standard_normal((3, 6))

    def doubled_softmax(x):                   # 2 x softmax: a scale in the forward itself
        e = np.exp(x - x.max(-1, keepdims=True))
        s = e / e.sum(-1, keepdims=True)
        return 2 * s, s

    res = check_gradients(doubled_softmax, lambda dout, s: 2 * s * (1 - s) * dout, (x,), names=("x",))
    first, known = res.diagnoses[0][0], [s for s in res.diagnoses[0] if s.kind == "known_mistake"]
    assert first.kind == "forward_differs" and "2 x what softmax (axis=-1) computes" in first
    assert known and known[0].mistake == "diagonal only", str(res)
