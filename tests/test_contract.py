"""The contract layer (numpytfmr/contract.py): specs are parsed, checked and applied once."""
import numpy as np
import pytest

from numpytfmr.contract import (ContractSpec, OpCache, axis_of, backward_of, count, fraction,
                                one_of, op, optional, positive)


@op("x: (..., n, d)", "W: (d, m)", "b: (m,)?", "mask: bool ~(..., n, m)?", eps=positive,
    mode=one_of("a", "b"), k=optional(count))
def toy_forward(x, W, b=None, *, mask=None, eps=1e-5, mode="a", k=None):
    y = x @ W + (0 if b is None else b)
    if mask is not None:
        y = np.where(mask, y, 0.0)
    return y, {"x": x, "W": W, "mask": mask}


@backward_of(toy_forward)
def toy_backward(dout, cache):
    if cache["mask"] is not None:
        dout = np.where(cache["mask"], dout, 0.0)
    return dout @ cache["W"].T, cache["x"].reshape(-1, cache["x"].shape[-1]).T @ dout.reshape(-1, dout.shape[-1]), None


@op("x: (...)", axis=axis_of("x"))
def sum_forward(x, *, axis=-1):
    return x.sum(axis), {"shape": x.shape, "axis": axis}


@backward_of(sum_forward)
def sum_backward(dout, cache):
    return np.broadcast_to(np.expand_dims(dout, cache["axis"]), cache["shape"]).copy()


rng = np.random.default_rng(0)
X, W = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))


def test_shapes_and_symbols_are_checked_with_named_messages():
    with pytest.raises(ValueError, match=r"toy_forward: W has shape \(3, 5\) but x has shape \(2, 3, 4\); the axes d must match"):
        toy_forward(X, rng.standard_normal((3, 5)))
    with pytest.raises(ValueError, match=r"toy_forward: b has shape \(4,\).*axes m must match"):
        toy_forward(X, W, np.ones(4))
    with pytest.raises(ValueError, match=r"toy_forward: x has shape \(4,\); expected at least 2 axes \(\.\.\., n, d\)"):
        toy_forward(np.ones(4), W)
    with pytest.raises(ValueError, match=r"expected d >= 1"):
        toy_forward(np.ones((2, 0)), np.ones((0, 5)))


def test_kinds_none_and_options():
    with pytest.raises(TypeError, match="toy_forward: x has dtype int64"):
        toy_forward(X.astype(np.int64), W)
    with pytest.raises(TypeError, match="toy_forward: W is None"):
        toy_forward(X, None)
    with pytest.raises(TypeError, match="toy_forward: mask has dtype float64; expected a boolean"):
        toy_forward(X, W, mask=np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"toy_forward: mask has shape \(4, 5\), which does not broadcast"):
        toy_forward(X, W, mask=np.ones((4, 5), bool))
    with pytest.raises(ValueError, match=r"toy_forward: eps is 0.0; expected a value in \(0.0, inf\)"):
        toy_forward(X, W, eps=0)
    with pytest.raises(ValueError, match="toy_forward: mode is 'c'; expected one of 'a', 'b'"):
        toy_forward(X, W, mode="c")
    with pytest.raises(TypeError, match="toy_forward: k is 1.5; expected a positive integer"):
        toy_forward(X, W, k=1.5)
    with pytest.raises(TypeError, match="toy_forward: .*unexpected keyword"):
        toy_forward(X, W, bogus=1)
    y, _ = toy_forward(X.tolist(), W)            # lists of floats are converted
    assert isinstance(y, np.ndarray) and y.shape == (2, 3, 5)


def test_leading_axes_must_broadcast_together():
    @op("a: (..., d)", "b: (..., d)")
    def pair_forward(a, b):
        return a + b, {}
    assert pair_forward(np.ones((2, 1, 3)), np.ones((4, 3)))[0].shape == (2, 4, 3)
    with pytest.raises(ValueError, match=r"pair_forward: the leading \(batch\) axes of a \(2, 3\), b \(5, 3\) do not broadcast"):
        pair_forward(np.ones((2, 3)), np.ones((5, 3)))


def test_float32_in_float32_out_and_gradients_in_input_dtypes():
    y, cache = toy_forward(X.astype(np.float32), W.astype(np.float32), np.ones(5, np.float32))
    assert y.dtype == np.float32 and isinstance(cache, OpCache) and cache.op == "toy_forward"
    dx, dW, db = toy_backward(np.ones(y.shape), cache)     # a float64 dout is cast to the output dtype
    assert dx.dtype == np.float32 and dW.dtype == np.float32 and db is None
    y, cache = toy_forward(X.astype(np.float32), W)        # mixed: the common dtype is float64
    assert y.dtype == np.float64
    dx, dW, _ = toy_backward(np.ones(y.shape), cache)
    assert dx.dtype == np.float32 and dW.dtype == np.float64   # each gradient in its input's dtype


def test_backward_checks_cache_origin_and_dout():
    y, cache = toy_forward(X, W)
    with pytest.raises(TypeError, match="toy_backward: cache is a dict; expected the cache returned by toy_forward"):
        toy_backward(y, dict(cache))
    _, other = sum_forward(X)
    with pytest.raises(TypeError, match="cache is the cache of sum_forward"):
        toy_backward(y, other)
    with pytest.raises(ValueError, match=r"toy_backward: dout has shape \(2, 3, 4\); expected the forward output's shape \(2, 3, 5\)"):
        toy_backward(np.ones((2, 3, 4)), cache)
    with pytest.raises(TypeError, match="toy_backward: dout has dtype int64"):
        toy_backward(np.ones((2, 3, 5), np.int64), cache)


