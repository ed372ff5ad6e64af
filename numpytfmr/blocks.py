"""Transformer blocks: encoder block and decoder block, forward and backward.

Covers 004 "Transformers" (the block as a series of operations), "Add & Norm" (pre-norm
eq. 30, post-norm eq. 31), "Residual Connections" (eq. 29), "Transformer Encoder",
"Transformer Decoder", "Cross-Attention" and "Decoder Process with Cross-Attention";
003 §8.1, 000 §2.4; the KV cache of a decoding step, 003 §6.2 and 001 §2.2.

A block is a stack of residual sublayers. With pre-normalization (004 eq. 30)

    x = x + drop(f(N(x)))

and with post-normalization (004 eq. 31, the original Transformer)

    x = N(x + drop(f(x)))

where ``N`` is LayerNorm or RMSNorm and ``f`` is multi-head self-attention, cross-attention
over the encoder output ("memory"), or the position-wise FFN:

    encoder block:  x = sub(x, self-attention);  x = sub(x, FFN)
    decoder block:  x = sub(x, masked self-attention);  [x = sub(x, cross-attention);]  x = sub(x, FFN)

Parameters come in one flat ``dict[str, ndarray]``; a block reads the keys under its
``prefix`` (e.g. ``"h0."``)::

    {prefix}attn_norm.gamma, {prefix}attn_norm.beta          norm of the self-attention sublayer
    {prefix}attn.Wq, .Wk, .Wv, .Wo, .bq, .bk, .bv, .bo        self-attention (mha_forward)
    {prefix}cross_norm.gamma, .beta                          decoder only, with memory
    {prefix}cross.Wq, .Wk, .Wv, .Wo, .bq, .bk, .bv, .bo       cross-attention (queries from x)
    {prefix}mlp_norm.gamma, .beta                            norm of the FFN sublayer
    {prefix}mlp.W1, .b1, .W2, .b2                            FFN (ffn_forward)
    {prefix}mlp.W_gate, .W_up, .W_down                       activation="swiglu" (swiglu_ffn_forward)

Biases and ``beta`` are optional: a key that is absent is an input passed as None (no
bias, RMSNorm has no beta). The backward returns the gradients as a dict with exactly the
keys the forward read.
"""
import numpy as np

from . import _validate as v
from .attention import causal_mask
from .dropout import dropout_backward, dropout_forward
from .ffn import ffn_backward, ffn_forward, swiglu_ffn_backward, swiglu_ffn_forward
from .mha import mha_backward, mha_forward
from .norms import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward

__all__ = ["encoder_block_forward", "encoder_block_backward",
           "decoder_block_forward", "decoder_block_backward"]

NORMS = ("pre", "post")
NORM_TYPES = ("layernorm", "rmsnorm")
ATTN_KEYS = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
_SWIGLU_KEYS = ("W_gate", "W_up", "W_down")


# ---------------------------------------------------------------------------------------
# Reading parameters out of the flat dict
# ---------------------------------------------------------------------------------------

def _param(params, key, where):
    """``params[key]``, or a ValueError naming the missing key."""
    if key not in params:
        raise ValueError(f"{where}: params has no key {key!r}; expected the block's weights "
                         "under its prefix (see the module docstring for the key names)")
    return params[key]


def _options(where, *, n_heads, n_kv_heads, norm, norm_type, eps, dropout, rng, train):
    """Check the options shared by both blocks; returns them as a dict."""
    n_heads = v.positive_int(n_heads, "n_heads", where)
    n_kv_heads = n_heads if n_kv_heads is None else v.positive_int(n_kv_heads, "n_kv_heads", where)
    v.choice(norm, "norm", where, NORMS)
    v.choice(norm_type, "norm_type", where, NORM_TYPES)
    eps = v.number(eps, "eps", where, low=0.0, low_open=True)
    p = v.number(dropout, "dropout", where, low=0.0, high=1.0, high_open=True)
    train = bool(train)
    if train and p > 0.0:
        v.rng_arg(rng, where)
    return {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "norm": norm, "norm_type": norm_type,
            "eps": eps, "p": p, "rng": rng, "train": train}


