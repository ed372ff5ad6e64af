"""Attention scoring functions of the slides (002), and additive (Bahdanau) attention.

Every scoring op maps queries Q (..., n_q, d_q) and keys K (..., n_k, d_k) to scores
S (..., n_q, n_k), S_ts = a(q_t, k_s); softmax over s turns them into attention weights
(002 "Attention Mechanism, II", "Examples of attention weights"):

    dot product           a(q, k) = q^T k                        002 "Examples of attention weights"
    scaled dot product    a(q, k) = q^T k / sqrt(d)              002 "(Scaled) Dot product Attention"
    negative distance     a(q, k) = -||q - k||^2 / 2             002 "(Scaled) Dot product Attention"
    bilinear              a(q, k) = q^T M k                      002 "What if q and k are of different dimensions"
    additive              a(q, k) = w . tanh(q Wq + k Wk)        002 "Seq2seq meets attention", last slide

Row-vector convention (tokens are rows): the slides' ``W_q q_t`` is ``q_t Wq`` here.
Leading axes of Q and K broadcast; weight matrices are shared (2-D) or broadcast too.
"""
import numpy as np

from . import _validate as v
from .attention import (_T, _allowed, _check_dout, _masked_softmax, _softmax_backward, _unbroadcast,
                        _values_batch)

__all__ = [
    "dot_scores_forward", "dot_scores_backward",
    "scaled_dot_scores_forward", "scaled_dot_scores_backward",
    "neg_sq_dist_scores_forward", "neg_sq_dist_scores_backward",
    "bilinear_scores_forward", "bilinear_scores_backward",
    "additive_scores_forward", "additive_scores_backward",
    "additive_attention_forward", "additive_attention_backward",
]


def _qk(Q, K, where, *, same_d=True):
    """Validate queries and keys; return them in the result dtype and the batch shape."""
    Q = v.float_array(Q, "Q", where)
    K = v.float_array(K, "K", where)
    v.min_ndim(Q, 2, "Q", where, "(..., n_q, d_q)")
    v.min_ndim(K, 2, "K", where, "(..., n_k, d_k)")
    if same_d:
        v.same_last_dim(Q, K, "Q", "K", where, "d")
    try:
        batch = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2])
    except ValueError:
        raise ValueError(f"{where}: the leading (batch) axes of Q {Q.shape} and K {K.shape} do "
                         "not broadcast against each other") from None
    return Q, K, batch


def _weight(W, name, where, shape, layout):
    W = v.float_array(W, name, where)
    if W.shape[-len(shape):] != shape or W.ndim < len(shape):
        raise ValueError(f"{where}: {name} has shape {W.shape}; expected {layout} = "
                         f"(..., {', '.join(map(str, shape))})")
    return W


# ---------------------------------------------------------------------------------------
# dot product
# ---------------------------------------------------------------------------------------

def dot_scores_forward(Q, K):
    """Dot-product scores (002 "Examples of attention weights"; 003 §5.1 e_tj = s^T h_j).

        S_ts = q_t^T k_s,   S = Q K^T

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "dtype", "out_shape".
    """
    Q, K, _ = _qk(Q, K, "dot_scores_forward")
    dt = v.result_dtype(Q, K)
    Q, K = Q.astype(dt, copy=False), K.astype(dt, copy=False)
    S = Q @ _T(K)
    return S, {"Q": Q, "K": K, "dtype": dt, "out_shape": S.shape}


