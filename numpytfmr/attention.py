"""Scaled dot-product attention, masks and the masked softmax they share.

Covers 003 §5.1 (the worked example), §5.1.1 (self-attention), §5.1.2 (masked attention),
§6.2 (a KV-cached step: causal mask with n_q < n_k), 000 §2.1, 002 "Dot product
attention" and "Future masking", 004 "Future masking" (eq. 21) and "Cross-attention".

    A = softmax(Q K^T * scale + M),   out = A V,   scale = 1/sqrt(d_k) by default

The masked entries of ``A`` are exactly 0, and a query with no key it may attend to gets
a zero row of ``A`` (and so a zero output and zero gradients) rather than 0/0.
"""
import numpy as np

from . import _validate as v

__all__ = ["attention_forward", "attention_backward", "causal_mask", "padding_mask"]


# ---------------------------------------------------------------------------------------
# Shared pieces (also used by scoring.py and mha.py)
# ---------------------------------------------------------------------------------------

def _check_broadcast(shape, name, where, target):
    """Raise unless an array of ``shape`` broadcasts to ``target`` without enlarging it."""
    target = tuple(target)
    try:
        ok = np.broadcast_shapes(tuple(shape), target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{where}: {name} has shape {tuple(shape)}, which does not broadcast to "
                         f"the scores' shape {target}; expected a shape broadcastable to it")


def _unbroadcast(g, shape):
    """Sum ``g`` over the axes that broadcasting added or stretched, back to ``shape``.

    The backward of ``y = f(broadcast(x))``: a broadcast input received the same value in
    every stretched position, so its gradient is the sum over those positions.
    """
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g


def _allowed(mask, bias, where, scores_shape):
    """The boolean "may attend" array (or None when every key is allowed).

    A key is allowed where ``mask`` is True and ``bias`` is not -inf (the notes' M).
    """
    allowed = None
    if mask is not None:
        allowed = v.bool_mask(mask, "mask", where, scores_shape)
    if bias is not None and np.isneginf(bias).any():
        finite = ~np.isneginf(bias)
        allowed = finite if allowed is None else allowed & finite
    return allowed


def _T(x):
    """Swap the last two axes (matrix transpose of every batch item, a view)."""
    return np.swapaxes(x, -1, -2)


def _full_shape(S, other):
    """S itself when ``other`` broadcasts to S's shape, else a new copy of S broadcast to the
    common shape (a mask or bias may carry batch axes the scores lack, e.g. from V; the
    in-place updates that follow need the full shape)."""
    shape = np.broadcast_shapes(S.shape, other.shape)
    return S if shape == S.shape else np.broadcast_to(S, shape).copy()


def _masked_softmax(S, allowed):
    """Row softmax over the last axis, restricted to ``allowed`` keys (003 §5.1.2).

        A_ij = exp(S_ij - m_i) / sum_{l allowed} exp(S_il - m_i)  for allowed j, else 0

    ``m_i`` is the row maximum over the allowed keys, so nothing overflows. A row with no
    allowed key would be 0/0; it is set to zeros instead. No -inf is ever subtracted from
    -inf, so no NaN and no RuntimeWarning appear.

    S is overwritten with A and returned: every caller passes its own fresh score array,
    and working in place saves four temporaries of the size of the scores. (A mask with
    more batch axes than S gives a new, larger A.)
    """
    if allowed is not None:
        S = _full_shape(S, allowed)
        np.copyto(S, -np.inf, where=~allowed)    # masked keys: exp(-inf) = 0 exactly
    m = np.max(S, axis=-1, keepdims=True)
    if allowed is not None:
        m[m == -np.inf] = 0.0                    # row with no allowed key: any finite shift works
    S -= m
    np.exp(S, out=S)
    denom = np.einsum("...j->...", S)[..., None]  # row sums (einsum: fast for short rows)
    if allowed is not None:
        denom[denom == 0.0] = 1.0                # empty row: 0 / 1 = 0
    S *= np.reciprocal(denom)                    # one division per row, then products
    return S


def _softmax_backward(dA, A):
    """dS = A * (dA - sum_j(dA * A))  softmax Jacobian-vector product (rows of zeros stay 0).

    dA is overwritten with dS and returned (every caller passes its own fresh dA); the
    row sums come from einsum, without a temporary of the size of A.
    """
    rowsum = np.einsum("...ij,...ij->...i", dA, A)[..., None]
    dA -= rowsum
    dA *= A
    return dA


def _check_dout(dout, cache, where):
    """``dout`` as an array of the forward output's shape, in the forward's dtype."""
    dout = np.asarray(dout)
    if dout.shape != cache["out_shape"]:
        raise ValueError(f"{where}: dout has shape {dout.shape}; expected the forward output's "
                         f"shape {cache['out_shape']}")
    return dout.astype(cache["dtype"], copy=False)


def _values_batch(Q, K, V, where, q_name="Q"):
    """Check one value per key (V's n_k = K's n_k); return the broadcast leading (batch) shape."""
    if V.shape[-2] != K.shape[-2]:
        raise ValueError(f"{where}: V has shape {V.shape} but K has shape {K.shape}; the "
                         "second-to-last axes (n_k, one value per key) must match")
    try:
        return np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    except ValueError:
        raise ValueError(f"{where}: the leading (batch) axes of {q_name} {Q.shape}, K {K.shape} "
                         f"and V {V.shape} do not broadcast against each other") from None


