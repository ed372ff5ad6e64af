"""Memory-efficient attention: tiled (flash) attention, sliding-window masks, linear attention.

Covers 001 §2.1, "Sources of Inefficiency" (3. Memory Footprint: the scores of `B` sequences
and `h` heads form a (B, h, n, n) array) and "Strategies to Mitigate Inefficiency":

- flash attention: exact softmax attention, computed one (query block x key block) tile at a
  time with a running row maximum and normaliser (Dao et al. 2022, FlashAttention; loop order
  and backward as in FlashAttention-2). Memory `O(n d)` plus one tile, never an
  `n_q x n_k` array (strategy 3).
- sliding window: the simplest "limited attention" (strategy 1, Longformer's local window,
  Mistral's sliding window): each query sees the ``window`` keys before it. As a banded
  boolean mask for ``attention_forward`` (``sliding_window_mask``), or computed band by band in
  `O(n window)` memory, with no `n x n` array (``sliding_window_attention_forward``).
- linear attention: `softmax(q^T k)` replaced by the kernel `phi(q)^T phi(k)`,
  `phi(x) = elu(x) + 1` (Katharopoulos et al. 2020, "Transformers are RNNs"), so `Q K^T` is
  never formed (strategy 2); causal, in chunks with a running state, memory `O(n d + d^2)`.
"""
import numbers

import numpy as np

from .attention import additive_bias, causal_mask, masked_softmax, softmax_jvp, unbroadcast
from .contract import backward_of, count, flag, op, optional, positive, real

__all__ = [
    "flash_attention_forward", "flash_attention_backward",
    "sliding_window_mask",
    "sliding_window_attention_forward", "sliding_window_attention_backward",
    "linear_attention_forward", "linear_attention_backward",
]


# ---------------------------------------------------------------------------------------
# Flash attention
# ---------------------------------------------------------------------------------------

def _blocks(n, block_size):
    """The slices `[0, B), [B, 2B), ...` covering ``range(n)``; the last one may be shorter."""
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
    """`S_ij = Q_i K_j^T * scale + M_ij`: one (b_q, b_k) tile of the scores, -inf where masked."""
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

    without ever holding the (..., n_q, n_k) scores. For each block of queries `i` the key
    blocks `j` are visited in turn, keeping per query row a running maximum `m`, a running
    normaliser `l` and an unnormalised output `o`:

        S_ij = Q_i K_j^T * scale + M_ij                  (one b_q x b_k tile)
        m'   = max(m, rowmax(S_ij))
        l    = exp(m - m') l + rowsum(exp(S_ij - m'))
        o    = exp(m - m') o + exp(S_ij - m') V_j
        out_i = o / l,   L_i = m + log(l)                 (the row's log-sum-exp)

    Rescaling by `exp(m - m')` makes the result exact (not an approximation): every term ends
    up divided by the same `exp(max)` as in the ordinary max-subtracted softmax.

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)

    mask, bias, scale: exactly as in :func:`attention_forward` (mask boolean, True = may
        attend; bias additive, -inf acts as False; scale defaults to 1/sqrt(d_k)). Both are
        sliced per tile and never broadcast to the full score shape. A query row with no
        allowed key gives a zero output row and zero gradients (its L is -inf).
    block_size: rows per query block and keys per key block (the last block may be smaller).

    Memory: the inputs, the output, `L` and `O(batch * block_size^2)` for one tile.

    cache keys: "Q", "K", "V", "out", "lse" (L, shape (..., n_q, 1)), "mask", "bias",
    "scale", "block_size". Unlike ``attention_forward`` there is NO "weights" entry: not
    storing the `n_q x n_k` weights is the point. Row `i` of the weights is `exp(S_i - L_i)`; to
    plot them, call ``attention_forward`` on a small input.
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

    The weights are recomputed tile by tile from the stored log-sum-exp `L`, never stored:

        D_i   = rowsum(dO_i * O_i)                 (= sum_j P_ij dP_ij over ALL keys)
        S_ij  = Q_i K_j^T * scale + M_ij,   P_ij = exp(S_ij - L_i)
        dV_j += P_ij^T dO_i
        dP_ij = dO_i V_j^T
        dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += dS_ij K_j * scale,   dK_j += dS_ij^T Q_i * scale

    `D_i` replaces the row sum of the softmax Jacobian-vector product, which would otherwise
    need the whole row of `dP` at once.
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
    step with `n_q < n_k` works). Causally a query sees itself and the ``window`` keys before
    it (`window + 1` keys, fewer at the start); ``window >= n_k - 1`` gives ``causal_mask``.
    ``causal=False`` gives the symmetric band of width `2 * window + 1`.

    Returns a bool array of shape (n_q, n_k) (``n_k`` defaults to ``n_q``, must be `>= n_q`),
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
# Sliding-window attention, computed band by band
# ---------------------------------------------------------------------------------------