def dot_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``:  dQ = dS K,  dK = dS^T Q."""
    dS = _check_dout(dS, cache, "dot_scores_backward")
    Q, K = cache["Q"], cache["K"]
    dQ = dS @ K                                   # S = Q K^T  ->  dQ = dS K
    dK = _T(dS) @ Q                               #            ->  dK = dS^T Q
    return _unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# scaled dot product
# ---------------------------------------------------------------------------------------

def scaled_dot_scores_forward(Q, K, *, scale=None):
    """Scaled dot-product scores (002 "(Scaled) Dot product Attention", 003 §5.1.1).

        S_ts = q_t^T k_s * scale,   scale = 1/sqrt(d) by default

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "scale", "dtype", "out_shape".
    """
    where = "scaled_dot_scores_forward"
    Q, K, _ = _qk(Q, K, where)
    dt = v.result_dtype(Q, K)
    Q, K = Q.astype(dt, copy=False), K.astype(dt, copy=False)
    scale = 1.0 / np.sqrt(Q.shape[-1]) if scale is None else v.number(scale, "scale", where)
    scale = float(scale)
    S = (Q @ _T(K)) * scale
    return S, {"Q": Q, "K": K, "scale": scale, "dtype": dt, "out_shape": S.shape}


def scaled_dot_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``:  dQ = scale dS K,  dK = scale dS^T Q."""
    dS = _check_dout(dS, cache, "scaled_dot_scores_backward")
    Q, K, scale = cache["Q"], cache["K"], cache["scale"]
    dQ = (dS @ K) * scale                         # S = scale Q K^T  ->  dQ = scale dS K
    dK = (_T(dS) @ Q) * scale                     #                  ->  dK = scale dS^T Q
    return _unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# negative squared distance
# ---------------------------------------------------------------------------------------

def neg_sq_dist_scores_forward(Q, K):
    """Negative squared-distance scores (002 "(Scaled) Dot product Attention", first bullet).

        S_ts = -||q_t - k_s||^2 / 2  =  q_t^T k_s - ||q_t||^2/2 - ||k_s||^2/2

    The softmax over s drops the -||q_t||^2/2 term, so with keys of equal norm these
    weights equal dot-product attention's (the slide's route to the scaled dot product).
    Computed from the differences, so every score is exactly <= 0.

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "diff" (q_t - k_s, shape (..., n_q, n_k, d)), "dtype", "out_shape".
    """
    Q, K, _ = _qk(Q, K, "neg_sq_dist_scores_forward")
    dt = v.result_dtype(Q, K)
    Q, K = Q.astype(dt, copy=False), K.astype(dt, copy=False)
    diff = Q[..., :, None, :] - K[..., None, :, :]  # (..., n_q, n_k, d): q_t - k_s
    S = -0.5 * np.sum(diff * diff, axis=-1)
    return S, {"Q": Q, "K": K, "diff": diff, "dtype": dt, "out_shape": S.shape}


