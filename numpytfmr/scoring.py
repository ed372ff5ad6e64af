"""Attention scoring functions of the slides (002), and additive (Bahdanau) attention.

Every scoring op maps queries `Q` (..., n_q, d_q) and keys `K` (..., n_k, d_k) to scores
`S` (..., n_q, n_k), `S_ts = a(q_t, k_s)`; softmax over `s` turns them into attention weights
(002 "Attention Mechanism, II", "Examples of attention weights"):

    dot product           a(q, k) = q^T k                        002 "Examples of attention weights"
    scaled dot product    a(q, k) = q^T k / sqrt(d)              002 "(Scaled) Dot product Attention"
    negative distance     a(q, k) = -||q - k||^2 / 2             002 "(Scaled) Dot product Attention"
    bilinear              a(q, k) = q^T M k                      002 "What if q and k are of different dimensions"
    additive              a(q, k) = w . tanh(q Wq + k Wk)        002 "Seq2seq meets attention", last slide

Row-vector convention (tokens are rows): the slides' ``W_q q_t`` is ``q_t Wq`` here.
Leading axes of `Q` and `K` broadcast; weight matrices are shared (2-D) or broadcast too.
"""
import numpy as np

from .attention import masked_softmax, softmax_jvp, unbroadcast
from .contract import backward_of, op, optional, real

__all__ = [
    "dot_scores_forward", "dot_scores_backward",
    "scaled_dot_scores_forward", "scaled_dot_scores_backward",
    "neg_sq_dist_scores_forward", "neg_sq_dist_scores_backward",
    "bilinear_scores_forward", "bilinear_scores_backward",
    "additive_scores_forward", "additive_scores_backward",
    "additive_attention_forward", "additive_attention_backward",
]


# ---------------------------------------------------------------------------------------
# dot product
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d)", "K: (..., n_k, d)")
def dot_scores_forward(Q, K):
    """Dot-product scores (002 "Examples of attention weights"; 003 §5.1 `e_tj = s^T h_j`).

        S_ts = q_t^T k_s,   S = Q K^T

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K".
    """
    S = Q @ K.swapaxes(-1, -2)                    # S = Q K^T
    return S, {"Q": Q, "K": K}


@backward_of(dot_scores_forward)
def dot_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``: `dQ = dS K`, `dK = dS^T Q`."""
    Q, K = cache["Q"], cache["K"]
    dQ = dS @ K                                   # S = Q K^T  ->  dQ = dS K
    dK = dS.swapaxes(-1, -2) @ Q                  #            ->  dK = dS^T Q
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# scaled dot product
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d)", "K: (..., n_k, d)", scale=optional(real))
def scaled_dot_scores_forward(Q, K, *, scale=None):
    """Scaled dot-product scores (002 "(Scaled) Dot product Attention", 003 §5.1.1).

        S_ts = q_t^T k_s * scale,   scale = 1/sqrt(d) by default

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "scale".
    """
    if scale is None:
        scale = Q.shape[-1] ** -0.5               # 1 / sqrt(d)
    S = Q @ K.swapaxes(-1, -2) * scale            # S = Q K^T / sqrt(d)
    return S, {"Q": Q, "K": K, "scale": scale}


@backward_of(scaled_dot_scores_forward)
def scaled_dot_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``: `dQ = scale dS K`, `dK = scale dS^T Q`."""
    Q, K, scale = cache["Q"], cache["K"], cache["scale"]
    dQ = dS @ K * scale                           # S = scale Q K^T  ->  dQ = scale dS K
    dK = dS.swapaxes(-1, -2) @ Q * scale          #                  ->  dK = scale dS^T Q
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# negative squared distance
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d)", "K: (..., n_k, d)")
def neg_sq_dist_scores_forward(Q, K):
    """Negative squared-distance scores (002 "(Scaled) Dot product Attention", first bullet).

        S_ts = -||q_t - k_s||^2 / 2  =  q_t^T k_s - ||q_t||^2/2 - ||k_s||^2/2

    The softmax over `s` drops the `-||q_t||^2/2` term, so with keys of equal norm these
    weights equal dot-product attention's (the slide's route to the scaled dot product).
    Computed from the differences, so every score is exactly `<= 0`.

    Q: (..., n_q, d)   K: (..., n_k, d)   ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "diff" (q_t - k_s, shape (..., n_q, n_k, d)).
    """
    diff = Q[..., :, None, :] - K[..., None, :, :]   # (..., n_q, n_k, d): q_t - k_s
    S = -0.5 * (diff * diff).sum(axis=-1)            # -||q_t - k_s||^2 / 2
    return S, {"Q": Q, "K": K, "diff": diff}


