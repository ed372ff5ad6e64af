"""Memory-efficient attention: tiled (flash) attention, sliding-window masks, linear attention.

Covers 001 §2.1, "Sources of Inefficiency" (3. Memory Footprint: the scores of B sequences
and h heads form a (B, h, n, n) array) and "Strategies to Mitigate Inefficiency":

    flash attention   exact softmax attention, computed one (query block x key block) tile
                      at a time with a running row maximum and normaliser (Dao et al. 2022,
                      FlashAttention; loop order and backward as in FlashAttention-2). Memory
                      O(n d) plus one tile, never an n_q x n_k array (strategy 3).
    sliding window    a banded boolean mask, the simplest "limited attention" (strategy 1,
                      Longformer's local window, Mistral's sliding window). Use it with
                      attention_forward or flash_attention_forward.
    linear attention  softmax(q^T k) replaced by the kernel phi(q)^T phi(k), phi(x) = elu(x) + 1
                      (Katharopoulos et al. 2020, "Transformers are RNNs"), so Q K^T is never
                      formed (strategy 2).
"""
import numbers

import numpy as np

from .attention import additive_bias, unbroadcast
from .contract import backward_of, count, flag, op, optional, positive, real

__all__ = [
    "flash_attention_forward", "flash_attention_backward",
    "sliding_window_mask",
    "linear_attention_forward", "linear_attention_backward",
]


# ---------------------------------------------------------------------------------------
# Flash attention
# ---------------------------------------------------------------------------------------

def _blocks(n, block_size):
    """The slices [0, B), [B, 2B), ... covering range(n); the last one may be shorter."""
    return [slice(s, min(s + block_size, n)) for s in range(0, n, block_size)]


def _tile(a, rows, cols):
    """The (rows, cols) tile of a mask or bias broadcastable to (..., n_q, n_k).

    An axis of size 1 is broadcast, so it is kept whole; the result is a view (a padding
    mask (B, 1, 1, n_k) is never expanded to its full shape).
    """
    a = a.reshape((1,) * (2 - a.ndim) + a.shape) if a.ndim < 2 else a   # (n_k,) -> (1, n_k)
    whole = slice(None)
    return a[..., rows if a.shape[-2] > 1 else whole, cols if a.shape[-1] > 1 else whole]


def _score_tile(Q_i, K_j, mask, bias, rows, cols, scale):
    """S_ij = Q_i K_j^T * scale + M_ij: one (b_q, b_k) tile of the scores, -inf where masked."""
    S = Q_i @ K_j.swapaxes(-1, -2) * scale         # Q_i K_j^T / sqrt(d_k)
    if bias is not None:
        S = S + _tile(bias, rows, cols)             # + M_ij  (finite + (-inf) = -inf)
    if mask is not None:
        S = np.where(_tile(mask, rows, cols), S, -np.inf)   # masked score: exp(-inf) = 0
    return S


@op("Q: (..., n_q, d_k)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)",
    "mask: bool ~(..., n_q, n_k)?", "bias: ~(..., n_q, n_k)?",
    bias=additive_bias, scale=optional(real), block_size=count)