def _layer_cache_length(kv_cache, where):
    """Positions held by one layer's KV cache {"k": (..., n_kv_heads, T_past, d_head), "v": ...}."""
    if not isinstance(kv_cache, dict) or set(kv_cache) != {"k", "v"}:
        raise TypeError(f"{where}: kv_cache is a {type(kv_cache).__name__}; expected a dict with "
                        "keys 'k' and 'v' (cache['kv_cache'] of an earlier call)")
    k = np.asarray(kv_cache["k"])
    if k.ndim < 3:
        raise ValueError(f"{where}: kv_cache['k'] has shape {k.shape}; expected (..., n_kv_heads, "
                         "T_past, d_head)")
    return k.shape[-2]


# ---------------------------------------------------------------------------------------
# The pieces of a sublayer: norm, dropout, and the three kinds of f
# ---------------------------------------------------------------------------------------

def _norm_forward(x, params, key, o, where):
    """N(x): LayerNorm (004 eq. 27-28, with gamma/beta) or RMSNorm, weights under ``key``."""
    gamma = _param(params, key + ".gamma", where)
    if o["norm_type"] == "layernorm":
        y, c = layernorm_forward(x, gamma, params.get(key + ".beta"), eps=o["eps"])
    else:
        y, c = rmsnorm_forward(x, gamma, eps=o["eps"])
    return y, {"key": key, "norm_type": o["norm_type"], "norm": c}


def _norm_backward(dy, cache):
    """(dx, grads) of :func:`_norm_forward`."""
    key, c = cache["key"], cache["norm"]
    if cache["norm_type"] == "layernorm":
        dx, dgamma, dbeta = layernorm_backward(dy, c)
    else:
        dx, dgamma = rmsnorm_backward(dy, c)
        dbeta = None
    grads = {key + ".gamma": dgamma}
    if dbeta is not None:
        grads[key + ".beta"] = dbeta
    return dx, grads


def _dropout_forward(x, o):
    """Inverted dropout on a sublayer output; the identity (no rng drawn) unless training."""
    if not o["train"] or o["p"] == 0.0:
        return x, None
    return dropout_forward(x, p=o["p"], rng=o["rng"], train=True)


def _dropout_backward(dy, cache):
    return dy if cache is None else dropout_backward(dy, cache)


def _attention_forward(h, memory, params, key, o, where, *, mask, rope, kv_cache):
    """f = multi-head attention with queries from ``h`` (003 §5.1.3, 004 "Cross-Attention").

    Self-attention (``memory`` None) takes keys and values from ``h`` too; cross-attention
    takes them from the encoder output ``memory``.
    """
    w = [_param(params, f"{key}.{n}", where) for n in ATTN_KEYS[:4]]
    b = [params.get(f"{key}.{n}") for n in ATTN_KEYS[4:]]
    x_kv = h if memory is None else memory
    out, c = mha_forward(h, x_kv, *w, *b, n_heads=o["n_heads"], n_kv_heads=o["n_kv_heads"],
                         mask=mask, rope=rope, kv_cache=kv_cache)
    return out, {"key": key, "self": memory is None, "mha": c}


def _attention_backward(dout, cache):
    """(dh, grads, dmemory) of :func:`_attention_forward`."""
    key = cache["key"]
    dx_q, dx_kv, *dw = mha_backward(dout, cache["mha"])
    grads = {f"{key}.{n}": g for n, g in zip(ATTN_KEYS, dw) if g is not None}
    if cache["self"]:
        # self-attention: h feeds the queries AND the keys/values, so both paths add up
        # (in place: dx_q is a new array of mha_backward)
        dx_q += dx_kv
        return dx_q, grads, None
    return dx_q, grads, dx_kv


def _ffn_forward(h, params, key, o, where, *, activation):
    """f = position-wise FFN, act(h W1 + b1) W2 + b2 (004 "Feed-forward", 002 "FFN"), or with
    activation="swiglu" LLaMA's gated FFN (silu(h W_gate) * (h W_up)) W_down."""
    if activation == "swiglu":
        W = [_param(params, f"{key}.{n}", where) for n in _SWIGLU_KEYS]
        out, c = swiglu_ffn_forward(h, *W)
        return out, {"key": key, "swiglu": c}
    W1 = _param(params, key + ".W1", where)
    W2 = _param(params, key + ".W2", where)
    out, c = ffn_forward(h, W1, params.get(key + ".b1"), W2, params.get(key + ".b2"),
                         activation=activation)
    return out, {"key": key, "ffn": c}


