"""Core ops against PyTorch autograd in float64: every forward and every gradient to 1e-10.

Driven by the registry: every case of every core op (including the forward-only ones such
as logits of 1e4) is run through numpytfmr and through the matching torch.nn.functional
composition, with the same random upstream gradient.
"""
import numpy as np
import pytest

from numpytfmr.registry import bind
from numpytfmr.registry.core import OPS

torch = pytest.importorskip("torch")
F = torch.nn.functional

SPECS = {spec.name: spec for spec in OPS}
CASES = [(spec.name, i) for spec in OPS
         for i, _ in enumerate(spec.make_cases(np.random.default_rng(0), np.float64))]


def _t(a):
    """A float64 leaf tensor that records its gradient (integer arrays become plain tensors)."""
    if a is None:
        return None
    if a.dtype.kind == "f":
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)
    return torch.tensor(a)


def _torch_linear(x, W, b=None):
    return F.linear(x, W.T, b)  # torch stores W as (d_out, d_in)


_TORCH_ACT = {
    "relu": F.relu,
    "gelu": lambda h: F.gelu(h, approximate="none"),
    "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
}


def _torch_reference(name, args, kwargs, cache):
    """out = the torch computation of op ``name`` on the tensors ``args``."""
    if name == "linear":
        return _torch_linear(*args)
    if name == "relu":
        return F.relu(args[0])
    if name == "gelu":
        return F.gelu(args[0], approximate=kwargs.get("approximate", "none"))
    if name == "softmax":
        return F.softmax(args[0], dim=kwargs.get("axis", -1))
    if name == "log_softmax":
        return F.log_softmax(args[0], dim=kwargs.get("axis", -1))
    if name == "cross_entropy":
        logits, targets = args
        K = logits.shape[-1]
        ignore = kwargs.get("ignore_index")
        return F.cross_entropy(logits.reshape(-1, K), targets.reshape(-1),  # classes last -> (N, K)
                               label_smoothing=kwargs.get("label_smoothing", 0.0),
                               ignore_index=-100 if ignore is None else ignore)
    if name == "layernorm":
        x, gamma, beta = args
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps=kwargs.get("eps", 1e-5))
    if name == "rmsnorm":
        x, gamma = args
        return F.rms_norm(x, (x.shape[-1],), gamma, eps=kwargs.get("eps", 1e-6))
    if name == "embedding":
        ids, table = args
        return F.embedding(ids, table)
    if name == "dropout":  # the same mask as ours: torch's own RNG draws differ
        if cache["mask"] is None:
            return args[0] * 1.0
        return args[0] * torch.tensor(cache["mask"]) * cache["scale"]
    if name == "ffn":
        x, W1, b1, W2, b2 = args
        h = _torch_linear(x, W1, b1)
        return _torch_linear(_TORCH_ACT[kwargs.get("activation", "relu")](h), W2, b2)
    if name == "silu":
        return F.silu(args[0])
    if name == "swiglu_ffn":
        x, W_gate, W_up, W_down = args
        act = {"silu": F.silu, **_TORCH_ACT}[kwargs.get("activation", "silu")]
        return _torch_linear(act(_torch_linear(x, W_gate)) * _torch_linear(x, W_up), W_down)
    raise AssertionError(f"no torch reference for {name}")


def _assert_close(ours, ref, what):
    ref = np.asarray(ref)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-300)
    # 1e-10 relative, elementwise, with an absolute floor of 1e-10 of the array's scale for
    # entries that are tiny by cancellation (e.g. a LayerNorm gradient, a GELU tail)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10 * scale, err_msg=what)


@pytest.mark.parametrize("name,i", CASES)
def test_forward_and_gradients_match_torch(name, i):
    spec = SPECS[name]
    case = spec.make_cases(np.random.default_rng(0), np.float64)[i]
    out, cache = bind(spec.forward, case.kwargs)(*case.args)
    if name == "cross_entropy" and case.kwargs.get("ignore_index") is not None \
            and np.all(case.args[1] == case.kwargs["ignore_index"]):
        # torch returns 0/0 = nan here; ours is defined as 0 with a zero gradient
        assert float(out) == 0.0
        assert np.all(spec.backward(np.float64(1.0), cache)[0] == 0)
        return
    dout = np.random.default_rng(100 + i).standard_normal(np.shape(out))
    grads = spec.backward(dout, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)

    targs = [_t(a) for a in case.args]
    ref = _torch_reference(name, targs, case.kwargs, cache)
    _assert_close(out, ref.detach().numpy(), f"{name} [{case.label}] forward")
    (ref * torch.tensor(dout)).sum().backward()
    for k, (a, g) in enumerate(zip(targs, grads)):
        if a is None or not a.is_floating_point():
            assert g is None, f"{name}: input {k} should have no gradient"
            continue
        _assert_close(g, a.grad.numpy(), f"{name} [{case.label}] gradient of input {k}")


def test_cross_entropy_matches_torch_on_a_larger_batch_with_everything():
    from numpytfmr import cross_entropy_backward, cross_entropy_forward
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((4, 9, 13)) * 3
    targets = rng.integers(0, 13, size=(4, 9))
    targets[rng.random((4, 9)) < 0.3] = 5  # ignore class 5 wherever it appears
    for eps in (0.0, 0.05, 0.5, 1.0):
        loss, cache = cross_entropy_forward(logits, targets, label_smoothing=eps, ignore_index=5)
        tl = torch.tensor(logits, requires_grad=True)
        ref = F.cross_entropy(tl.reshape(-1, 13), torch.tensor(targets).reshape(-1),
                              label_smoothing=eps, ignore_index=5)
        ref.backward(torch.tensor(0.7, dtype=torch.float64))
        _assert_close(loss, ref.item(), f"loss eps={eps}")
        _assert_close(cross_entropy_backward(0.7, cache)[0], tl.grad.numpy(), f"dlogits eps={eps}")


def test_gelu_matches_torch_on_a_dense_grid():
    from numpytfmr import gelu_backward, gelu_forward
    x = np.linspace(-5, 12, 3401)
    for form in ("none", "tanh"):
        out, cache = gelu_forward(x, approximate=form)
        tx = torch.tensor(x, requires_grad=True)
        ref = F.gelu(tx, approximate=form)
        ref.sum().backward()
        _assert_close(out, ref.detach().numpy(), f"gelu {form}")
        _assert_close(gelu_backward(np.ones_like(x), cache), tx.grad.numpy(), f"gelu' {form}")