def flash_attention_forward(Q, K, V, *, mask=None, bias=None, scale=None, block_size=128):
    """Scaled dot-product attention computed tile by tile (001 §2.1 "Memory-Efficient
    Implementations"; Dao et al. 2022, FlashAttention-2 loop order).

    The same result as :func:`attention_forward`,

        out = softmax(Q K^T * scale + M) V,

    without ever holding the (..., n_q, n_k) scores. For each block of queries i the key
    blocks j are visited in turn, keeping per query row a running maximum m, a running
    normaliser l and an unnormalised output o:

        S_ij = Q_i K_j^T * scale + M_ij                  (one b_q x b_k tile)
        m'   = max(m, rowmax(S_ij))
        l    = exp(m - m') l + rowsum(exp(S_ij - m'))
        o    = exp(m - m') o + exp(S_ij - m') V_j
        out_i = o / l,   L_i = m + log(l)                 (the row's log-sum-exp)

    Rescaling by exp(m - m') makes the result exact (not an approximation): every term ends
    up divided by the same exp(max) as in the ordinary max-subtracted softmax.

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)

    mask, bias, scale: exactly as in :func:`attention_forward` (mask boolean, True = may
        attend; bias additive, -inf acts as False; scale defaults to 1/sqrt(d_k)). Both are
        sliced per tile and never broadcast to the full score shape. A query row with no
        allowed key gives a zero output row and zero gradients (its L is -inf).
    block_size: rows per query block and keys per key block (the last block may be smaller).

    Memory: the inputs, the output, L and O(batch * block_size^2) for one tile.

    cache keys: "Q", "K", "V", "out", "lse" (L, shape (..., n_q, 1)), "mask", "bias",
    "scale", "block_size". Unlike attention_forward there is NO "weights" entry: not
    storing the n_q x n_k weights is the point. Row i of the weights is exp(S_i - L_i); to
    plot them, call attention_forward on a small input.
    """
    if scale is None:
        scale = Q.shape[-1] ** -0.5                 # 1 / sqrt(d_k)
    out, lse = [], []
    for rows in _blocks(Q.shape[-2], block_size):   # query block Q_i
        Q_i = Q[..., rows, :]
        m, l, o = -np.inf, 0.0, 0.0                 # running row maximum, normaliser, output
        for cols in _blocks(K.shape[-2], block_size):          # key block K_j, V_j
            S = _score_tile(Q_i, K[..., cols, :], mask, bias, rows, cols, scale)   # S_ij
            m_new = np.maximum(m, S.max(axis=-1, keepdims=True))   # m' = max(m, rowmax(S_ij))
            shift = np.where(m_new == -np.inf, 0.0, m_new)  # no allowed key yet: shift by 0
            P = np.exp(S - shift)                   # exp(S_ij - m')
            rescale = np.exp(m - shift)             # exp(m - m'): the old sums to the new maximum
            l = rescale * l + P.sum(axis=-1, keepdims=True)    # l = exp(m - m') l + rowsum(P)
            o = rescale * o + P @ V[..., cols, :]   # o = exp(m - m') o + P V_j
            m = m_new
        seen = l > 0                                # False only for a row with no allowed key
        l = np.where(seen, l, 1.0)                  # an empty row: o = 0, so out = 0 / 1 = 0
        out.append(o / l)                           # out_i = o / l
        lse.append(np.where(seen, m + np.log(l), -np.inf))     # L_i = m + log(l)
    out, lse = np.concatenate(out, axis=-2), np.concatenate(lse, axis=-2)
    return out, {"Q": Q, "K": K, "V": V, "out": out, "lse": lse, "mask": mask, "bias": bias,
                 "scale": scale, "block_size": block_size}


@backward_of(flash_attention_forward)
def flash_attention_backward(dout, cache):
    """Backward of :func:`flash_attention_forward`: returns ``(dQ, dK, dV)``.

    The weights are recomputed tile by tile from the stored log-sum-exp L, never stored:

        D_i   = rowsum(dO_i * O_i)                 (= sum_j P_ij dP_ij over ALL keys)
        S_ij  = Q_i K_j^T * scale + M_ij,   P_ij = exp(S_ij - L_i)
        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T
        dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += dS_ij K_j * scale,   dK_j += dS_ij^T Q_i * scale

    D_i replaces the row sum of the softmax Jacobian-vector product, which would otherwise
    need the whole row of dP at once.
    """
    Q, K, V, out, lse = cache["Q"], cache["K"], cache["V"], cache["out"], cache["lse"]
    mask, bias, scale = cache["mask"], cache["bias"], cache["scale"]
    block_size = cache["block_size"]
    D = (dout * out).sum(axis=-1, keepdims=True)    # D_i = rowsum(dO_i * O_i)
    L = np.where(lse == -np.inf, np.inf, lse)       # an empty row: exp(-inf - inf) = 0, no NaN
    batch = out.shape[:-2]                          # the broadcast leading axes of Q, K, V
    dQ = np.zeros_like(Q, shape=batch + Q.shape[-2:])
    dK = np.zeros_like(K, shape=batch + K.shape[-2:])
    dV = np.zeros_like(V, shape=batch + V.shape[-2:])
    for cols in _blocks(K.shape[-2], block_size):   # key block K_j, V_j
        K_j, V_j = K[..., cols, :], V[..., cols, :]
        for rows in _blocks(Q.shape[-2], block_size):          # query block Q_i
            Q_i, dO_i = Q[..., rows, :], dout[..., rows, :]
            S = _score_tile(Q_i, K_j, mask, bias, rows, cols, scale)   # S_ij, recomputed
            P = np.exp(S - L[..., rows, :])         # P_ij = exp(S_ij - L_i): the tile's weights
            dV[..., cols, :] += P.swapaxes(-1, -2) @ dO_i      # out = P V   ->  dV_j += P_ij^T dO_i
            dP = dO_i @ V_j.swapaxes(-1, -2)        #                          dP_ij = dO_i V_j^T
            dS = P * (dP - D[..., rows, :])         # softmax JVP, rowsum(P * dP) = D_i
            dQ[..., rows, :] += dS @ K_j * scale   # S = Q K^T scale  ->  dQ_i += dS_ij K_j scale
            dK[..., cols, :] += dS.swapaxes(-1, -2) @ Q_i * scale   #  dK_j += dS_ij^T Q_i scale
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)