def _ffn_backward(dout, cache):
    """(dh, grads, None) of :func:`_ffn_forward`."""
    key = cache["key"]
    if "swiglu" in cache:
        dh, *dW = swiglu_ffn_backward(dout, cache["swiglu"])
        return dh, {f"{key}.{n}": g for n, g in zip(_SWIGLU_KEYS, dW)}, None
    dh, dW1, db1, dW2, db2 = ffn_backward(dout, cache["ffn"])
    grads = {key + ".W1": dW1, key + ".W2": dW2}
    if db1 is not None:
        grads[key + ".b1"] = db1
    if db2 is not None:
        grads[key + ".b2"] = db2
    return dh, grads, None


# ---------------------------------------------------------------------------------------
# The residual sublayer: Add & Norm (004 eq. 29-31)
# ---------------------------------------------------------------------------------------

def _sublayer_forward(x, f, f_backward, norm_key, params, o, where):
    """One residual sublayer around ``f`` (a function h -> (out, cache)).

        pre-norm  (004 eq. 30):  y = x + drop(f(N(x)))
        post-norm (004 eq. 31):  y = N(x + drop(f(x)))
    """
    if o["norm"] == "pre":
        h, c_norm = _norm_forward(x, params, norm_key, o, where)   # h = N(x)
        out, c_f = f(h)                                            # f(N(x))
        out, c_drop = _dropout_forward(out, o)
        out += x                                                   # y = x + f(N(x)), in place on
        y = out                                                    #   f's new output
    else:
        out, c_f = f(x)                                            # f(x)
        out, c_drop = _dropout_forward(out, o)
        y, c_norm = _norm_forward(x + out, params, norm_key, o, where)   # N(x + f(x))
    return y, {"norm": o["norm"], "norm_cache": c_norm, "f_backward": f_backward, "f_cache": c_f,
               "dropout": c_drop}


def _sublayer_backward(dy, cache):
    """Backward of :func:`_sublayer_forward`: returns ``(dx, grads, dmemory)``.

    The residual's identity path passes dy straight through (004 eq. 29: local gradient 1).
    """
    c_norm, f_backward, c_f, c_drop = (cache[k] for k in ("norm_cache", "f_backward", "f_cache",
                                                           "dropout"))
    if cache["norm"] == "pre":
        dout = _dropout_backward(dy, c_drop)          # y = x + out: d out = dy
        dh, grads, dmem = f_backward(dout, c_f)       # out = f(h)
        dx, g_norm = _norm_backward(dh, c_norm)       # h = N(x)
        dx += dy                                      # identity path + path through f (in place:
                                                      #   dx is the norm backward's new array)
    else:
        ds, g_norm = _norm_backward(dy, c_norm)       # y = N(s),  s = x + out
        dout = _dropout_backward(ds, c_drop)          # ds/d out = 1
        dx, grads, dmem = f_backward(dout, c_f)       # out = f(x)
        dx += ds                                      # ds/dx = 1 (identity) + path through f
    grads.update(g_norm)
    return dx, grads, dmem


# ---------------------------------------------------------------------------------------
# Encoder block
# ---------------------------------------------------------------------------------------