def _window_option(window, name, where, args):
    """A non-negative integer (0: each query sees only its own position); the queries must be
    the last n_q of the n_k positions (n_k >= n_q), as in :func:`sliding_window_mask`."""
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, numbers.Integral):
        raise TypeError(f"{where}: {name} is {window!r}; expected a non-negative integer")
    if window < 0:
        raise ValueError(f"{where}: {name} is {window}; expected a non-negative integer")
    n_q, n_k = args["Q"].shape[-2], args["K"].shape[-2]
    if n_k < n_q:
        raise ValueError(f"{where}: K has {n_k} positions but Q has {n_q}; sliding-window "
                         "attention expects n_k >= n_q (the queries are the last n_q positions)")
    return int(window)


def _window_tiles(n_q, n_k, window, causal, block_size):
    """For each block of queries: (rows, cols, band). ``cols`` is the one range of keys the
    block's windows reach, ``band`` the (rows, cols) mask of ``sliding_window_mask`` on it:

        p_i - window <= j <= p_i   (causal),    |j - p_i| <= window   (causal=False)
    """
    first = n_k - n_q                               # p_i = first + i
    reach = 0 if causal else window                 # keys after the query's position
    tiles = []
    for rows in _blocks(n_q, block_size):
        cols = slice(max(0, first + rows.start - window), min(n_k, first + rows.stop + reach))
        p = first + np.arange(rows.start, rows.stop)[:, None]      # positions of the queries
        j = np.arange(cols.start, cols.stop)[None, :]               # positions of the keys
        tiles.append((rows, cols, (j >= p - window) & (j <= p + reach)))
    return tiles


@op("Q: (..., n_q, d_k)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)",
    window=_window_option, causal=flag, scale=optional(real), block_size=count)
def sliding_window_attention_forward(Q, K, V, *, window, causal=True, scale=None, block_size=128):
    """Sliding-window (local) attention without an `n_q x n_k` array (001 §2.1 "Sparse or
    Limited Attention"; Longformer's local window, Mistral's sliding window).

    The same result as ``attention_forward(Q, K, V, mask=sliding_window_mask(n_q, n_k,
    window=window, causal=causal), scale=scale)``:

        A = softmax(Q K^T * scale + M_window),   out = A V
        M_window[i, j] = 0 if p_i - window <= j <= p_i (causal; |j - p_i| <= window
                         otherwise), else -inf,    p_i = n_k - n_q + i

    but only the band is computed: the queries go in blocks of ``block_size``, and a block
    is scored against the keys its windows reach, at most `block_size + window` of them
    (`block_size + 2 window` when not causal). Each row's softmax is complete inside its
    tile, so no running maximum is needed (unlike flash attention).

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)
    window: keys each query sees before its own position (and after it, when not causal);
        needs n_k >= n_q. scale: defaults to 1/sqrt(d_k). Every query sees at least itself.

    Memory: `O(n_q (block_size + window))` for the band's weights, kept for the backward,
    instead of the `n_q n_k` of the dense mask and weights.

    cache keys: "Q", "K", "V", "band" (the weights of each query block, a list of arrays
    (..., rows, cols)), "window", "causal", "scale", "block_size".
    """
    if scale is None:
        scale = Q.shape[-1] ** -0.5                 # 1 / sqrt(d_k)
    out, band = [], []
    for rows, cols, allowed in _window_tiles(Q.shape[-2], K.shape[-2], window, causal, block_size):
        S = Q[..., rows, :] @ K[..., cols, :].swapaxes(-1, -2) * scale   # S = Q_i K_j^T scale
        A = masked_softmax(S, allowed)              # A = softmax(S + M_window) on the band
        out.append(A @ V[..., cols, :])             # out_i = A V_j
        band.append(A)
    out = np.concatenate(out, axis=-2)
    return out, {"Q": Q, "K": K, "V": V, "band": band, "window": window, "causal": causal,
                 "scale": scale, "block_size": block_size}


