"""Transformer blocks: encoder block and decoder block, forward and backward.

Covers 004 "Transformers" (the block as a series of operations), "Add & Norm" (pre-norm
eq. 30, post-norm eq. 31), "Residual Connections" (eq. 29), "Transformer Encoder",
"Transformer Decoder", "Cross-Attention" and "Decoder Process with Cross-Attention";
003 §8.1, 000 §2.4; the KV cache of a decoding step, 003 §6.2 and 001 §2.2.

A block is a stack of residual sublayers. With pre-normalization (004 eq. 30)

    h = N(x);   a = f(h);   x = x + drop(a)

and with post-normalization (004 eq. 31, the original Transformer)

    a = f(x);   x = N(x + drop(a))

where ``N`` is LayerNorm or RMSNorm and ``f`` is multi-head self-attention, cross-attention
over the encoder output ("memory"), or the position-wise FFN:

    encoder block:  self-attention, FFN
    decoder block:  masked self-attention, [cross-attention,] FFN

Each block function is that list of steps, one call per line; its backward is the same
list read bottom to top. Every step is a pair ``*_forward`` / ``*_backward`` below (the
sublayers read their weights from the flat parameter dict by key and add their gradients
to a dict under the same keys), and the block's cache is a flat dict of the steps' caches,
named like the weights: ``"attn_norm"``, ``"attn"``, ``"attn_res"``, ``"cross_norm"``,
``"cross"``, ``"cross_res"``, ``"mlp_norm"``, ``"mlp"``, ``"mlp_res"``.

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

from .attention import causal_mask
from .contract import (bool_array, check_broadcastable, count, float_array, fraction, generator,
                       one_of, positive)
from .dropout import dropout_backward, dropout_forward
from .ffn import ffn_backward, ffn_forward, swiglu_ffn_backward, swiglu_ffn_forward
from .mha import mha_backward, mha_forward
from .norms import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward
from .transformer import ACTIVATIONS, NORM_TYPES, NORMS, add_grads, layer_cache_length

__all__ = ["encoder_block_forward", "encoder_block_backward",
           "decoder_block_forward", "decoder_block_backward"]

ATTN_KEYS = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")
FFN_KEYS = ("W1", "b1", "W2", "b2")
SWIGLU_KEYS = ("W_gate", "W_up", "W_down")


# ---------------------------------------------------------------------------------------
# The steps of a sublayer. ``o`` is the block's options (check_block_inputs); the
# backward of a step returns the gradient of its input and adds its weights' gradients
# to ``grads`` under the keys the forward read.
# ---------------------------------------------------------------------------------------

def norm_forward(x, params, key, o):
    """`N(x)`: LayerNorm (004 eq. 27-28) or RMSNorm (``o["norm_type"]``) with the gain
    ``{key}.gamma`` (and the bias ``{key}.beta`` if present)."""
    if o["norm_type"] == "rmsnorm":
        return rmsnorm_forward(x, params[key + ".gamma"], eps=o["eps"])
    return layernorm_forward(x, params[key + ".gamma"], params.get(key + ".beta"), eps=o["eps"])


def norm_backward(dy, cache, grads, key, o):
    """Backward of :func:`norm_forward`: returns ``dx``; adds `dgamma` (and `dbeta`) to ``grads``."""
    if o["norm_type"] == "rmsnorm":
        dx, dgamma = rmsnorm_backward(dy, cache)
        dbeta = None
    else:
        dx, dgamma, dbeta = layernorm_backward(dy, cache)
    add_grads(grads, key, ("gamma", "beta"), (dgamma, dbeta))
    return dx


def attention_weights(params, key):
    """``[Wq, Wk, Wv, Wo, bq, bk, bv, bo]`` under ``key`` (an absent bias is None)."""
    return [params[f"{key}.{n}"] for n in ATTN_KEYS[:4]] + [params.get(f"{key}.{n}")
                                                            for n in ATTN_KEYS[4:]]


def self_attention_forward(h, params, key, o, *, mask=None, rope=None, kv_cache=None):
    """`MultiHead(h, h, h)` (003 §5.1.3, 004 "Multi-Head Attention"): queries, keys and
    values all come from `h`; weights under ``key``. ``mha_forward``'s cache: its
    "weights" and "kv_cache" entries are the attention weights and the updated KV cache."""
    return mha_forward(h, h, *attention_weights(params, key), n_heads=o["n_heads"],
                       n_kv_heads=o["n_kv_heads"], mask=mask, rope=rope, kv_cache=kv_cache)


def self_attention_backward(da, cache, grads, key):
    """Backward of :func:`self_attention_forward`: returns ``dh``."""
    dh_q, dh_kv, *dW = mha_backward(da, cache)
    add_grads(grads, key, ATTN_KEYS, dW)
    return dh_q + dh_kv               # h feeds the queries and the keys/values: both paths add


def cross_attention_forward(h, memory, params, key, o, *, mask=None):
    """`MultiHead(h, memory, memory)` (004 "Cross-Attention"): queries from the decoder
    states `h`, keys and values from the encoder output ``memory``; weights under ``key``."""
    return mha_forward(h, memory, *attention_weights(params, key), n_heads=o["n_heads"],
                       n_kv_heads=o["n_kv_heads"], mask=mask)


def cross_attention_backward(da, cache, grads, key):
    """Backward of :func:`cross_attention_forward`: returns ``(dh, dmemory)``."""
    dh, dmemory, *dW = mha_backward(da, cache)
    add_grads(grads, key, ATTN_KEYS, dW)
    return dh, dmemory


def mlp_forward(h, params, key, o):
    """The position-wise FFN `act(h W1 + b1) W2 + b2` (004 "Feed-forward", 002 "FFN"), or
    with ``o["activation"] == "swiglu"`` LLaMA's gated `(silu(h W_gate) * (h W_up)) W_down`."""
    if o["activation"] == "swiglu":
        return swiglu_ffn_forward(h, *(params[f"{key}.{n}"] for n in SWIGLU_KEYS))
    return ffn_forward(h, params[key + ".W1"], params.get(key + ".b1"), params[key + ".W2"],
                       params.get(key + ".b2"), activation=o["activation"])


