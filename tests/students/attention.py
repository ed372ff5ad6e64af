"""Scaled dot-product attention, the scoring functions of the slides and Bahdanau's additive
attention, as a student writes them."""
import numpy as np

from . import Student


# --- scaled dot-product attention on a batch: (B, n, d) ----------------------------------
def attention(Q, K, V):
    d = Q.shape[-1]
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(d)
    scores = scores - scores.max(axis=2, keepdims=True)
    P = np.exp(scores)
    P /= P.sum(axis=2, keepdims=True)
    return P @ V, {"Q": Q, "K": K, "V": V, "P": P}


def attention_back(dO, c, mistake=None):
    Q, K, V, P = c["Q"], c["K"], c["V"], c["P"]
    scale = 1 / np.sqrt(Q.shape[-1])
    dV = P.transpose(0, 2, 1) @ dO
    if mistake == "dV not transposed":
        dV = P @ dO
    dP = dO @ V.transpose(0, 2, 1)
    if mistake == "without the subtraction":
        dS = P * dP
    elif mistake == "diagonal only":
        dS = P * (1 - P) * dP
    else:
        dS = P * (dP - (dP * P).sum(axis=2, keepdims=True))
    if mistake == "no scale":
        scale = 1.0
    dQ = dS @ K * scale
    dK = dS.transpose(0, 2, 1) @ Q * scale
    if mistake == "dK not transposed":
        dK = dS @ Q * scale
    return dQ, dK, dV


# --- scores ---------------------------------------------------------------------------------
def dot(Q, K):
    return Q @ K.T, (Q, K)


def dot_back(dS, c, mistake=None):
    Q, K = c
    return dS @ K, (dS @ Q if mistake == "dK not transposed" else dS.T @ Q)


def scaled_dot(Q, K):
    s = 1 / np.sqrt(Q.shape[1])
    return s * Q @ K.T, (Q, K, s)


def scaled_dot_back(dS, c, mistake=None):
    Q, K, s = c
    if mistake == "no scale":
        s = 1.0
    elif mistake == "divided by the scale":
        s = 1 / s
    dK = s * (dS @ Q if mistake == "dK not transposed" else dS.T @ Q)
    return s * dS @ K, dK


def neg_sq_dist(Q, K):
    S = np.zeros((Q.shape[0], K.shape[0]))
    for t in range(Q.shape[0]):
        for s in range(K.shape[0]):
            S[t, s] = -0.5 * np.sum((Q[t] - K[s]) ** 2)
    return S, (Q, K)


def neg_sq_dist_back(dS, c, mistake=None):
    Q, K = c
    dQ, dK = np.zeros_like(Q), np.zeros_like(K)
    two = 2.0 if mistake == "the 2 of the square kept" else 1.0
    sign = -1.0 if mistake == "dK with dQ's sign" else 1.0
    for t in range(Q.shape[0]):
        for s in range(K.shape[0]):
            dQ[t] -= two * dS[t, s] * (Q[t] - K[s])
            dK[s] += sign * two * dS[t, s] * (Q[t] - K[s])
    return dQ, dK


def bilinear(Q, K, M):
    QM = Q @ M
    return QM @ K.T, (Q, K, M, QM)


def bilinear_back(dS, c, mistake=None):
    Q, K, M, QM = c
    dQM = dS @ K
    dQ = dQM @ (M if mistake == "M not transposed" else M.T)
    dK = dS.T @ (Q if mistake == "M left out of dK" else QM)
    return dQ, dK, Q.T @ dQM


def additive(Q, K, Wq, Wk, w):
    T = np.tanh((Q @ Wq)[:, None, :] + (K @ Wk)[None, :, :])    # (n_q, n_k, h)
    return T @ w, (Q, K, Wq, Wk, w, T)