def encoder_block_forward(x, params, *, prefix="", n_heads, n_kv_heads=None, norm="pre",
                          norm_type="layernorm", eps=1e-5, activation="gelu", mask=None,
                          rope=None, dropout=0.0, rng=None, train=False):
    """Transformer encoder block (004 "Transformer Encoder", Figure 24; 003 §8.1.1).

    pre-norm (004 eq. 30):                      post-norm (004 eq. 31):
        x = x + drop(attn(N1(x), N1(x)))            x = N1(x + drop(attn(x, x)))
        x = x + drop(ffn(N2(x)))                    x = N2(x + drop(ffn(x)))

    No future mask: every position attends to the whole sequence.

    x:      (..., n, d_model) float
    params: flat dict; reads ``{prefix}attn_norm.*``, ``{prefix}attn.*``,
            ``{prefix}mlp_norm.*``, ``{prefix}mlp.*`` (module docstring)
    n_heads, n_kv_heads: heads of the self-attention (GQA/MQA when n_kv_heads < n_heads)
    norm:   "pre" | "post";  norm_type: "layernorm" | "rmsnorm";  eps: the norm's epsilon
    activation: the FFN's activation (``ffn_forward``'s option), or "swiglu" for the gated
            FFN of LLaMA (``swiglu_ffn_forward``, weights ``{prefix}mlp.W_gate/.W_up/.W_down``)
    mask:   optional boolean key mask broadcastable to (..., n_heads, n, n), True = may
            attend (e.g. source padding: ``padding_mask(lengths, n)[:, None]``)
    rope:   None, or ``mha_forward``'s rope option (rotary positions in self-attention)
    dropout, rng, train: inverted dropout with rate ``dropout`` on each sublayer output
            when ``train`` (rng: np.random.Generator, required then)
    returns y: (..., n, d_model), cache

    cache keys: "attn" and "mlp" (the two sublayers' caches); "attn_weights" the
    self-attention weights (..., n_heads, n, n).
    """
    where = "encoder_block_forward"
    o = _options(where, n_heads=n_heads, n_kv_heads=n_kv_heads, norm=norm, norm_type=norm_type,
                 eps=eps, dropout=dropout, rng=rng, train=train)
    x = v.float_array(x, "x", where)

    def attn(h):
        return _attention_forward(h, None, params, prefix + "attn", o, where, mask=mask, rope=rope,
                                  kv_cache=None)

    def mlp(h):
        return _ffn_forward(h, params, prefix + "mlp", o, where, activation=activation)

    cache = {}
    x, cache["attn"] = _sublayer_forward(x, attn, _attention_backward, prefix + "attn_norm",
                                         params, o, where)
    x, cache["mlp"] = _sublayer_forward(x, mlp, _ffn_backward, prefix + "mlp_norm", params, o, where)
    cache["attn_weights"] = cache["attn"]["f_cache"]["mha"]["weights"]
    return x, cache


def encoder_block_backward(dy, cache):
    """Backward of :func:`encoder_block_forward`: returns ``(dx, grads)``.

    The forward read in reverse: FFN sublayer, then self-attention sublayer. ``grads`` is a
    dict with the keys of every parameter the forward read.
    """
    dx, grads, _ = _sublayer_backward(dy, cache["mlp"])       # x = sub(x, ffn)
    dx, g_attn, _ = _sublayer_backward(dx, cache["attn"])     # x = sub(x, self-attention)
    grads.update(g_attn)
    return dx, grads


# ---------------------------------------------------------------------------------------
# Decoder block
# ---------------------------------------------------------------------------------------