def mlp_backward(da, cache, grads, key, o):
    """Backward of :func:`mlp_forward`: returns ``dh``."""
    if o["activation"] == "swiglu":
        dh, *dW = swiglu_ffn_backward(da, cache)
        add_grads(grads, key, SWIGLU_KEYS, dW)
    else:
        dh, *dW = ffn_backward(da, cache)
        add_grads(grads, key, FFN_KEYS, dW)
    return dh


def residual_forward(x, a, o):
    """The residual connection around a sublayer (004 eq. 29): ``x + drop(a)``, with
    inverted dropout on the sublayer output when training (the identity otherwise, no
    random numbers drawn). cache: the dropout cache, or None."""
    if not o["train"] or o["dropout"] == 0.0:
        return x + a, None
    a, cache = dropout_forward(a, p=o["dropout"], rng=o["rng"], train=True)
    return x + a, cache


def residual_backward(dy, cache):
    """Backward of :func:`residual_forward`: ``(dx, da)``. The identity path passes `dy`
    unchanged (004 eq. 29: local gradient 1); the sublayer path goes through the dropout."""
    return dy, (dy if cache is None else dropout_backward(dy, cache))


# ---------------------------------------------------------------------------------------
# Checks at a block's entry
# ---------------------------------------------------------------------------------------