@backward_of(neg_sq_dist_scores_forward)
def neg_sq_dist_scores_backward(dS, cache):
    """Returns ``(dQ, dK)``: `dq_t = -sum_s dS_ts (q_t - k_s)`, `dk_s = sum_t dS_ts (q_t - k_s)`."""
    Q, K, diff = cache["Q"], cache["K"], cache["diff"]
    g = dS[..., None] * diff                      # dS_ts (q_t - k_s)
    dQ = -g.sum(axis=-2)                          # dS_ts/dq_t = -(q_t - k_s), summed over s
    dK = g.sum(axis=-3)                           # dS_ts/dk_s = +(q_t - k_s), summed over t
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape)


# ---------------------------------------------------------------------------------------
# bilinear
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d_q)", "K: (..., n_k, d_k)", "M: (..., d_q, d_k)")
def bilinear_scores_forward(Q, K, M):
    """Bilinear ("general") scores for queries and keys of different sizes (002, last slide).

        S_ts = q_t^T M k_s,   S = Q M K^T

    Q: (..., n_q, d_q)   K: (..., n_k, d_k)   M: (d_q, d_k) (or broadcast (..., d_q, d_k))
    ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "M", "QM" (Q M, shape (..., n_q, d_k)).
    """
    QM = Q @ M                                    # (..., n_q, d_k): queries mapped to key space
    S = QM @ K.swapaxes(-1, -2)                   # S = (Q M) K^T
    return S, {"Q": Q, "K": K, "M": M, "QM": QM}


@backward_of(bilinear_scores_forward)
def bilinear_scores_backward(dS, cache):
    """Returns ``(dQ, dK, dM)``: `dQ = dS K M^T`, `dK = dS^T Q M`, `dM = sum Q^T dS K`."""
    Q, K, M, QM = cache["Q"], cache["K"], cache["M"], cache["QM"]
    dQM = dS @ K                                  # S = (QM) K^T  ->  d(QM) = dS K
    dK = dS.swapaxes(-1, -2) @ QM                 #               ->  dK = dS^T (Q M)
    dQ = dQM @ M.swapaxes(-1, -2)                 # QM = Q M      ->  dQ = d(QM) M^T
    dM = Q.swapaxes(-1, -2) @ dQM                 #               ->  dM = Q^T d(QM), summed below
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dM, M.shape)


# ---------------------------------------------------------------------------------------
# additive
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d_q)", "K: (..., n_k, d_k)", "Wq: (..., d_q, d_h)", "Wk: (..., d_k, d_h)",
    "w: (d_h,)")
def additive_scores_forward(Q, K, Wq, Wk, w):
    """Additive scores (002 last slide; Bahdanau et al. 2014; 002 "Seq2seq meets attention").

        S_ts = w . tanh(q_t Wq + k_s Wk)

    (the slides' `w_v^T tanh(W_q q_t + W_k k_s)`, written for row vectors).
    Q: (..., n_q, d_q)   K: (..., n_k, d_k)   Wq: (d_q, d_h)   Wk: (d_k, d_h)   w: (d_h,)
    ->  S: (..., n_q, n_k)
    cache keys: "Q", "K", "Wq", "Wk", "w", "T" (the tanh, shape (..., n_q, n_k, d_h)).
    """
    Hq = Q @ Wq                                   # (..., n_q, d_h)  q_t Wq
    Hk = K @ Wk                                   # (..., n_k, d_h)  k_s Wk
    T = np.tanh(Hq[..., :, None, :] + Hk[..., None, :, :])   # T_ts = tanh(q_t Wq + k_s Wk)
    S = T @ w                                     # S_ts = w . T_ts
    return S, {"Q": Q, "K": K, "Wq": Wq, "Wk": Wk, "w": w, "T": T}