@backward_of(sliding_window_attention_forward)
def sliding_window_attention_backward(dout, cache):
    """Backward of :func:`sliding_window_attention_forward`: returns ``(dQ, dK, dV)``.

    ``attention_backward`` on each band tile, the key gradients of overlapping tiles summed:

        dV_j += A^T dO_i,   dA = dO_i V_j^T,   dS = A * (dA - rowsum(dA * A)),
        dQ_i = dS K_j * scale,   dK_j += dS^T Q_i * scale
    """
    Q, K, V, scale = cache["Q"], cache["K"], cache["V"], cache["scale"]
    batch = dout.shape[:-2]                         # the broadcast leading axes of Q, K, V
    dQ = np.zeros_like(Q, shape=batch + Q.shape[-2:])
    dK = np.zeros_like(K, shape=batch + K.shape[-2:])
    dV = np.zeros_like(V, shape=batch + V.shape[-2:])
    tiles = _window_tiles(Q.shape[-2], K.shape[-2], cache["window"], cache["causal"],
                          cache["block_size"])
    for (rows, cols, _), A in zip(tiles, cache["band"]):
        dO = dout[..., rows, :]
        dV[..., cols, :] += A.swapaxes(-1, -2) @ dO            # out = A V      ->  dV = A^T dO
        dA = dO @ V[..., cols, :].swapaxes(-1, -2)             #                ->  dA = dO V^T
        dS = softmax_jvp(A, dA)                                # A = softmax(S) ->  dS
        dQ[..., rows, :] = dS @ K[..., cols, :] * scale        # S = Q K^T scale -> dQ = dS K scale
        dK[..., cols, :] += dS.swapaxes(-1, -2) @ Q[..., rows, :] * scale   # dK = dS^T Q scale
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)


# ---------------------------------------------------------------------------------------
# Linear attention
# ---------------------------------------------------------------------------------------