def check_block_inputs(x, memory, params, prefix, where, *, n_heads, n_kv_heads, norm, norm_type,
                       eps, activation, dropout, rng, train):
    """``(x, memory, o)``: the inputs as float arrays, and the options as the dict ``o``
    the steps read (keys named as the block's keyword arguments). Every weight the block
    reads must be in ``params`` (biases and betas are optional)."""
    x = float_array(x, "x", where)
    if x.ndim < 2:
        raise ValueError(f"{where}: x has shape {x.shape}; expected at least 2 axes (..., n, d_model)")
    if memory is not None:
        memory = float_array(memory, "memory", where)
        if memory.ndim < 2:
            raise ValueError(f"{where}: memory has shape {memory.shape}; expected at least 2 axes "
                             "(..., m, d_model)")
    n_heads = count(n_heads, "n_heads", where)
    o = {"n_heads": n_heads,
         "n_kv_heads": n_heads if n_kv_heads is None else count(n_kv_heads, "n_kv_heads", where),
         "norm": one_of(*NORMS)(norm, "norm", where),
         "norm_type": one_of(*NORM_TYPES)(norm_type, "norm_type", where),
         "eps": positive(eps, "eps", where),
         "activation": one_of(*ACTIVATIONS)(activation, "activation", where),
         "dropout": fraction(dropout, "dropout", where),
         "rng": rng,
         "train": bool(train)}
    if o["train"] and o["dropout"] > 0.0:
        generator(rng, "rng", where)
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict of arrays")
    mlp = SWIGLU_KEYS if activation == "swiglu" else ("W1", "W2")
    needed = [("attn_norm", ("gamma",)), ("attn", ATTN_KEYS[:4])]
    if memory is not None:
        needed += [("cross_norm", ("gamma",)), ("cross", ATTN_KEYS[:4])]
    for sub, names in needed + [("mlp_norm", ("gamma",)), ("mlp", mlp)]:
        for key in (f"{prefix}{sub}.{n}" for n in names):
            if key not in params:
                raise ValueError(f"{where}: params has no key {key!r}; expected the block's weights "
                                 "under its prefix (see the module docstring for the key names)")
    return x, memory, o