def additive_back(dS, c, mistake=None):
    Q, K, Wq, Wk, w, T = c
    dT = dS[:, :, None] * w
    if mistake == "tanh derivative left out":
        dP = dT
    elif mistake == "tanh derivative as 1 - T":
        dP = dT * (1 - T)
    else:
        dP = dT * (1 - T ** 2)
    dq, dk = dP.sum(axis=1), dP.sum(axis=0)
    return dq @ Wq.T, dk @ Wk.T, Q.T @ dq, K.T @ dk, np.einsum("ts,tsh->h", dS, T)


def bahdanau(q, K, V, Wq, Wk, w):
    T = np.tanh((q @ Wq)[:, None, :] + (K @ Wk)[None, :, :])
    e = T @ w
    a = np.exp(e - e.max(1, keepdims=True))
    a = a / a.sum(1, keepdims=True)
    return a @ V, (q, K, V, Wq, Wk, w, T, a)


def bahdanau_back(dc, cache, mistake=None):
    q, K, V, Wq, Wk, w, T, a = cache
    dV = a.T @ dc
    da = dc @ V.T
    if mistake == "without the subtraction":
        de = a * da
    elif mistake == "diagonal only":
        de = a * (1 - a) * da
    else:
        de = a * (da - np.sum(a * da, axis=1, keepdims=True))
    dT = de[:, :, None] * w
    dP = dT if mistake == "tanh derivative left out" else dT * (1 - T * T)
    dhq, dhk = dP.sum(1), dP.sum(0)
    return dhq @ Wq.T, dhk @ Wk.T, dV, q.T @ dhq, K.T @ dhk, (de[:, :, None] * T).sum((0, 1))


def _cases():
    rng = np.random.default_rng(16)
    r = rng.standard_normal
    out = []

    def add(op, fwd, back, make, names, mistakes):
        out.append(Student(op, None, fwd, back, make(), names))
        for m in mistakes:
            out.append(Student(op, m, fwd, lambda d, c, m=m, b=back: b(d, c, m), make(), names))

    add("attention", attention, attention_back, lambda: (r((2, 4, 5)), r((2, 4, 5)), r((2, 4, 3))),
        ("Q", "K", "V"), ("without the subtraction", "diagonal only", "no scale",
                          "dK not transposed", "dV not transposed"))
    add("dot_scores", dot, dot_back, lambda: (r((4, 5)), r((4, 5))), ("Q", "K"),
        ("dK not transposed",))
    add("scaled_dot_scores", scaled_dot, scaled_dot_back, lambda: (r((4, 5)), r((4, 5))), ("Q", "K"),
        ("dK not transposed", "no scale", "divided by the scale"))
    add("neg_sq_dist_scores", neg_sq_dist, neg_sq_dist_back,
        lambda: (0.7 * r((3, 5)), 0.7 * r((4, 5))), ("Q", "K"),
        ("the 2 of the square kept", "dK with dQ's sign"))
    add("bilinear_scores", bilinear, bilinear_back,
        lambda: (0.5 * r((3, 4)), 0.5 * r((5, 4)), 0.5 * r((4, 4))), ("Q", "K", "M"),
        ("M left out of dK", "M not transposed"))
    add("additive_scores", additive, additive_back,
        lambda: (0.6 * r((3, 4)), 0.6 * r((5, 6)), 0.6 * r((4, 5)), 0.6 * r((6, 5)), 0.6 * r(5)),
        ("Q", "K", "Wq", "Wk", "w"), ("tanh derivative left out", "tanh derivative as 1 - T"))
    add("additive_attention", bahdanau, bahdanau_back,
        lambda: (0.6 * r((3, 4)), 0.6 * r((5, 6)), 0.6 * r((5, 3)), 0.6 * r((4, 5)),
                 0.6 * r((6, 5)), 0.6 * r(5)),
        ("q", "K", "V", "Wq", "Wk", "w"),
        ("without the subtraction", "diagonal only", "tanh derivative left out"))
    return out


CASES = _cases()