def neg_sq_dist_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``:  dq_t = -sum_s dS_ts (q_t - k_s),  dk_s = sum_t dS_ts (q_t - k_s)."""
    dS = _check_dout(dS, cache, "neg_sq_dist_scores_backward")
    Q, K, diff = cache["Q"], cache["K"], cache["diff"]
    g = dS[..., None] * diff                      # dS_ts (q_t - k_s)
    dQ = -np.sum(g, axis=-2)                      # dS_ts/dq_t = -(q_t - k_s)
    dK = np.sum(g, axis=-3)                       # dS_ts/dk_s = +(q_t - k_s)
    return _unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# bilinear
# ---------------------------------------------------------------------------------------

def bilinear_scores_forward(Q, K, M):
    """Bilinear ("general") scores for queries and keys of different sizes (002, last slide).

        S_ts = q_t^T M k_s,   S = Q M K^T

    Q: (..., n_q, d_q)   K: (..., n_k, d_k)   M: (d_q, d_k) (or broadcast (..., d_q, d_k))
    ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "M", "QM" (Q M, shape (..., n_q, d_k)), "dtype", "out_shape".
    """
    where = "bilinear_scores_forward"
    Q, K, _ = _qk(Q, K, where, same_d=False)
    M = _weight(M, "M", where, (Q.shape[-1], K.shape[-1]), "(..., d_q, d_k)")
    dt = v.result_dtype(Q, K, M)
    Q, K, M = (a.astype(dt, copy=False) for a in (Q, K, M))
    QM = Q @ M                                    # (..., n_q, d_k): queries mapped to key space
    S = QM @ _T(K)
    return S, {"Q": Q, "K": K, "M": M, "QM": QM, "dtype": dt, "out_shape": S.shape}


def bilinear_scores_backward(dS, cache):
    """Returns ``(dQ, dK, dM)``:  dQ = dS K M^T,  dK = dS^T Q M,  dM = sum Q^T dS K."""
    dS = _check_dout(dS, cache, "bilinear_scores_backward")
    Q, K, M, QM = cache["Q"], cache["K"], cache["M"], cache["QM"]
    dQM = dS @ K                                  # S = (QM) K^T  ->  d(QM) = dS K
    dK = _T(dS) @ QM                              #               ->  dK = dS^T (Q M)
    dQ = dQM @ _T(M)                              # QM = Q M      ->  dQ = d(QM) M^T
    dM = _T(Q) @ dQM                              #               ->  dM = Q^T d(QM), summed over batch
    return (_unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape), _unbroadcast(dM, M.shape))


# ---------------------------------------------------------------------------------------
# additive
# ---------------------------------------------------------------------------------------

def _additive_inputs(Q, K, Wq, Wk, w, where):
    Q, K, _ = _qk(Q, K, where, same_d=False)
    w = v.float_array(w, "w", where)
    if w.ndim != 1:
        raise ValueError(f"{where}: w has shape {w.shape}; expected a vector (d_h,)")
    d_h = w.shape[0]
    Wq = _weight(Wq, "Wq", where, (Q.shape[-1], d_h), "(d_q, d_h)")
    Wk = _weight(Wk, "Wk", where, (K.shape[-1], d_h), "(d_k, d_h)")
    return Q, K, Wq, Wk, w


def _additive_scores(Q, K, Wq, Wk, w):
    Hq = Q @ Wq                                   # (..., n_q, d_h)  q_t Wq
    Hk = K @ Wk                                   # (..., n_k, d_h)  k_s Wk
    T = np.tanh(Hq[..., :, None, :] + Hk[..., None, :, :])  # (..., n_q, n_k, d_h)
    return T @ w, T                               # S_ts = w . T_ts


def _additive_scores_backward(dS, Q, K, Wq, Wk, w, T):
    dT = dS[..., None] * w                        # S = T w        ->  dT = dS w^T
    dP = dT * (1.0 - T * T)                       # T = tanh(P)    ->  dP = dT (1 - T^2)
    dHq = np.sum(dP, axis=-2)                     # P_ts = Hq_t + Hk_s: sum over keys s
    dHk = np.sum(dP, axis=-3)                     #                     sum over queries t
    dw = np.tensordot(dS, T, axes=dS.ndim)        # S = T w        ->  dw = sum_(batch,t,s) dS_ts T_ts
    dQ = dHq @ _T(Wq)                             # Hq = Q Wq      ->  dQ = dHq Wq^T
    dK = dHk @ _T(Wk)                             # Hk = K Wk      ->  dK = dHk Wk^T
    dWq = _T(Q) @ dHq                             #                ->  dWq = Q^T dHq (summed below)
    dWk = _T(K) @ dHk                             #                ->  dWk = K^T dHk
    return (_unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape),
            _unbroadcast(dWq, Wq.shape), _unbroadcast(dWk, Wk.shape), dw)


def additive_scores_forward(Q, K, Wq, Wk, w):
    """Additive scores (002 last slide; Bahdanau et al. 2014; 002 "Seq2seq meets attention").

        S_ts = w . tanh(q_t Wq + k_s Wk)

    (the slides' w_v^T tanh(W_q q_t + W_k k_s), written for row vectors).
    Q: (..., n_q, d_q)   K: (..., n_k, d_k)   Wq: (d_q, d_h)   Wk: (d_k, d_h)   w: (d_h,)
    ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "Wq", "Wk", "w", "T" (the tanh, shape (..., n_q, n_k, d_h)),
    "dtype", "out_shape".
    """
    Q, K, Wq, Wk, w = _additive_inputs(Q, K, Wq, Wk, w, "additive_scores_forward")
    dt = v.result_dtype(Q, K, Wq, Wk, w)
    Q, K, Wq, Wk, w = (a.astype(dt, copy=False) for a in (Q, K, Wq, Wk, w))
    S, T = _additive_scores(Q, K, Wq, Wk, w)
    cache = {"Q": Q, "K": K, "Wq": Wq, "Wk": Wk, "w": w, "T": T, "dtype": dt,
             "out_shape": S.shape}
    return S, cache


def additive_scores_backward(dS, cache):
    """Returns ``(dQ, dK, dWq, dWk, dw)``."""
    dS = _check_dout(dS, cache, "additive_scores_backward")
    c = cache
    return _additive_scores_backward(dS, c["Q"], c["K"], c["Wq"], c["Wk"], c["w"], c["T"])


def additive_attention_forward(q, K, V, Wq, Wk, w, *, mask=None):
    """Additive (Bahdanau) attention (002 "Seq2seq meets attention"; Bahdanau et al. 2014).

        a_ts = w . tanh(q_t Wq + k_s Wk),   alpha_ts = softmax_s(a_ts),   c_t = sum_s alpha_ts v_s

    q: (..., n_q, d_q) decoder states h_t   K: (..., n_k, d_k) encoder states h'_s
    V: (..., n_k, d_v) values (for Bahdanau, V is K)   Wq: (d_q, d_h)   Wk: (d_k, d_h)
    w: (d_h,)   ->  c: (..., n_q, d_v)
    mask: boolean, broadcastable to (..., n_q, n_k), True = may attend (e.g. source padding);
    a query with no allowed key gets a zero context and zero gradients.

    cache keys: "q", "K", "V", "Wq", "Wk", "w", "T" (the tanh), "weights" (alpha,
    (..., n_q, n_k)), "dtype", "out_shape".
    """
    where = "additive_attention_forward"
    q, K, Wq, Wk, w = _additive_inputs(q, K, Wq, Wk, w, where)
    V = v.float_array(V, "V", where)
    v.min_ndim(V, 2, "V", where, "(..., n_k, d_v)")
    batch = _values_batch(q, K, V, where, q_name="q")
    allowed = _allowed(mask, None, where, batch + (q.shape[-2], K.shape[-2]))
    dt = v.result_dtype(q, K, V, Wq, Wk, w)
    q, K, V, Wq, Wk, w = (a.astype(dt, copy=False) for a in (q, K, V, Wq, Wk, w))
    S, T = _additive_scores(q, K, Wq, Wk, w)      # (..., n_q, n_k) scores a_ts
    A = _masked_softmax(S, allowed)               # alpha_ts
    out = A @ V                                   # c_t = sum_s alpha_ts v_s
    cache = {"q": q, "K": K, "V": V, "Wq": Wq, "Wk": Wk, "w": w, "T": T, "weights": A,
             "dtype": dt, "out_shape": out.shape}
    return out, cache


def additive_attention_backward(dout, cache):
    """Returns ``(dq, dK, dV, dWq, dWk, dw)``.

        dV = alpha^T dc,   d alpha = dc V^T,   da = alpha * (d alpha - rowsum(d alpha * alpha)),
        then the additive-score backward of ``da``.
    """
    dout = _check_dout(dout, cache, "additive_attention_backward")
    c = cache
    A, V = c["weights"], c["V"]
    dV = _T(A) @ dout                             # c = alpha V    ->  dV = alpha^T dc
    dA = dout @ _T(V)                             #                ->  d alpha = dc V^T
    dS = _softmax_backward(dA, A)                 # alpha = softmax(a)  softmax JVP
    dq, dK, dWq, dWk, dw = _additive_scores_backward(dS, c["q"], c["K"], c["Wq"], c["Wk"],
                                                     c["w"], c["T"])
    return dq, dK, _unbroadcast(dV, V.shape), dWq, dWk, dw