def decoder_block_forward(x, memory, params, *, prefix="", n_heads, n_kv_heads=None, norm="pre",
                          norm_type="layernorm", eps=1e-5, activation="gelu", mask=None,
                          memory_mask=None, rope=None, kv_cache=None, dropout=0.0, rng=None,
                          train=False):
    """Transformer decoder block (004 "Transformer Decoder", "Decoder Process with
    Cross-Attention", Figures 25-29; 003 §8.1.2).

    pre-norm (004 eq. 30):                       post-norm (004 eq. 31):
        x = x + drop(attn(N1(x), N1(x), causal))     x = N1(x + drop(attn(x, x, causal)))
        x = x + drop(cross(N2(x), memory))           x = N2(x + drop(cross(x, memory)))
        x = x + drop(ffn(N3(x)))                     x = N3(x + drop(ffn(x)))

    The self-attention is masked with the future mask (004 eq. 21); the cross-attention
    takes its queries from the decoder and its keys and values from the encoder output
    ``memory`` (004 "Cross-Attention"). With ``memory=None`` the cross-attention sublayer
    is left out: that is the block of a decoder-only model (GPT).

    x:      (B, n, d_model) decoder states (any leading axes instead of B)
    memory: (B, m, d_model) encoder output, or None
    params: flat dict; reads ``{prefix}attn_norm.*``, ``{prefix}attn.*``, with memory
            ``{prefix}cross_norm.*``, ``{prefix}cross.*``, and ``{prefix}mlp_norm.*``,
            ``{prefix}mlp.*``
    mask:   optional extra boolean mask for the self-attention, broadcastable to
            (B, n_heads, n, n_past + n), combined with the causal mask by ``&``
    memory_mask: optional boolean mask for the cross-attention, broadcastable to
            (B, n_heads, n, m) (source padding: ``padding_mask(src_lengths, m)[:, None]``)
    rope:   None, or ``mha_forward``'s rope option (applied in the self-attention only)
    kv_cache: None, or this layer's cached keys/values of the earlier positions in
            ``mha_forward``'s kv_cache format (003 §6.2, 001 §2.2); ``x`` then holds the
            new positions only and the causal mask places query i at position n_past + i.
            The updated cache is returned under ``cache["kv_cache"]``.
    other options as in :func:`encoder_block_forward`
    returns y: (B, n, d_model), cache

    cache keys: "attn", "cross" (absent without memory), "mlp" (sublayer caches);
    "attn_weights" (B, n_heads, n, n_past + n); "cross_weights" (B, n_heads, n, m) or
    None; "kv_cache" (the self-attention's keys/values including the new positions).
    """
    where = "decoder_block_forward"
    o = _options(where, n_heads=n_heads, n_kv_heads=n_kv_heads, norm=norm, norm_type=norm_type,
                 eps=eps, dropout=dropout, rng=rng, train=train)
    x = v.float_array(x, "x", where)
    v.min_ndim(x, 2, "x", where, "(..., n, d_model)")
    if memory is not None:
        memory = v.float_array(memory, "memory", where)
        v.min_ndim(memory, 2, "memory", where, "(..., m, d_model)")
    n = x.shape[-2]
    n_past = 0 if kv_cache is None else _layer_cache_length(kv_cache, where)
    # the future mask (004 eq. 21); query i sits at absolute position n_past + i
    self_mask = causal_mask(n, n_past + n)
    if mask is not None:
        self_mask = self_mask & v.bool_mask(mask, "mask", where,
                                            x.shape[:-2] + (o["n_heads"], n, n_past + n))

    def attn(h):
        return _attention_forward(h, None, params, prefix + "attn", o, where, mask=self_mask,
                                  rope=rope, kv_cache=kv_cache)

    def cross(h):
        return _attention_forward(h, memory, params, prefix + "cross", o, where, mask=memory_mask,
                                  rope=None, kv_cache=None)

    def mlp(h):
        return _ffn_forward(h, params, prefix + "mlp", o, where, activation=activation)

    cache = {}
    x, cache["attn"] = _sublayer_forward(x, attn, _attention_backward, prefix + "attn_norm",
                                         params, o, where)
    if memory is not None:
        x, cache["cross"] = _sublayer_forward(x, cross, _attention_backward, prefix + "cross_norm",
                                              params, o, where)
    x, cache["mlp"] = _sublayer_forward(x, mlp, _ffn_backward, prefix + "mlp_norm", params, o, where)
    mha_self = cache["attn"]["f_cache"]["mha"]
    cache["attn_weights"] = mha_self["weights"]
    cache["cross_weights"] = cache["cross"]["f_cache"]["mha"]["weights"] if memory is not None else None
    cache["kv_cache"] = mha_self["kv_cache"]
    return x, cache


def decoder_block_backward(dy, cache):
    """Backward of :func:`decoder_block_forward`: returns ``(dx, dmemory, grads)``.

    The forward read in reverse: FFN, cross-attention, masked self-attention. ``dmemory``
    (the gradient flowing into the encoder output) is None without memory.
    """
    dx, grads, _ = _sublayer_backward(dy, cache["mlp"])              # x = sub(x, ffn)
    dmemory = None
    if "cross" in cache:
        dx, g, dmemory = _sublayer_backward(dx, cache["cross"])      # x = sub(x, cross(., memory))
        grads.update(g)
    dx, g, _ = _sublayer_backward(dx, cache["attn"])                 # x = sub(x, self-attention)
    grads.update(g)
    return dx, dmemory, grads