def test_axis_option_refuses_empty_and_out_of_range_axes():
    assert sum_forward(X, axis=-2)[1]["axis"] == 1
    with pytest.raises(ValueError, match=r"sum_forward: axis is 3 but x has shape \(2, 3, 4\)"):
        sum_forward(X, axis=3)
    with pytest.raises(ValueError, match=r"sum_forward: x has shape \(2, 0\), empty along axis = 1"):
        sum_forward(np.ones((2, 0)))


def test_the_contract_is_readable_from_the_function():
    spec = toy_forward.__contract__
    assert isinstance(spec, ContractSpec)
    lines = spec.lines()
    assert lines[:2] == ["x: (..., n, d)", "W: (d, m)"]
    assert any(line.startswith("eps: ") for line in lines)
    assert toy_forward.__name__ == "toy_forward" and toy_backward.forward is toy_forward


def test_bad_specs_are_refused_when_the_op_is_defined():
    with pytest.raises(SyntaxError):
        op("x (d)")(lambda x: None)
    with pytest.raises(SyntaxError, match="not parameters"):
        op("y: (d,)")(lambda x: None)
    assert fraction(0.5, "p", "f") == 0.5


def test_scalar_and_multiple_outputs_get_their_upstream_gradients_checked():
    @op("x: (n,)")
    def total_forward(x):
        return x.sum(), {"n": x.shape[0]}

    @backward_of(total_forward)
    def total_backward(dout, cache):
        return dout * np.ones(cache["n"])

    y, cache = total_forward(np.ones(3, np.float32))
    assert y.dtype == np.float32 and total_backward(1.0, cache).dtype == np.float32
    with pytest.raises(ValueError, match=r"total_backward: dout has shape \(3,\); expected the forward output's shape \(\)"):
        total_backward(np.ones(3), cache)

    @op("x: (n,)")
    def both_forward(x):
        return (2 * x, x.sum()), {}

    @backward_of(both_forward)
    def both_backward(dout, cache):
        return 2 * dout[0] + dout[1]

    _, cache = both_forward(np.ones(3))
    assert np.allclose(both_backward((np.ones(3), 1.0), cache), 3.0)
    with pytest.raises(TypeError, match=r"both_backward: dout is an array of dtype float64 and shape \(3,\); expected a tuple of 2"):
        both_backward(np.ones(3), cache)


# --- broadcasting without enlarging: one rule, declared by the ops --------------------------

def test_broadcasts_to_is_broadcasting_that_gives_the_target_itself():
    from numpytfmr.contract import broadcasts_to
    assert broadcasts_to((3, 5), (2, 3, 5)) and broadcasts_to((1, 5), (3, 5))
    assert broadcasts_to((), (2, 3)) and broadcasts_to((2, 1, 1), (2, 4, 3))
    assert not broadcasts_to((4, 5), (3, 5))                # incompatible
    assert not broadcasts_to((3, 1), (3,))                  # would enlarge: (3, 3)
    assert not broadcasts_to((2, 3, 5), (3, 5))             # more axes than the target
    assert not broadcasts_to((3, 5), (3, 1))                # a target axis of 1 grows to 5


def test_a_declared_broadcast_target_checks_with_the_contract_message():
    from numpytfmr.contract import broadcastable_to

    def scores(args):
        return args["x"].shape[:-1] + (args["n_k"],)

    @op("x: (..., n, d)", mask=broadcastable_to(scores, "(..., n, n_k)", to="the scores' shape "),
        n_k=count)
    def masked_forward(x, *, n_k, mask=None):
        return x, {}

    masked_forward(np.ones((2, 3, 4)), n_k=5, mask=np.ones((3, 5), bool))
    masked_forward(np.ones((2, 3, 4)), n_k=5)                          # None passes
    with pytest.raises(ValueError, match=r"^masked_forward: mask has shape \(3, 4\), which does "
                       r"not broadcast to the scores' shape \(2, 3, 5\) \(\.\.\., n, n_k\); "
                       r"expected a shape broadcastable to it$"):
        masked_forward(np.ones((2, 3, 4)), n_k=5, mask=np.ones((3, 4), bool))
    lines = masked_forward.__contract__.lines()
    assert "mask: None, or an array broadcastable to (..., n, n_k) without enlarging it" in lines


def test_the_broadcasting_rule_is_written_once():
    """No reference module (nor the fast path) but contract.py calls np.broadcast_shapes inside
    a try: the masks of mha, the decoder block's mask and RoPE's positions use the contract's
    rule."""
    import ast
    import pathlib
    import numpytfmr
    package = pathlib.Path(numpytfmr.__file__).parent
    found = []
    for path in sorted(package.glob("*.py")) + sorted((package / "fast").glob("*.py")):
        if path.name == "contract.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Try):
                calls = [n for b in node.body for n in ast.walk(b) if isinstance(n, ast.Attribute)
                         and n.attr == "broadcast_shapes"]
                found += [f"{path.relative_to(package)}:{c.lineno}" for c in calls]
    assert not found, "broadcasting written by hand (use contract.broadcasts_to): " + ", ".join(found)