# ---------------------------------------------------------------------------------------
# Sliding-window (local) attention
# ---------------------------------------------------------------------------------------

def sliding_window_mask(n_q, n_k=None, *, window, causal=True):
    """Boolean sliding-window (local attention) mask (001 §2.1 "Sparse or Limited Attention").

        causal=True:   mask[i, j] = p_i - window <= j <= p_i
        causal=False:  mask[i, j] = |j - p_i| <= window,       p_i = (n_k - n_q) + i

    Query ``i`` sits at absolute position ``p_i`` (as in :func:`causal_mask`, so a KV-cached
    step with n_q < n_k works). Causally a query sees itself and the ``window`` keys before
    it (window + 1 keys, fewer at the start); ``window >= n_k - 1`` gives ``causal_mask``.
    ``causal=False`` gives the symmetric band of width 2 * window + 1.

    Returns a bool array of shape (n_q, n_k) (``n_k`` defaults to ``n_q``, must be >= n_q),
    for the ``mask`` of :func:`attention_forward` or :func:`flash_attention_forward`.
    """
    where = "sliding_window_mask"
    n_q = count(n_q, "n_q", where)
    n_k = n_q if n_k is None else count(n_k, "n_k", where)
    if n_k < n_q:
        raise ValueError(f"{where}: n_k is {n_k} but n_q is {n_q}; expected n_k >= n_q (the "
                         "queries are the last n_q of the n_k positions)")
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, numbers.Integral):
        raise TypeError(f"{where}: window is {window!r}; expected a non-negative integer")
    if window < 0:
        raise ValueError(f"{where}: window is {window}; expected a non-negative integer")
    causal = flag(causal, "causal", where)
    p = (n_k - n_q) + np.arange(n_q)[:, None]      # absolute position of each query
    j = np.arange(n_k)[None, :]
    upper = p if causal else p + int(window)
    return (j >= p - int(window)) & (j <= upper)


# ---------------------------------------------------------------------------------------
# Linear attention
# ---------------------------------------------------------------------------------------

def _phi(x):
    """phi(x) = elu(x) + 1 = x + 1 for x > 0, exp(x) for x <= 0 (always > 0)."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # min: no overflow warning


def _phi_grad(x):
    """phi'(x) = 1 for x > 0, exp(x) for x <= 0."""
    return np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0)))


def _reverse_cumsum(x, axis):
    """y_j = sum_{p >= j} x_p along ``axis`` (the backward of a cumulative sum)."""
    return np.flip(np.cumsum(np.flip(x, axis), axis), axis)


def _causal_option(causal, name, where, args):
    """True or False; causal linear attention needs n_k >= n_q (the queries are the last
    n_q of the n_k positions)."""
    causal = flag(causal, name, where)
    n_q, n_k = args["Q"].shape[-2], args["K"].shape[-2]
    if causal and n_k < n_q:
        raise ValueError(f"{where}: K has {n_k} positions but Q has {n_q}; causal linear attention "
                         "expects n_k >= n_q (the queries are the last n_q positions)")
    return causal


@op("Q: (..., n_q, d_k)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)",
    causal=_causal_option, eps=positive)