def _qkv(Q, K, V, where):
    """Validate Q (..., n_q, d_k), K (..., n_k, d_k), V (..., n_k, d_v) (shared by attention_forward and efficient.py).

    Returns Q, K, V in the result dtype, the broadcast batch shape and that dtype.
    """
    Q = v.float_array(Q, "Q", where)
    K = v.float_array(K, "K", where)
    V = v.float_array(V, "V", where)
    v.min_ndim(Q, 2, "Q", where, "(..., n_q, d_k)")
    v.min_ndim(K, 2, "K", where, "(..., n_k, d_k)")
    v.min_ndim(V, 2, "V", where, "(..., n_k, d_v)")
    v.same_last_dim(Q, K, "Q", "K", where, "d_k")
    batch = _values_batch(Q, K, V, where)
    dt = v.result_dtype(Q, K, V)
    return (*(a.astype(dt, copy=False) for a in (Q, K, V)), batch, dt)


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
    n_q = v.positive_int(n_q, "n_q", where)
    n_k = n_q if n_k is None else v.positive_int(n_k, "n_k", where)
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
    n_k = v.positive_int(n_k, "n_k", where)
    lengths = v.int_array(lengths, "lengths", where, low=0, high=n_k + 1)
    return np.arange(n_k) < lengths[..., None, None]


# ---------------------------------------------------------------------------------------
# Scaled dot-product attention
# ---------------------------------------------------------------------------------------

def attention_forward(Q, K, V, *, mask=None, bias=None, scale=None):
    """Scaled dot-product attention (003 §5.1.1-5.1.2, 000 §2.1.1-2.1.2, 002, 004 eq. 8).

        S = Q K^T * scale + M,   A = softmax(S) row-wise (masked),   out = A V

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)

    The leading axes of Q, K and V broadcast against each other (so one set of keys can
    serve a group of query heads, as in grouped-query attention); the backward sums the
    gradient of a broadcast input back to its shape.

    scale: defaults to 1/sqrt(d_k); a softmax temperature tau (003 §5.1.1) is scale=1/tau.
    mask:  boolean, broadcastable to (..., n_q, n_k); True = may attend (``causal_mask``,
           ``padding_mask``). Masked weights are exactly 0.
    bias:  additive float scores, broadcastable to (..., n_q, n_k): the notes' M (0 or
           -inf), or an ALiBi bias. -inf entries act like False in ``mask``. It is cast
           to the dtype of Q, K, V (a float64 bias never upcasts float32 attention).
    A query row with no allowed key gets zero weights, a zero output and zero gradients.

    cache keys: "Q", "K", "V" (cast to the result dtype), "weights" (A, shape
    (..., n_q, n_k)), "scale", "dtype", "out_shape".
    """
    where = "attention_forward"
    Q, K, V, batch, dt = _qkv(Q, K, V, where)
    scores_shape = batch + (Q.shape[-2], K.shape[-2])
    bias = v.optional_float_array(bias, "bias", where)
    # bias is an option: it takes the dtype of Q, K, V
    if bias is not None:
        _check_broadcast(bias.shape, "bias", where, scores_shape)
        if np.isnan(bias).any() or np.isposinf(bias).any():
            raise ValueError(f"{where}: bias contains NaN or +inf; expected finite values or -inf")
        bias = bias.astype(dt, copy=False)
    d_k = Q.shape[-1]
    scale = 1.0 / np.sqrt(d_k) if scale is None else v.number(scale, "scale", where)
    scale = float(scale)  # a Python float never upcasts float32
    allowed = _allowed(mask, bias, where, scores_shape)

    # (..., n_q, n_k) scaled scores; scaling the (n_q, d_k) queries rather than the
    # (n_q, n_k) scores takes fewer multiplications whenever n_k > d_k, as usual.
    # S is computed as (K Q^T)^T: the same numbers, stored key by key ("column-major"), so
    # that the softmax's maximum over the keys of each query runs as a vectorized maximum
    # of whole rows of memory instead of one short reduction per query (3x faster).
    S = _T(K @ _T(Q * scale))
    if bias is not None:
        S = _full_shape(S, bias)
        S += bias                                  # finite + (-inf) = -inf: no warning
    A = _masked_softmax(S, allowed)                # (..., n_q, n_k) attention weights
    out = A @ V                                    # (..., n_q, d_v) weighted sum of values
    cache = {"Q": Q, "K": K, "V": V, "weights": A, "scale": scale,
             "dtype": dt, "out_shape": out.shape}
    return out, cache


def attention_backward(dout, cache):
    """Backward of :func:`attention_forward`: returns ``(dQ, dK, dV)``.

        dV = A^T dout,   dA = dout V^T,   dS = A * (dA - rowsum(dA * A)),
        dQ = scale * dS K,   dK = scale * dS^T Q

    Masked weights are 0, so masked scores and empty rows get a zero gradient.
    """
    dout = _check_dout(dout, cache, "attention_backward")
    Q, K, V, A, scale = cache["Q"], cache["K"], cache["V"], cache["weights"], cache["scale"]
    dV = _T(A) @ dout                             # out = A V      ->  dV = A^T dout
    dA = _T(V @ _T(dout))                         # out = A V      ->  dA = dout V^T
    #   (computed transposed, so that dA has the memory layout of A: see attention_forward)
    dS = _softmax_backward(dA, A)                 # A = softmax(S) ->  softmax JVP
    dQ = dS @ K                                   # S = Q K^T scale -> dQ = dS K scale
    dQ *= scale                                   #   (in place on the new products)
    dK = _T(dS) @ Q                               #                 -> dK = dS^T Q scale
    dK *= scale
    return (_unbroadcast(dQ, Q.shape), _unbroadcast(dK, K.shape), _unbroadcast(dV, V.shape))