def _phi(x):
    """`phi(x) = elu(x) + 1 = x + 1` for `x > 0`, `exp(x)` for `x <= 0` (always `> 0`)."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # min: no overflow warning


def _phi_grad(x):
    """`phi'(x) = 1` for `x > 0`, `exp(x)` for `x <= 0`."""
    return np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0)))


def _causal_option(causal, name, where, args):
    """True or False; causal linear attention needs n_k >= n_q (the queries are the last
    n_q of the n_k positions)."""
    causal = flag(causal, name, where)
    n_q, n_k = args["Q"].shape[-2], args["K"].shape[-2]
    if causal and n_k < n_q:
        raise ValueError(f"{where}: K has {n_k} positions but Q has {n_q}; causal linear attention "
                         "expects n_k >= n_q (the queries are the last n_q positions)")
    return causal


def _chunks(n_q, n_k, chunk_size):
    """(rows, keys, mask) per chunk of queries: queries ``rows`` sit at the key positions
    ``keys`` (`p_i = n_k - n_q + i`), and ``mask`` is the causal mask inside the chunk."""
    first = n_k - n_q
    return [(rows, slice(first + rows.start, first + rows.stop),
             causal_mask(rows.stop - rows.start)) for rows in _blocks(n_q, chunk_size)]


def _state_before(phi_K, V, n_q):
    """`S = sum_j phi(k_j) v_j^T` and `z = sum_j phi(k_j)` over the keys before the first query."""
    first = phi_K.shape[-2] - n_q
    S = phi_K[..., :first, :].swapaxes(-1, -2) @ V[..., :first, :]   # (..., d_k, d_v)
    z = phi_K[..., :first, :].sum(axis=-2, keepdims=True)            # (..., 1, d_k)
    return S, z


@op("Q: (..., n_q, d_k)", "K: (..., n_k, d_k)", "V: (..., n_k, d_v)",
    causal=_causal_option, eps=positive, chunk_size=count)
def linear_attention_forward(Q, K, V, *, causal=False, eps=1e-6, chunk_size=64):
    """Linear attention (001 §2.1 "Linear Attention"; Katharopoulos et al. 2020).

    The softmax similarity `exp(q^T k)` is replaced by `phi(q)^T phi(k)`, `phi(x) = elu(x) + 1`,
    so the sum over keys can be taken before the queries come in:

        non-causal:  out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),
                     S = sum_j phi(k_j) v_j^T  (d_k, d_v),   z = sum_j phi(k_j)  (d_k,)
        causal:      the same with prefix sums up to the query's position p_i = n_k - n_q + i,
                     S_i = sum_{j <= p_i} phi(k_j) v_j^T,   z_i = sum_{j <= p_i} phi(k_j)

    Cost `O(n d_k d_v)` instead of `O(n^2 d)`. This is `out_i = sum_j a_ij v_j` with weights
    `a_ij = phi(q_i)^T phi(k_j) / sum_l phi(q_i)^T phi(k_l)`, which are positive, but are NOT
    the softmax weights: linear attention is a different model, not an approximation of
    ``attention_forward``.

    Causal, in chunks of ``chunk_size`` queries (the "RNN" view of the paper, a chunk at a
    time): a running state `S, z` holds the keys before the chunk, and inside the chunk the
    few pairs `j <= i` are summed directly,

        num_i = phi(q_i)^T S + sum_{j in chunk, j <= p_i} a_ij v_j,   a_ij = phi(q_i)^T phi(k_j)
        den_i = phi(q_i)^T z + sum_{j in chunk, j <= p_i} a_ij + eps
        then  S += sum_{j in chunk} phi(k_j) v_j^T,   z += sum_{j in chunk} phi(k_j)

    so memory is `O(n d + d_k d_v + chunk_size^2)`, never one state per position.

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   V: (..., n_k, d_v)   ->  out: (..., n_q, d_v)
    causal: use the prefix sums (needs n_k >= n_q). eps: added to the normaliser (as in the
        paper's code), > 0. chunk_size: queries per chunk when causal (the result does not
        depend on it, up to rounding).

    cache keys: "Q", "K", "V", "phi_Q", "phi_K", "den" ((..., n_q, 1)), "out", "causal",
    "chunk_size"; non-causal also "S" ((..., d_k, d_v)) and "z" ((..., 1, d_k)).
    """
    phi_Q, phi_K = _phi(Q), _phi(K)                 # phi(x) = elu(x) + 1
    cache = {"Q": Q, "K": K, "V": V, "phi_Q": phi_Q, "phi_K": phi_K, "causal": causal,
             "chunk_size": chunk_size}
    if causal:
        S, z = _state_before(phi_K, V, Q.shape[-2])  # the keys before the first query
        num, den = [], []
        for rows, keys, mask in _chunks(Q.shape[-2], K.shape[-2], chunk_size):
            q, k, v = phi_Q[..., rows, :], phi_K[..., keys, :], V[..., keys, :]
            a = np.where(mask, q @ k.swapaxes(-1, -2), 0.0)   # a_ij, j <= i in the chunk
            num.append(q @ S + a @ v)                # phi(q_i)^T S + sum_j a_ij v_j
            den.append((q * z).sum(axis=-1, keepdims=True) + a.sum(axis=-1, keepdims=True))
            S = S + k.swapaxes(-1, -2) @ v           # S += sum_j phi(k_j) v_j^T
            z = z + k.sum(axis=-2, keepdims=True)    # z += sum_j phi(k_j)
        num, den = np.concatenate(num, axis=-2), np.concatenate(den, axis=-2) + eps
    else:
        S = phi_K.swapaxes(-1, -2) @ V              # (..., d_k, d_v)  S = sum_j phi(k_j) v_j^T
        z = phi_K.sum(axis=-2, keepdims=True)       # (..., 1, d_k)    z = sum_j phi(k_j)
        num = phi_Q @ S                             # phi(q_i)^T S
        den = (phi_Q * z).sum(axis=-1, keepdims=True) + eps    # phi(q_i)^T z + eps
        cache.update(S=S, z=z)
    out = num / den
    cache.update(den=den, out=out)
    return out, cache


def _causal_linear_backward(dnum, dden, cache):
    """`dphi_Q, dphi_K, dV` of causal linear attention, chunk by chunk (see the backward)."""
    phi_Q, phi_K, V = cache["phi_Q"], cache["phi_K"], cache["V"]
    batch = dnum.shape[:-2]
    dphi_Q = np.zeros_like(phi_Q, shape=batch + phi_Q.shape[-2:])
    dphi_K = np.zeros_like(phi_K, shape=batch + phi_K.shape[-2:])
    dV = np.zeros_like(V, shape=batch + V.shape[-2:])
    chunks = _chunks(phi_Q.shape[-2], phi_K.shape[-2], cache["chunk_size"])
    S, z = _state_before(phi_K, V, phi_Q.shape[-2])
    for rows, keys, mask in chunks:                 # forward order: the state S, z before each chunk
        q, k, v = phi_Q[..., rows, :], phi_K[..., keys, :], V[..., keys, :]
        dn, dd = dnum[..., rows, :], dden[..., rows, :]
        a = np.where(mask, q @ k.swapaxes(-1, -2), 0.0)
        da = np.where(mask, dn @ v.swapaxes(-1, -2) + dd, 0.0)    # num += a v, den += a 1
        dphi_Q[..., rows, :] = dn @ S.swapaxes(-1, -2) + dd * z + da @ k   # q S, q.z, a = q k^T
        dphi_K[..., keys, :] = da.swapaxes(-1, -2) @ q             # a = q k^T
        dV[..., keys, :] = a.swapaxes(-1, -2) @ dn                 # a v
        S = S + k.swapaxes(-1, -2) @ v
        z = z + k.sum(axis=-2, keepdims=True)
    dS = np.zeros_like(S, shape=batch + S.shape[-2:])   # dS, dz: from the chunks after this one
    dz = np.zeros_like(z, shape=batch + z.shape[-2:])
    for rows, keys, _ in reversed(chunks):          # reverse order: the state's gradient
        k, v = phi_K[..., keys, :], V[..., keys, :]
        dphi_K[..., keys, :] += v @ dS.swapaxes(-1, -2) + dz   # S += k v^T, z += k
        dV[..., keys, :] += k @ dS
        dS = dS + phi_Q[..., rows, :].swapaxes(-1, -2) @ dnum[..., rows, :]   # num = q S
        dz = dz + (phi_Q[..., rows, :] * dden[..., rows, :]).sum(axis=-2, keepdims=True)
    first = phi_K.shape[-2] - phi_Q.shape[-2]       # the keys before the first query
    dphi_K[..., :first, :] = V[..., :first, :] @ dS.swapaxes(-1, -2) + dz
    dV[..., :first, :] = phi_K[..., :first, :] @ dS
    return dphi_Q, dphi_K, dV


@backward_of(linear_attention_forward)
def linear_attention_backward(dout, cache):
    """Backward of :func:`linear_attention_forward`: returns ``(dQ, dK, dV)``.

        out = num / den        ->  dnum = dout / den,   dden = -rowsum(dout * out) / den
        num_i = phi_Q_i S      ->  dphi_Q_i = S dnum_i + dden_i z,   dS = sum_i phi_Q_i^T dnum_i
        den_i = phi_Q_i . z    ->  dz = sum_i dden_i phi_Q_i
        S = sum_j phi_K_j v_j^T, z = sum_j phi_K_j
                               ->  dphi_K_j = dS v_j + dz,   dv_j = dS^T phi_K_j
        phi = elu + 1          ->  dQ = dphi_Q * phi'(Q),    dK = dphi_K * phi'(K)

    Causal, chunk by chunk: a forward sweep recomputes the state `S, z` before each chunk
    for `dphi_Q`, and takes the in-chunk pairs (`da_ij = dnum_i . v_j + dden_i` for `j <= i`:
    `dphi_Q_i += da_ij phi_K_j`, `dphi_K_j += da_ij phi_Q_i`, `dv_j += a_ij dnum_i`); a reverse
    sweep then carries `dS, dz` from the later chunks, whose state held key `j`:
    `dphi_K_j += dS v_j + dz`, `dv_j += dS^T phi_K_j`.
    """
    Q, K, V, phi_Q, phi_K = (cache[k] for k in ("Q", "K", "V", "phi_Q", "phi_K"))
    den, out = cache["den"], cache["out"]
    dnum = dout / den                                           # out = num / den
    dden = -(dout * out).sum(axis=-1, keepdims=True) / den      # d(1/den) = -1/den^2, num/den = out
    if cache["causal"]:
        dphi_Q, dphi_K, dV = _causal_linear_backward(dnum, dden, cache)
    else:
        S, z = cache["S"], cache["z"]
        dphi_Q = dnum @ S.swapaxes(-1, -2) + dden * z           # num = phi_Q S, den = phi_Q z^T
        dS = phi_Q.swapaxes(-1, -2) @ dnum                      # (..., d_k, d_v)
        dz = (dden * phi_Q).sum(axis=-2, keepdims=True)         # (..., 1, d_k)
        dphi_K = V @ dS.swapaxes(-1, -2) + dz                   # S = phi_K^T V, z = sum_j phi_K_j
        dV = phi_K @ dS
    dQ = dphi_Q * _phi_grad(Q)                                  # phi = elu + 1
    dK = dphi_K * _phi_grad(K)
    return unbroadcast(dQ, Q.shape), unbroadcast(dK, K.shape), unbroadcast(dV, V.shape)
