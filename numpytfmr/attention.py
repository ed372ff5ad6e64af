"""Scaled dot-product attention, masks and the masked softmax they share.

Covers 003 §5.1 (the worked example), §5.1.1 (self-attention), §5.1.2 (masked attention),
§6.2 (a KV-cached step: causal mask with `n_q < n_k`), 000 §2.1, 002 "Dot product
attention" and "Future masking", 004 "Future masking" (eq. 21) and "Cross-attention".

    A = softmax(Q K^T * scale + M),   out = A V,   scale = 1/sqrt(d_k) by default

The masked entries of ``A`` are exactly 0, and a query with no key it may attend to gets
a zero row of ``A`` (and so a zero output and zero gradients) rather than 0/0.

Shared pieces, public for scoring.py, mha.py and efficient.py (not in ``__all__``):
``masked_softmax``, ``softmax_jvp``, ``unbroadcast`` and the ``additive_bias`` validator.
"""
import numpy as np

from .contract import backward_of, count, int_array, op, optional, real

__all__ = ["attention_forward", "attention_backward", "causal_mask", "padding_mask"]


# ---------------------------------------------------------------------------------------
# Shared pieces (also used by scoring.py, mha.py and efficient.py)
# ---------------------------------------------------------------------------------------

def masked_softmax(S, allowed=None):
    """Row softmax over the last axis, restricted to the ``allowed`` keys (003 §5.1.2).

        A_ij = exp(S_ij - m_i) / sum_{l allowed} exp(S_il - m_i)  for allowed j, else 0

    ``allowed``: None (every key) or a boolean array broadcastable against S (True = may
    attend); a score of -inf (the notes' M) is not allowed either. ``m_i`` is the row
    maximum over the allowed keys, so nothing overflows. A row with no allowed key would
    be 0/0: it gets zeros instead, without NaN or RuntimeWarning (-inf is never
    subtracted from -inf).
    """
    if allowed is not None:
        S = np.where(allowed, S, -np.inf)           # masked score: exp(-inf) = 0 exactly
    m = S.max(axis=-1, keepdims=True)               # m_i, the row maximum
    m = np.where(m == -np.inf, 0.0, m)              # a row with no allowed key: shift by 0
    E = np.exp(S - m)                               # exp(S_ij - m_i)
    Z = E.sum(axis=-1, keepdims=True)               # sum_l exp(S_il - m_i)
    return E / np.where(Z == 0.0, 1.0, Z)           # A_ij  (an empty row: 0 / 1 = 0)


def softmax_jvp(A, dA):
    """Backward of a (masked) row softmax: `dS = A * (dA - sum_j(dA * A))`.

    The softmax Jacobian `dA_ij/dS_il = A_ij (delta_jl - A_il)` applied to the upstream
    gradient `dA`; masked weights (`A = 0`) and empty rows get a zero gradient.
    """
    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))


def unbroadcast(g, shape):
    """Sum ``g`` over the axes that broadcasting added or stretched, back to ``shape``.

    The backward of ``y = f(broadcast(x))``: a broadcast input received the same value in
    every stretched position, so its gradient is the sum over those positions.
    """
    added = tuple(range(g.ndim - len(shape)))                       # leading axes x lacked
    g = g.sum(axis=added)
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True)                      # axes of size 1 in x


def additive_bias(bias, name, where, args=None):
    """An additive score bias: holds finite numbers or -inf (-inf: may not attend)."""
    if bias is not None and (np.isnan(bias).any() or np.isposinf(bias).any()):
        raise ValueError(f"{where}: {name} contains NaN or +inf; expected finite values or -inf")
    return bias


# ---------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------

def causal_mask(n_q, n_k=None):
    """Boolean future mask (003 §5.1.2, 002 "Future masking", 004 eq. 21).

        mask[i, j] = j <= (n_k - n_q) + i        (True = may attend)

    Query ``i`` sits at absolute position ``n_k - n_q + i``: with ``n_k = n_q`` this is the
    lower-triangular mask of training; with ``n_q = 1`` and ``n_k = t + 1`` it is the single
    row of a KV-cached decoding step (003 §6.2), which sees every key.

    Returns a bool array of shape (n_q, n_k); ``n_k`` defaults to ``n_q`` and must be >= n_q.
    """
    where = "causal_mask"
    n_q = count(n_q, "n_q", where)
    n_k = n_q if n_k is None else count(n_k, "n_k", where)
    if n_k < n_q:
        raise ValueError(f"{where}: n_k is {n_k} but n_q is {n_q}; expected n_k >= n_q (the queries "
                         "are the last n_q of the n_k positions)")
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= (n_k - n_q) + i


