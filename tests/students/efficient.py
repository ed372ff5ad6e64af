"""Flash attention (key tiles with a running softmax), sliding-window attention and linear
attention, as a student writes them."""
import numpy as np

from . import Student

BLOCK = 2


# --- flash attention: one pass over key tiles, the log-sum-exp kept for the backward ---------
def make_flash(causal=False):
    def flash(Q, K, V):
        B, n, d = Q.shape
        m_k = K.shape[1]
        scale = 1 / np.sqrt(d)
        run_max = np.full((B, n, 1), -np.inf)
        run_sum = np.zeros((B, n, 1))
        acc = np.zeros((B, n, V.shape[2]))
        for j0 in range(0, m_k, BLOCK):
            S = Q @ K[:, j0:j0 + BLOCK].transpose(0, 2, 1) * scale
            if causal:
                allowed = np.arange(j0, min(j0 + BLOCK, m_k))[None, :] <= np.arange(n)[:, None]
                S = np.where(allowed, S, -np.inf)
            new_max = np.maximum(run_max, S.max(axis=2, keepdims=True))
            corr = np.exp(run_max - new_max)
            P = np.exp(S - new_max)
            run_sum = run_sum * corr + P.sum(axis=2, keepdims=True)
            acc = acc * corr + P @ V[:, j0:j0 + BLOCK]
            run_max = new_max
        O = acc / run_sum
        return O, {"Q": Q, "K": K, "V": V, "O": O, "L": run_max + np.log(run_sum),
                   "causal": causal, "scale": scale}
    return flash


def flash_back(dO, c, mistake=None):
    Q, K, V, O, L, scale = c["Q"], c["K"], c["V"], c["O"], c["L"], c["scale"]
    S = Q @ K.transpose(0, 2, 1) * scale
    if c["causal"] and mistake != "P recomputed without the mask":
        n, m = S.shape[1], S.shape[2]
        S = np.where(np.arange(m)[None, :] <= np.arange(n)[:, None], S, -np.inf)
    P = np.exp(S) if mistake == "P not normalised" else np.exp(S - L)
    dV = P.transpose(0, 2, 1) @ dO
    dP = dO @ V.transpose(0, 2, 1)
    D = 0.0 if mistake == "D left out" else np.sum(dO * O, axis=2, keepdims=True)
    dS = P * (dP - D)
    if mistake == "no scale":
        scale = 1.0
    return dS @ K * scale, dS.transpose(0, 2, 1) @ Q * scale, dV


# --- sliding-window attention: each query sees itself and the WINDOW keys before it ----------
WINDOW = 2


def sliding(Q, K, V):
    n, d = Q.shape
    i, j = np.arange(n)[:, None], np.arange(K.shape[0])[None, :]
    band = (j <= i) & (j >= i - WINDOW)
    S = np.where(band, Q @ K.T / np.sqrt(d), -np.inf)
    A = np.exp(S - S.max(1, keepdims=True))
    A /= A.sum(1, keepdims=True)
    return A @ V, (Q, K, V, A)


def sliding_back(dO, cache, mistake=None):
    Q, K, V, A = cache
    s = 1.0 if mistake == "no scale" else 1 / np.sqrt(Q.shape[1])
    dA = dO @ V.T
    dS = A * dA if mistake == "without the subtraction" else A * (dA - (A * dA).sum(1, keepdims=True))
    return dS @ K * s, dS.T @ Q * s, A.T @ dO


# --- linear attention, phi = elu + 1 ---------------------------------------------------------
def phi(x):
    return np.where(x > 0, x + 1, np.exp(x))


def linear_attention(Q, K, V):
    fq, fk = phi(Q), phi(K)
    KV = fk.T @ V
    ksum = fk.sum(axis=0)
    den = fq @ ksum + 1e-6
    out = (fq @ KV) / den[:, None]
    return out, (Q, K, V, fq, fk, KV, ksum, den, out)


def linear_attention_back(dout, cache, mistake=None):
    Q, K, V, fq, fk, KV, ksum, den, out = cache
    dnum = dout / den[:, None]
    dden = -(dout * out).sum(1) / den
    if mistake == "denominator held constant":
        dden = np.zeros_like(dden)
    dfq = dnum @ KV.T + dden[:, None] * ksum
    dKV = fq.T @ dnum
    dksum = fq.T @ dden
    dfk = V @ dKV.T + dksum[None, :]
    dV = fk @ dKV
    if mistake == "phi' left out":
        return dfq, dfk, dV
    return dfq * np.where(Q > 0, 1.0, np.exp(Q)), dfk * np.where(K > 0, 1.0, np.exp(K)), dV


def _cases():
    rng = np.random.default_rng(22)
    r = rng.standard_normal
    names = ("Q", "K", "V")
    out = []
    flash, causal_flash = make_flash(), make_flash(causal=True)
    qkv = lambda: (r((2, 5, 4)), r((2, 5, 4)), r((2, 5, 3)))  # noqa: E731
    out.append(Student("flash_attention", None, flash, flash_back, qkv(), names))
    out.append(Student("flash_attention", None, causal_flash, flash_back, qkv(), names))
    accepted = {"D left out": {"without the subtraction"}, "no scale": {"no scale"}}
    for m in ("D left out", "P not normalised", "no scale"):
        out.append(Student("flash_attention", m, flash, lambda d, c, m=m: flash_back(d, c, m), qkv(),
                           names, frozenset(accepted.get(m, ()))))
    out.append(Student("flash_attention", "P recomputed without the mask", causal_flash,
                       lambda d, c: flash_back(d, c, "P recomputed without the mask"), qkv(), names))
    band = lambda: (r((6, 3)), r((6, 3)), r((6, 2)))  # noqa: E731
    out.append(Student("sliding_window_attention", None, sliding, sliding_back, band(), names))
    for m in ("without the subtraction", "no scale"):
        out.append(Student("sliding_window_attention", m, sliding,
                           lambda d, c, m=m: sliding_back(d, c, m), band(), names))

    def away(*shape):
        x = r(shape)
        return np.sign(x) * (0.05 + np.abs(x))
    lin = lambda: (away(5, 4), away(6, 4), away(6, 3))  # noqa: E731
    out.append(Student("linear_attention", None, linear_attention, linear_attention_back, lin(), names))
    for m in ("phi' left out", "denominator held constant"):
        out.append(Student("linear_attention", m, linear_attention,
                           lambda d, c, m=m: linear_attention_back(d, c, m), lin(), names))
    return out


CASES = _cases()