def self_attention_mask(x, n_past, mask, o, where):
    """The future mask (004 eq. 21) of the decoder's self-attention, with query `i` at
    absolute position `n_past + i` (after the cached positions), combined by ``&`` with an
    optional extra boolean mask broadcastable to (..., n_heads, n, n_past + n)."""
    n = x.shape[-2]
    allowed = causal_mask(n, n_past + n)
    if mask is None:
        return allowed
    mask = bool_array(mask, "mask", where)
    target = x.shape[:-2] + (o["n_heads"], n, n_past + n)
    check_broadcastable(mask, target, "mask", where, "(..., n_heads, n, n_past + n)")
    return allowed & mask


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
    n_heads, n_kv_heads: heads of the self-attention (GQA/MQA when `n_kv_heads < n_heads`)
    norm:   "pre" | "post";  norm_type: "layernorm" | "rmsnorm";  eps: the norm's epsilon
    activation: the FFN's activation (``ffn_forward``'s option), or "swiglu" for the gated
            FFN of LLaMA (``swiglu_ffn_forward``, weights ``{prefix}mlp.W_gate/.W_up/.W_down``)
    mask:   optional boolean key mask broadcastable to (..., n_heads, n, n), True = may
            attend (e.g. source padding: ``padding_mask(lengths, n)[:, None]``)
    rope:   None, or ``mha_forward``'s rope option (rotary positions in self-attention)
    dropout, rng, train: inverted dropout with rate ``dropout`` on each sublayer output
            when ``train`` (rng: np.random.Generator, required then)
    returns y: (..., n, d_model), cache

    cache: the steps' caches "attn_norm", "attn", "attn_res", "mlp_norm", "mlp", "mlp_res"
    ("attn" is ``mha_forward``'s cache), the options ("prefix", "options"), and
    "attn_weights" the self-attention weights (..., n_heads, n, n).
    """
    x, _, o = check_block_inputs(
        x, None, params, prefix, "encoder_block_forward", n_heads=n_heads, n_kv_heads=n_kv_heads,
        norm=norm, norm_type=norm_type, eps=eps, activation=activation, dropout=dropout, rng=rng,
        train=train)
    p, c = prefix, {"prefix": prefix, "options": o}
    if o["norm"] == "pre":                                           # 004 eq. 30
        h, c["attn_norm"] = norm_forward(x, params, p + "attn_norm", o)                # h = N1(x)
        a, c["attn"] = self_attention_forward(h, params, p + "attn", o, mask=mask, rope=rope)
        x, c["attn_res"] = residual_forward(x, a, o)                                   # x = x + a
        h, c["mlp_norm"] = norm_forward(x, params, p + "mlp_norm", o)                  # h = N2(x)
        a, c["mlp"] = mlp_forward(h, params, p + "mlp", o)                             # a = FFN(h)
        x, c["mlp_res"] = residual_forward(x, a, o)                                    # x = x + a
    else:                                                            # 004 eq. 31
        a, c["attn"] = self_attention_forward(x, params, p + "attn", o, mask=mask, rope=rope)
        s, c["attn_res"] = residual_forward(x, a, o)                                   # s = x + a
        x, c["attn_norm"] = norm_forward(s, params, p + "attn_norm", o)                # x = N1(s)
        a, c["mlp"] = mlp_forward(x, params, p + "mlp", o)                             # a = FFN(x)
        s, c["mlp_res"] = residual_forward(x, a, o)                                    # s = x + a
        x, c["mlp_norm"] = norm_forward(s, params, p + "mlp_norm", o)                  # x = N2(s)
    c["attn_weights"] = c["attn"]["weights"]
    return x, c


def encoder_block_backward(dy, cache):
    """Backward of :func:`encoder_block_forward`: returns ``(dx, dmemory, grads)`` as
    :func:`decoder_block_backward` does, with ``dmemory`` None (an encoder block reads no
    memory).

    The forward read bottom to top. ``grads`` is a dict with the keys of every parameter
    the forward read. A residual passes its gradient straight through (004 eq. 29), so
    the gradient of `x` is the identity path's plus the sublayer path's.
    """
    c, p, o, grads = cache, cache["prefix"], cache["options"], {}
    if o["norm"] == "pre":
        dx, da = residual_backward(dy, c["mlp_res"])                                   # x = x + a
        dh = mlp_backward(da, c["mlp"], grads, p + "mlp", o)                           # a = FFN(h)
        dx = dx + norm_backward(dh, c["mlp_norm"], grads, p + "mlp_norm", o)           # h = N2(x)
        dx, da = residual_backward(dx, c["attn_res"])                                  # x = x + a
        dh = self_attention_backward(da, c["attn"], grads, p + "attn")                 # a = attn(h)
        dx = dx + norm_backward(dh, c["attn_norm"], grads, p + "attn_norm", o)         # h = N1(x)
    else:
        ds = norm_backward(dy, c["mlp_norm"], grads, p + "mlp_norm", o)                # x = N2(s)
        dx, da = residual_backward(ds, c["mlp_res"])                                   # s = x + a
        dx = dx + mlp_backward(da, c["mlp"], grads, p + "mlp", o)                      # a = FFN(x)
        ds = norm_backward(dx, c["attn_norm"], grads, p + "attn_norm", o)              # x = N1(s)
        dx, da = residual_backward(ds, c["attn_res"])                                  # s = x + a
        dx = dx + self_attention_backward(da, c["attn"], grads, p + "attn")            # a = attn(x)
    return dx, None, grads


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
            new positions only and the causal mask places query `i` at position `n_past + i`.
            The updated cache is returned under ``cache["kv_cache"]``.
    other options as in :func:`encoder_block_forward`
    returns y: (B, n, d_model), cache

    cache: the steps' caches "attn_norm", "attn", "attn_res", "cross_norm", "cross",
    "cross_res" (absent without memory), "mlp_norm", "mlp", "mlp_res" ("attn" and "cross"
    are ``mha_forward``'s caches), the options ("prefix", "options"), and for readers
    "attn_weights" (B, n_heads, n, n_past + n), "cross_weights" (B, n_heads, n, m) or
    None, "kv_cache" (the self-attention's keys/values including the new positions).
    """
    where = "decoder_block_forward"
    x, memory, o = check_block_inputs(
        x, memory, params, prefix, where, n_heads=n_heads, n_kv_heads=n_kv_heads, norm=norm,
        norm_type=norm_type, eps=eps, activation=activation, dropout=dropout, rng=rng, train=train)
    n_past = 0 if kv_cache is None else layer_cache_length(kv_cache, where)
    causal = self_attention_mask(x, n_past, mask, o, where)          # future mask (004 eq. 21)
    self_attn = dict(mask=causal, rope=rope, kv_cache=kv_cache)
    p, c = prefix, {"prefix": prefix, "options": o}
    if o["norm"] == "pre":                                           # 004 eq. 30
        h, c["attn_norm"] = norm_forward(x, params, p + "attn_norm", o)                # h = N1(x)
        a, c["attn"] = self_attention_forward(h, params, p + "attn", o, **self_attn)   # a = attn(h)
        x, c["attn_res"] = residual_forward(x, a, o)                                   # x = x + a
        if memory is not None:
            h, c["cross_norm"] = norm_forward(x, params, p + "cross_norm", o)          # h = N2(x)
            a, c["cross"] = cross_attention_forward(h, memory, params, p + "cross", o,
                                                    mask=memory_mask)                  # a = cross(h, m)
            x, c["cross_res"] = residual_forward(x, a, o)                              # x = x + a
        h, c["mlp_norm"] = norm_forward(x, params, p + "mlp_norm", o)                  # h = N3(x)
        a, c["mlp"] = mlp_forward(h, params, p + "mlp", o)                             # a = FFN(h)
        x, c["mlp_res"] = residual_forward(x, a, o)                                    # x = x + a
    else:                                                            # 004 eq. 31
        a, c["attn"] = self_attention_forward(x, params, p + "attn", o, **self_attn)   # a = attn(x)
        s, c["attn_res"] = residual_forward(x, a, o)                                   # s = x + a
        x, c["attn_norm"] = norm_forward(s, params, p + "attn_norm", o)                # x = N1(s)
        if memory is not None:
            a, c["cross"] = cross_attention_forward(x, memory, params, p + "cross", o,
                                                    mask=memory_mask)                  # a = cross(x, m)
            s, c["cross_res"] = residual_forward(x, a, o)                              # s = x + a
            x, c["cross_norm"] = norm_forward(s, params, p + "cross_norm", o)          # x = N2(s)
        a, c["mlp"] = mlp_forward(x, params, p + "mlp", o)                             # a = FFN(x)
        s, c["mlp_res"] = residual_forward(x, a, o)                                    # s = x + a
        x, c["mlp_norm"] = norm_forward(s, params, p + "mlp_norm", o)                  # x = N3(s)
    c["attn_weights"], c["kv_cache"] = c["attn"]["weights"], c["attn"]["kv_cache"]
    c["cross_weights"] = c["cross"]["weights"] if memory is not None else None
    return x, c


def decoder_block_backward(dy, cache):
    """Backward of :func:`decoder_block_forward`: returns ``(dx, dmemory, grads)``.

    The forward read bottom to top: FFN, cross-attention, masked self-attention.
    ``dmemory`` (the gradient flowing into the encoder output) is None without memory;
    ``grads`` is a dict with the keys of every parameter the forward read.
    """
    c, p, o, grads = cache, cache["prefix"], cache["options"], {}
    dmemory = None
    if o["norm"] == "pre":
        dx, da = residual_backward(dy, c["mlp_res"])                                   # x = x + a
        dh = mlp_backward(da, c["mlp"], grads, p + "mlp", o)                           # a = FFN(h)
        dx = dx + norm_backward(dh, c["mlp_norm"], grads, p + "mlp_norm", o)           # h = N3(x)
        if "cross" in c:
            dx, da = residual_backward(dx, c["cross_res"])                             # x = x + a
            dh, dmemory = cross_attention_backward(da, c["cross"], grads, p + "cross")  # a = cross(h, m)
            dx = dx + norm_backward(dh, c["cross_norm"], grads, p + "cross_norm", o)   # h = N2(x)
        dx, da = residual_backward(dx, c["attn_res"])                                  # x = x + a
        dh = self_attention_backward(da, c["attn"], grads, p + "attn")                 # a = attn(h)
        dx = dx + norm_backward(dh, c["attn_norm"], grads, p + "attn_norm", o)         # h = N1(x)
    else:
        ds = norm_backward(dy, c["mlp_norm"], grads, p + "mlp_norm", o)                # x = N3(s)
        dx, da = residual_backward(ds, c["mlp_res"])                                   # s = x + a
        dx = dx + mlp_backward(da, c["mlp"], grads, p + "mlp", o)                      # a = FFN(x)
        if "cross" in c:
            ds = norm_backward(dx, c["cross_norm"], grads, p + "cross_norm", o)        # x = N2(s)
            dx, da = residual_backward(ds, c["cross_res"])                             # s = x + a
            dh, dmemory = cross_attention_backward(da, c["cross"], grads, p + "cross")  # a = cross(x, m)
            dx = dx + dh
        ds = norm_backward(dx, c["attn_norm"], grads, p + "attn_norm", o)              # x = N1(s)
        dx, da = residual_backward(ds, c["attn_res"])                                  # s = x + a
        dx = dx + self_attention_backward(da, c["attn"], grads, p + "attn")            # a = attn(x)
    return dx, dmemory, grads