def linear_attention_forward(Q, K, V, *, causal=False, eps=1e-6):
    """Linear attention (001 §2.1 "Linear Attention"; Katharopoulos et al. 2020).

    The softmax similarity exp(q^T k) is replaced by phi(q)^T phi(k), phi(x) = elu(x) + 1,
    so the sum over keys can be taken before the queries come in:

        non-causal:  out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),
                     S = sum_j phi(k_j) v_j^T  (d_k, d_v),   z = sum_j phi(k_j)  (d_k,)
        causal:      the same with prefix sums up to the query's position p_i = n_k - n_q + i,
                     S_i = sum_{j <= p_i} phi(k_j) v_j^T,   z_i = sum_{j <= p_i} phi(k_j)

    Cost O(n d_k d_v) instead of O(n^2 d). This is out_i = sum_j a_ij v_j with weights
    a_ij = phi(q_i)^T phi(k_j) / sum_l phi(q_i)^T phi(k_l), which are positive, but are NOT
    the softmax weights: linear attention is a different model, not an approximation of
    attention_forward.

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)
    causal: use the prefix sums (needs n_k >= n_q). This reference builds all n_k prefix
        states S_i at once with a cumulative sum, memory O(n d_k d_v) per batch item; a
        recurrent implementation keeps only the current one (the "RNN" view of the paper).
    eps: added to the normaliser (as in the paper's code), > 0.

    cache keys: "Q", "K", "V", "phi_Q", "phi_K", "S" ((..., d_k, d_v), or (..., n_q, d_k,
    d_v) when causal), "z" ((..., 1, d_k), or (..., n_q, d_k) when causal), "den"
    ((..., n_q, 1)), "out", "causal".
    """
    phi_Q, phi_K = _phi(Q), _phi(K)                 # phi(x) = elu(x) + 1
    if causal:
        first = K.shape[-2] - Q.shape[-2]           # position p_0 of query 0
        S = np.cumsum(phi_K[..., :, :, None] * V[..., :, None, :], axis=-3)[..., first:, :, :]
        #                                             S_i = sum_{j <= p_i} phi(k_j) v_j^T
        z = np.cumsum(phi_K, axis=-2)[..., first:, :]      # z_i = sum_{j <= p_i} phi(k_j)
        num = np.einsum("...id,...ide->...ie", phi_Q, S)   # phi(q_i)^T S_i
    else:
        S = phi_K.swapaxes(-1, -2) @ V              # (..., d_k, d_v)  S = sum_j phi(k_j) v_j^T
        z = phi_K.sum(axis=-2, keepdims=True)       # (..., 1, d_k)    z = sum_j phi(k_j)
        num = phi_Q @ S                             # phi(q_i)^T S
    den = (phi_Q * z).sum(axis=-1, keepdims=True) + eps    # phi(q_i)^T z_i + eps
    out = num / den
    return out, {"Q": Q, "K": K, "V": V, "phi_Q": phi_Q, "phi_K": phi_K, "S": S, "z": z,
                 "den": den, "out": out, "causal": causal}


@backward_of(linear_attention_forward)
def linear_attention_backward(dout, cache):
    """Backward of :func:`linear_attention_forward`: returns ``(dQ, dK, dV)``.

        out = num / den        ->  dnum = dout / den,   dden = -rowsum(dout * out) / den
        num_i = phi_Q_i S_i    ->  dphi_Q_i = S_i dnum_i + dden_i z_i,   dS_i = phi_Q_i^T dnum_i
        den_i = phi_Q_i . z_i  ->  dz_i = dden_i phi_Q_i
        S = sum_j phi_K_j v_j^T, z = sum_j phi_K_j  (causal: prefix sums, so key j collects
            the dS_i, dz_i of every query at a position >= j: a reversed cumulative sum)
                               ->  dphi_K_j = dS v_j + dz,   dv_j = dS^T phi_K_j
        phi = elu + 1          ->  dQ = dphi_Q * phi'(Q),    dK = dphi_K * phi'(K)
    """
    Q, K, V, phi_Q, phi_K = (cache[k] for k in ("Q", "K", "V", "phi_Q", "phi_K"))
    S, z, den, out = (cache[k] for k in ("S", "z", "den", "out"))
    dnum = dout / den                                           # out = num / den
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den      # d(1/den) = -1/den^2, num/den = out
    if cache["causal"]:
        first = K.shape[-2] - Q.shape[-2]
        dphi_Q = np.einsum("...ide,...ie->...id", S, dnum) + dden * z   # num_i = phi_Q_i S_i
        dS = phi_Q[..., :, :, None] * dnum[..., :, None, :]     # (..., n_q, d_k, d_v): outer products
        dz = dden * phi_Q                                       # (..., n_q, d_k)
        # keys before the first query position get zero gradients (padding); then the
        # reversed cumulative sum gives key j the sum over all queries at positions >= j
        pad = [(0, 0)] * (dS.ndim - 3)
        dS = _reverse_cumsum(np.pad(dS, pad + [(first, 0), (0, 0), (0, 0)]), axis=-3)
        dz = _reverse_cumsum(np.pad(dz, pad + [(first, 0), (0, 0)]), axis=-2)
        dphi_K = np.einsum("...jde,...je->...jd", dS, V) + dz  # S += phi_K_j v_j^T, z += phi_K_j
        dV = np.einsum("...jde,...jd->...je", dS, phi_K)
    else:
        dphi_Q = dnum @ S.swapaxes(-1, -2) + dden * z           # num = phi_Q S, den = phi_Q z^T
        dS = phi_Q.swapaxes(-1, -2) @ dnum                      # (..., d_k, d_v)
        dz = (dden * phi_Q).sum(axis=-2, keepdims=True)         # (..., 1, d_k)
        dphi_K = V @ dS.swapaxes(-1, -2) + dz                   # S = phi_K^T V, z = sum_j phi_K_j
        dV = phi_K @ dS
    dQ = dphi_Q * _phi_grad(Q)                                  # phi = elu + 1
    dK = dphi_K * _phi_grad(K)
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)