def padding_mask(lengths, n_k):
    """Key-padding mask: key ``j`` of sequence ``b`` is real when ``j < lengths[b]``.

        mask[b, 0, j] = j < lengths[b]

    lengths: integer array of shape (...) with values in [0, n_k]
    returns: bool array of shape (..., 1, n_k), which broadcasts against scores
             (..., n_q, n_k). For multi-head scores (B, n_heads, n_q, n_k) pass
             ``lengths[:, None]`` to get (B, 1, 1, n_k). Combine with a causal mask by ``&``.
    """
    where = "padding_mask"
    n_k = count(n_k, "n_k", where)
    lengths = int_array(lengths, "lengths", where, low=0, high=n_k + 1)
    return np.arange(n_k) < lengths[..., None, None]


# ---------------------------------------------------------------------------------------
# Scaled dot-product attention
# ---------------------------------------------------------------------------------------

@op("Q: (..., n_q, d_k)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)",
    "mask: bool ~(..., n_q, n_k)?", "bias: ~(..., n_q, n_k)?",
    bias=additive_bias, scale=optional(real))
def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    """Scaled dot-product attention (003 §5.1.1-5.1.2, 000 §2.1.1-2.1.2, 002, 004 eq. 8).

        S = Q K^T * scale + M,   A = softmax(S) row-wise (masked),   out = A V

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)

    The leading axes of Q, K and V broadcast against each other (so one set of keys can
    serve a group of query heads, as in grouped-query attention); the backward sums the
    gradient of a broadcast input back to its shape.

    scale: defaults to `1/sqrt(d_k)`; a softmax temperature `tau` (003 §5.1.1) is `scale = 1/tau`.
    mask:  boolean, broadcastable to (..., n_q, n_k); True = may attend (``causal_mask``,
           ``padding_mask``). Masked weights are exactly 0.
    bias:  additive float scores, broadcastable to (..., n_q, n_k): the notes' M (0 or
           -inf), or an ALiBi bias. -inf entries act like False in ``mask``; NaN and +inf
           are refused. It takes the dtype of Q, K, V (a float64 bias never upcasts
           float32 attention).
    A query row with no allowed key gets zero weights, a zero output and zero gradients.

    cache keys: "Q", "K", "V", "weights" (A, shape (..., n_q, n_k)), "scale".
    """
    if scale is None:
        scale = Q.shape[-1] ** -0.5                 # 1 / sqrt(d_k)
    S = Q @ K.swapaxes(-1, -2) * scale              # S = Q K^T / sqrt(d_k)    (003 §5.1.1)
    if bias is not None:
        S = S + bias                                #     + M                  (003 §5.1.2)
    A = masked_softmax(S, mask)                     # A = softmax(S), masked weights 0
    out = A @ V                                     # out = A V
    return out, {"Q": Q, "K": K, "V": V, "weights": A, "scale": scale}


@backward_of(attention_forward)
def attention_backward(dout, cache):
    """Backward of :func:`attention_forward`: returns ``(dQ, dK, dV)``.

        dV = A^T dout,   dA = dout V^T,   dS = A * (dA - rowsum(dA * A)),
        dQ = dS K * scale,   dK = dS^T Q * scale

    Masked weights are 0, so masked scores and empty rows get a zero gradient. A
    broadcast input's gradient is summed back to its shape.
    """
    Q, K, V, A, scale = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["scale"]
    dV = A.swapaxes(-1, -2) @ dout                  # out = A V         ->  dV = A^T dout
    dA = dout @ V.swapaxes(-1, -2)                  #                   ->  dA = dout V^T
    dS = softmax_jvp(A, dA)                         # A = softmax(S)    ->  dS = A (dA - sum(dA A))
    dQ = dS @ K * scale                             # S = Q K^T scale   ->  dQ = dS K scale
    dK = dS.swapaxes(-1, -2) @ Q * scale            #                   ->  dK = dS^T Q scale
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)
