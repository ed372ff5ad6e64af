"""Multi-head attention without biases (two heads), with RoPE or not, as a student writes it."""
import numpy as np

from . import Student
from .rope import angles, rotate

HEADS = 2


def make_mha(use_rope=False):
    def mha(x_q, x_kv, Wq, Wk, Wv, Wo):
        B, n, _ = x_q.shape
        m = x_kv.shape[1]
        dh = Wq.shape[1] // HEADS

        def heads(t):                                    # (B, n, H*dh) -> (B, H, n, dh)
            return t.reshape(B, t.shape[1], HEADS, dh).transpose(0, 2, 1, 3)
        q, k, v = heads(x_q @ Wq), heads(x_kv @ Wk), heads(x_kv @ Wv)
        rot = None
        if use_rope:
            rot = angles(n, dh)
            q, k = rotate(q, *rot), rotate(k, *rot)
        S = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        A = np.exp(S - S.max(-1, keepdims=True))
        A = A / A.sum(-1, keepdims=True)
        o = A @ v
        concat = o.transpose(0, 2, 1, 3).reshape(B, n, HEADS * dh)
        cache = dict(x_q=x_q, x_kv=x_kv, Wq=Wq, Wk=Wk, Wv=Wv, Wo=Wo, q=q, k=k, v=v, A=A,
                     concat=concat, rot=rot, m=m)
        return concat @ Wo, cache
    return mha


def mha_back(dout, c, mistake=None):
    x_q, x_kv, Wq, Wk, Wv, Wo = (c[k] for k in ("x_q", "x_kv", "Wq", "Wk", "Wv", "Wo"))
    q, k, v, A, concat = c["q"], c["k"], c["v"], c["A"], c["concat"]
    B, n, _ = x_q.shape
    dh = q.shape[-1]
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    dWo = flat(concat).T @ flat(dout)
    do = (dout @ Wo.T).reshape(B, n, HEADS, dh).transpose(0, 2, 1, 3)
    dv = A.transpose(0, 1, 3, 2) @ do
    dA = do @ v.transpose(0, 1, 3, 2)
    dS = A * (dA - (dA * A).sum(-1, keepdims=True))
    if mistake != "attention scale left out":
        dS = dS / np.sqrt(dh)
    dq, dk = dS @ k, dS.transpose(0, 1, 3, 2) @ q
    if c["rot"] is not None and mistake != "RoPE not undone":
        dq, dk = rotate(dq, *c["rot"], -1.0), rotate(dk, *c["rot"], -1.0)

    def merge(t):
        return t.transpose(0, 2, 1, 3).reshape(B, t.shape[2], HEADS * dh)
    dQ, dK, dV = merge(dq), merge(dk), merge(dv)
    dWq, dWk, dWv = flat(x_q).T @ flat(dQ), flat(x_kv).T @ flat(dK), flat(x_kv).T @ flat(dV)
    dx_q = dQ @ Wq.T
    dx_kv = dK @ Wk.T + dV @ Wv.T
    if mistake == "x_kv through the keys only":
        dx_kv = dK @ Wk.T
    elif mistake == "x_kv through the values only":
        dx_kv = dV @ Wv.T
    return dx_q, dx_kv, dWq, dWk, dWv, dWo


def _cases():
    rng = np.random.default_rng(18)
    names = ("x_q", "x_kv", "Wq", "Wk", "Wv", "Wo")

    def cross():
        return (rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 5, 6)),
                rng.standard_normal((6, 4)) / 2.5, rng.standard_normal((6, 4)) / 2.5,
                rng.standard_normal((6, 4)) / 2.5, rng.standard_normal((4, 6)) / 2)

    def self_attention():
        x = rng.standard_normal((1, 4, 6))
        return (x, x.copy(), rng.standard_normal((6, 8)) / 2.5, rng.standard_normal((6, 8)) / 2.5,
                rng.standard_normal((6, 8)) / 2.5, rng.standard_normal((8, 6)) / 3)
    plain, rotary = make_mha(), make_mha(use_rope=True)
    out = [Student("mha", None, plain, mha_back, cross(), names),
           Student("mha", None, rotary, mha_back, self_attention(), names)]
    for m in ("attention scale left out", "x_kv through the keys only", "x_kv through the values only"):
        out.append(Student("mha", m, plain, lambda d, c, m=m: mha_back(d, c, m), cross(), names))
    out.append(Student("mha", "RoPE not undone", rotary,
                       lambda d, c: mha_back(d, c, "RoPE not undone"), self_attention(), names))
    return out


CASES = _cases()