@backward_of(additive_scores_forward)
def additive_scores_backward(dS, cache):
    """Returns ``(dQ, dK, dWq, dWk, dw)``.

        dT = dS w^T,   dP = dT (1 - T^2),   dHq_t = sum_s dP_ts,   dHk_s = sum_t dP_ts,
        dQ = dHq Wq^T,   dK = dHk Wk^T,   dWq = Q^T dHq,   dWk = K^T dHk,   dw = sum dS_ts T_ts
    """
    Q, K, Wq, Wk, w, T = (cache[k] for k in ("Q", "K", "Wq", "Wk", "w", "T"))
    dT = dS[..., None] * w                        # S = T w        ->  dT = dS w^T
    dw = (dS[..., None] * T).reshape(-1, w.shape[0]).sum(axis=0)   # dw = sum_(batch,t,s) dS_ts T_ts
    dP = dT * (1.0 - T * T)                       # T = tanh(P)    ->  dP = dT (1 - T^2)
    dHq = dP.sum(axis=-2)                         # P_ts = Hq_t + Hk_s: sum over keys s
    dHk = dP.sum(axis=-3)                         #                     sum over queries t
    dQ = dHq @ Wq.swapaxes(-1, -2)                # Hq = Q Wq      ->  dQ = dHq Wq^T
    dK = dHk @ Wk.swapaxes(-1, -2)                # Hk = K Wk      ->  dK = dHk Wk^T
    dWq = Q.swapaxes(-1, -2) @ dHq                #                ->  dWq = Q^T dHq (summed below)
    dWk = K.swapaxes(-1, -2) @ dHk                #                ->  dWk = K^T dHk
    return (unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape),
            unbroadcast(dWq, Wq.shape), unbroadcast(dWk, Wk.shape), dw)


@op("q: (..., n_q, d_q)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)", "Wq: (..., d_q, d_h)",
    "Wk: (..., d_k, d_h)", "w: (d_h,)", "mask: bool ~(..., n_q, n_k)?")
def additive_attention_forward(q, K, V, Wq, Wk, w, *, mask=None):
    """Additive (Bahdanau) attention (002 "Seq2seq meets attention"; Bahdanau et al. 2014).

        a_ts = w . tanh(q_t Wq + k_s Wk),   alpha_ts = softmax_s(a_ts),   c_t = sum_s alpha_ts v_s

    q: (..., n_q, d_q) decoder states h_t   K: (..., n_k, d_k) encoder states h'_s
    V: (..., n_k, d_v) values (for Bahdanau, V is K)   Wq: (d_q, d_h)   Wk: (d_k, d_h)
    w: (d_h,)   ->  c: (..., n_q, d_v)
    mask: boolean, broadcastable to (..., n_q, n_k), True = may attend (e.g. source padding);
    a query with no allowed key gets a zero context and zero gradients.

    cache keys: "V", "weights" (alpha, (..., n_q, n_k)), "scores" (the cache of
    :func:`additive_scores_forward`: "Q" (= q), "K", "Wq", "Wk", "w", "T" the tanh).
    """
    a, scores = additive_scores_forward(q, K, Wq, Wk, w)   # a_ts = w . tanh(q_t Wq + k_s Wk)
    A = masked_softmax(a, mask)                   # alpha_ts = softmax_s(a_ts)
    c = A @ V                                     # c_t = sum_s alpha_ts v_s
    return c, {"V": V, "weights": A, "scores": scores}


@backward_of(additive_attention_forward)
def additive_attention_backward(dout, cache):
    """Returns ``(dq, dK, dV, dWq, dWk, dw)``.

        dV = alpha^T dc,   d alpha = dc V^T,   da = alpha * (d alpha - rowsum(d alpha * alpha)),
        then the additive-score backward of ``da``.
    """
    A, V = cache["weights"], cache["V"]
    dV = A.swapaxes(-1, -2) @ dout                # c = alpha V    ->  dV = alpha^T dc
    dA = dout @ V.swapaxes(-1, -2)                #                ->  d alpha = dc V^T
    da = softmax_jvp(A, dA)                       # alpha = softmax(a)  ->  softmax JVP
    da = unbroadcast(da, cache["scores"]["T"].shape[:-1])   # to a's shape (V may add batch axes)
    dq, dK, dWq, dWk, dw = additive_scores_backward(da, cache["scores"])   # a = w . tanh(...)
    return dq, dK, unbroadcast(dV, V.shape), dWq, dWk, dw
