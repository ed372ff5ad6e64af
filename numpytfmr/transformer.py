"""What the two transformer models share: the decoder-only GPT (gpt.py) and the
encoder-decoder (encdec.py), and the GPT's post-training (posttrain.py).

Both models are built the same way (004 "Transformers"), so the parts around the blocks
live here, once:

- the config: the options both configs have (heads, positions, norm, activation, ...),
  their checks, and ``to_dict`` / ``from_dict``;
- the parameter table: ``{key: shape}`` of a block, a norm, and the GPT-2 initialisation;
- the checks at a model's entry (config, params, token ids, KV cache), made once there
  so the layers below them stay equations;
- the first and the last step of a model: token + position embeddings (004 eq. 12) and
  the final linear layer to the vocabulary (004 "The Final Linear and Softmax Layer");
- the gradient dict every backward fills (:func:`add_grad`: a weight used twice, such as
  a tied embedding table, gets the sum of its two gradients);
- the choice of the next token when generating (000 §2.5, 003 §6.1).

The blocks themselves are in blocks.py; the models are sequences of these steps. The
recurrent encoder-decoder (rnn.py) uses the same entry checks for token counts, token ids
and the logits' gradient.
"""
from dataclasses import asdict, fields
import math
import numbers

import numpy as np

from .contract import (count, flag, float_array, fraction, generator, int_array,
                       one_of, positive, real)
from .dropout import dropout_backward, dropout_forward
from .embedding import embedding_backward, embedding_forward
from .ffn import FFN_ACTIVATIONS
from .linear import linear_backward, linear_forward
from .positional import rope_frequencies, sinusoidal_encoding

POSITIONALS = ("learned", "sinusoidal", "rope")
NORMS = ("pre", "post")                       # 004 eq. 30 / eq. 31
NORM_TYPES = ("layernorm", "rmsnorm")
ACTIVATIONS = FFN_ACTIVATIONS + ("swiglu",)   # "relu", "gelu", "gelu_tanh" (GPT-2), "swiglu" (LLaMA)
ROPE_LAYOUTS = ("interleaved", "half")


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------

def check_config_fields(c, where, sizes):
    """Check a model config (GPTConfig, EncDecConfig) and fill its defaults
    ``n_kv_heads = n_heads`` and ``d_ff = 4 d_model``.

    sizes: the names of the config's own positive integer fields (vocabularies, layers).
    """
    for name in sizes + ("d_model", "n_heads", "max_len"):
        count(getattr(c, name), name, where)
    if c.n_kv_heads is None:
        object.__setattr__(c, "n_kv_heads", c.n_heads)
    if c.d_ff is None:
        object.__setattr__(c, "d_ff", 4 * c.d_model)
    count(c.n_kv_heads, "n_kv_heads", where)
    count(c.d_ff, "d_ff", where)
    if c.d_model % c.n_heads:
        raise ValueError(f"{where}: d_model is {c.d_model} and n_heads is {c.n_heads}; "
                         "expected d_model divisible by n_heads (d_head = d_model / n_heads)")
    if c.n_heads % c.n_kv_heads:
        raise ValueError(f"{where}: n_heads is {c.n_heads} and n_kv_heads is {c.n_kv_heads}; "
                         "expected n_heads divisible by n_kv_heads (each key/value head serves "
                         "a whole group of query heads)")
    one_of(*POSITIONALS)(c.positional, "positional", where)
    one_of(*NORMS)(c.norm, "norm", where)
    one_of(*NORM_TYPES)(c.norm_type, "norm_type", where)
    one_of(*ACTIVATIONS)(c.activation, "activation", where)
    if c.activation == "swiglu" and c.bias:
        raise ValueError(f"{where}: activation is 'swiglu' and bias is True; the SwiGLU FFN has no "
                         "biases: pass bias=False (as LLaMA)")
    one_of(*ROPE_LAYOUTS)(c.rope_layout, "rope_layout", where)
    flag(c.tie_embeddings, "tie_embeddings", where)
    flag(c.bias, "bias", where)
    fraction(c.dropout, "dropout", where)
    positive(c.norm_eps, "norm_eps", where)
    real(c.rope_base, "rope_base", where, low=1.0, low_open=True)
    if c.positional == "rope":
        if c.d_head % 2:
            raise ValueError(f"{where}: positional is 'rope' but d_head = d_model / n_heads = "
                             f"{c.d_head} is odd; expected an even d_head (RoPE rotates pairs)")
        rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling)
    elif c.rope_scaling is not None:
        raise ValueError(f"{where}: rope_scaling is {c.rope_scaling!r} but positional is "
                         f"{c.positional!r}; expected rope_scaling=None unless positional='rope'")


def config_to_dict(c):
    """Every field of a config dataclass as a plain (JSON-ready) dict."""
    d = asdict(c)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = dict(d["rope_scaling"])
    return d


def config_from_dict(cls, d):
    """``cls(**d)``; an unknown key is an error (a typo would be ignored otherwise)."""
    if not isinstance(d, dict):
        raise TypeError(f"{cls.__name__}.from_dict: d is a {type(d).__name__}; expected a dict")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}; expected keys "
                         f"among {sorted(names)}")
    return cls(**d)


def check_config(config, cls, where):
    """``config``, which must be a ``cls``."""
    if not isinstance(config, cls):
        raise TypeError(f"{where}: config is a {type(config).__name__}; expected a {cls.__name__}")
    return config


def block_kwargs(c, *, rng, train):
    """The keyword options every block of this model gets (``encoder_block_forward``,
    ``decoder_block_forward``); also what the final norm reads ("norm_type", "eps")."""
    return dict(n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, norm=c.norm, norm_type=c.norm_type,
                eps=c.norm_eps, activation=c.activation, dropout=c.dropout, rng=rng, train=train)


def rope_option(c):
    """``mha_forward``'s rope option for this config, or None. mha places the new queries
    and keys at positions `n_past, n_past + 1, ...` after the `n_past` cached ones."""
    if c.positional != "rope":
        return None
    freqs = rope_frequencies(c.d_head, base=c.rope_base, scaling=c.rope_scaling)
    return {"freqs": freqs, "layout": c.rope_layout}


# ---------------------------------------------------------------------------------------
# Parameters: {key: shape} and the initialisation
# ---------------------------------------------------------------------------------------

def norm_param_shapes(key, c):
    """``{key}.gamma`` (d_model,), and ``{key}.beta`` for LayerNorm with bias."""
    s = {f"{key}.gamma": (c.d_model,)}
    if c.norm_type == "layernorm" and c.bias:
        s[f"{key}.beta"] = (c.d_model,)
    return s


def block_param_shapes(prefix, c, *, cross=False):
    """Shapes of one block's parameters (keys as in blocks.py): attention, optionally
    cross-attention, and the FFN, each with its norm."""
    d, hd, kvd = c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    s = {}
    for sub in ("attn", "cross") if cross else ("attn",):
        s.update(norm_param_shapes(f"{prefix}{sub}_norm", c))
        s.update({f"{prefix}{sub}.Wq": (d, hd), f"{prefix}{sub}.Wk": (d, kvd),
                  f"{prefix}{sub}.Wv": (d, kvd), f"{prefix}{sub}.Wo": (hd, d)})
        if c.bias:
            s.update({f"{prefix}{sub}.bq": (hd,), f"{prefix}{sub}.bk": (kvd,),
                      f"{prefix}{sub}.bv": (kvd,), f"{prefix}{sub}.bo": (d,)})
    s.update(norm_param_shapes(f"{prefix}mlp_norm", c))
    if c.activation == "swiglu":       # no biases (checked by the config)
        s.update({f"{prefix}mlp.W_gate": (d, c.d_ff), f"{prefix}mlp.W_up": (d, c.d_ff),
                  f"{prefix}mlp.W_down": (c.d_ff, d)})
        return s
    s.update({f"{prefix}mlp.W1": (d, c.d_ff), f"{prefix}mlp.W2": (c.d_ff, d)})
    if c.bias:
        s.update({f"{prefix}mlp.b1": (c.d_ff,), f"{prefix}mlp.b2": (d,)})
    return s


def float_dtype(dtype, where):
    """``np.dtype(dtype)``, which must be float32 or float64."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    return dt


def init_params(shapes, n_layers, *, rng, dtype):
    """GPT-2 initialisation of the parameters ``shapes`` describes: `N(0, 0.02^2)` weights and
    tables, zero biases and betas, unit gammas; the projections that write into the
    residual stream (attention/cross ``Wo``, ``mlp.W2``, ``mlp.W_down``) scaled by
    `1/sqrt(2 n_layers)` so that the stream's variance does not grow with depth."""
    params = {}
    for key, shape in shapes.items():
        name = key.rsplit(".", 1)[-1]
        if name == "gamma":
            params[key] = np.ones(shape, dtype=dtype)
        elif name == "beta" or name.startswith("b"):
            params[key] = np.zeros(shape, dtype=dtype)
        else:
            std = 0.02
            if key.endswith(("attn.Wo", "cross.Wo", "mlp.W2", "mlp.W_down")):
                std = 0.02 / math.sqrt(2 * n_layers)
            params[key] = (std * rng.standard_normal(shape)).astype(dtype)
    return params


# ---------------------------------------------------------------------------------------
# The checks at a model's entry
# ---------------------------------------------------------------------------------------

def check_params(params, shapes, where):
    """Every key of ``shapes`` in ``params`` with its shape, no other key, one float dtype;
    returns that dtype."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict of arrays")
    missing = [k for k in shapes if k not in params]
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise ValueError(f"{where}: params is missing {missing[:5]}{more}; expected the keys of "
                         "init for this config")
    extra = [k for k in params if k not in shapes]
    if extra:
        raise ValueError(f"{where}: params has unexpected keys {extra[:5]}; they do not belong to a "
                         "model with this config")
    dtypes = set()
    for k, shape in shapes.items():
        p = float_array(params[k], f"params[{k!r}]", where)
        if p.shape != shape:
            raise ValueError(f"{where}: params[{k!r}] has shape {p.shape}; expected {shape} for "
                             "this config")
        dtypes.add(p.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{where}: params mix dtypes {sorted(map(str, dtypes))}; expected one "
                        "float dtype for every parameter")
    return dtypes.pop()


def check_model(params, config, cls, param_shapes, where, *, rng=None, train=False):
    """The checks every model call starts with: ``config`` is a ``cls``, ``params`` has the
    keys and shapes ``param_shapes(config)`` lists, and dropout has its rng.
    Returns ``(config, dtype of the params)``."""
    c = check_config(config, cls, where)
    dtype = check_params(params, param_shapes(c), where)
    if train and c.dropout > 0.0:
        generator(rng, "rng", where)
    return c, dtype


def check_ids(ids, name, vocab_size, c, where, *, n_past=0):
    """Token ids (B, T), `T >= 1`, in `[0, vocab_size)`; with learned positions the positions
    `n_past .. n_past + T - 1` must have rows in the table (max_len)."""
    ids = int_array(ids, name, where, low=0, high=vocab_size)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{where}: {name} has shape {ids.shape}; expected (batch, T) with T >= 1")
    last = n_past + ids.shape[1] - 1
    if c.positional == "learned" and last >= c.max_len:
        raise ValueError(f"{where}: {name} reaches position {last} but max_len={c.max_len} "
                         f"({name} has T={ids.shape[1]} after {n_past} cached positions); "
                         f"learned positions have rows 0..{c.max_len - 1} only")
    return ids


def layer_cache_length(kv_cache, where):
    """Positions held by one layer's KV cache {"k": (..., n_kv_heads, T_past, d_head), "v"}."""
    if not isinstance(kv_cache, dict) or set(kv_cache) != {"k", "v"}:
        raise TypeError(f"{where}: kv_cache is a {type(kv_cache).__name__}; expected a dict with "
                        "keys 'k' and 'v' (cache['kv_cache'] of an earlier call)")
    k = np.asarray(kv_cache["k"])
    if k.ndim < 3:
        raise ValueError(f"{where}: kv_cache['k'] has shape {k.shape}; expected (..., n_kv_heads, "
                         "T_past, d_head)")
    return k.shape[-2]


def kv_cache_length(kv_cache, n_layers, where):
    """Positions already in a model's KV cache (a list with one entry per layer)."""
    if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != n_layers:
        got = f"a {type(kv_cache).__name__}" + (f" of length {len(kv_cache)}"
                                                if isinstance(kv_cache, (list, tuple)) else "")
        raise ValueError(f"{where}: kv_cache is {got}; expected a list of {n_layers} per-layer "
                         "caches (cache['kv_cache'] of an earlier call)")
    return layer_cache_length(kv_cache[0], where)


def check_dlogits(dlogits, cache, where):
    """The upstream gradient of a model's logits: their shape, cast to their dtype."""
    dlogits = float_array(dlogits, "dlogits", where)
    if dlogits.shape != cache["logits_shape"]:
        raise ValueError(f"{where}: dlogits has shape {dlogits.shape}; expected the logits' "
                         f"shape {cache['logits_shape']}")
    return dlogits.astype(cache["dtype"], copy=False)


def masked_targets(targets, loss_mask, ignore_index, where):
    """``(targets, ignore_index)`` with the positions where ``loss_mask`` is False set to the
    ignored value (-1 unless ``ignore_index`` names one); unchanged without a mask."""
    if loss_mask is None:
        return targets, ignore_index
    targets = int_array(targets, "targets", where, low=-(2 ** 62))
    loss_mask = np.asarray(loss_mask)
    if loss_mask.dtype != np.bool_ or loss_mask.shape != targets.shape:
        raise ValueError(f"{where}: loss_mask has dtype {loss_mask.dtype} and shape "
                         f"{loss_mask.shape}; expected a bool array of the targets' shape "
                         f"{targets.shape} (True = scored)")
    ignore_index = -1 if ignore_index is None else ignore_index
    return np.where(loss_mask, targets, ignore_index), ignore_index


def token_count(n, name, where):
    """An integer `>= 0` (a number of tokens to generate)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"{where}: {name} is {n!r}; expected an integer >= 0")
    return int(n)


def token_id(i, name, vocab_size, where):
    """One token id in `[0, vocab_size)`, as a Python int."""
    return int(int_array(np.asarray(i), name, where, low=0, high=vocab_size))


# ---------------------------------------------------------------------------------------
# Gradients: one dict per backward, a weight used twice gets the sum
# ---------------------------------------------------------------------------------------

def add_grad(grads, key, g):
    """``grads[key] += g`` (the first gradient of a key is stored as it is)."""
    grads[key] = grads[key] + g if key in grads else g


def add_grads(grads, key, names, values):
    """:func:`add_grad` of ``values`` under ``{key}.{name}``; a None value (the gradient of
    an absent bias) is skipped."""
    for name, g in zip(names, values):
        if g is not None:
            add_grad(grads, f"{key}.{name}", g)


# ---------------------------------------------------------------------------------------
# The first and the last step of a model
# ---------------------------------------------------------------------------------------

def embed_forward(params, ids, positions, c, *, prefix="", rng=None, train=False):
    """Token embeddings plus positions (004 eq. 12, "Position representations"), then
    dropout when training:

        learned:     x = E[ids] + P[positions]
        sinusoidal:  x = E[ids] + PE[positions]     (fixed, no parameters; 003 §7.2)
        rope:        x = E[ids]                     (positions rotate inside attention)

    ids: (B, T) ints;  positions: (T,) absolute positions of these tokens;
    tables ``{prefix}wte`` (vocab, d_model) and ``{prefix}wpe`` (max_len, d_model).
    ->  x: (B, T, d_model), cache {"prefix", "tok", "pos", "drop"}
    """
    x, c_tok = embedding_forward(ids, params[prefix + "wte"])            # E[ids]      (B, T, d)
    c_pos = None
    if c.positional == "learned":
        p, c_pos = embedding_forward(positions, params[prefix + "wpe"])  # P[positions] (T, d)
        x = x + p                                                        # broadcast over B
    elif c.positional == "sinusoidal":
        pe = sinusoidal_encoding(int(positions[-1]) + 1, c.d_model, dtype=x.dtype)
        x = x + pe[positions]                                            # PE[positions]
    c_drop = None
    if train and c.dropout > 0.0:
        x, c_drop = dropout_forward(x, p=c.dropout, rng=rng, train=True)
    return x, {"prefix": prefix, "tok": c_tok, "pos": c_pos, "drop": c_drop}


def embed_backward(dx, cache, grads):
    """Backward of :func:`embed_forward`: adds the tables' gradients to ``grads``."""
    prefix = cache["prefix"]
    if cache["drop"] is not None:
        dx = dropout_backward(dx, cache["drop"])
    add_grad(grads, prefix + "wte", embedding_backward(dx, cache["tok"])[1])   # repeated ids add up
    if cache["pos"] is not None:
        # P[positions] was broadcast over the batch: its gradient sums the batch axis
        add_grad(grads, prefix + "wpe", embedding_backward(dx.sum(axis=0), cache["pos"])[1])


def lm_head_forward(x, params, c, *, table="wte"):
    """The final linear layer to the vocabulary (004 "The Final Linear and Softmax Layer"):

        logits = x W_out,     W_out = E^T when the embeddings are tied (``c.tie_embeddings``)

    x: (..., d_model)  ->  logits: (..., vocab); E is ``params[table]``, the untied W_out
    ``params["lm_head.W"]`` (d_model, vocab). The softmax is the loss's.
    """
    W_out = params[table].T if c.tie_embeddings else params["lm_head.W"]   # (d_model, vocab)
    return linear_forward(x, W_out)


def lm_head_backward(dlogits, cache, grads, c, *, table="wte"):
    """Backward of :func:`lm_head_forward`: returns ``dx``, adds `dW_out` to ``grads``."""
    dx, dW_out, _ = linear_backward(dlogits, cache)
    if c.tie_embeddings:
        add_grad(grads, table, dW_out.T)          # W_out = E^T  ->  dE = dW_out^T
    else:
        add_grad(grads, "lm_head.W", dW_out)
    return dx


# ---------------------------------------------------------------------------------------
# The next token (000 §2.5, 003 §6.1)
# ---------------------------------------------------------------------------------------

def check_sampling(temperature, top_k, rng, where, *, top_p=None):
    """``(temperature, top_k, top_p)`` checked; sampling (not greedy) needs an rng."""
    temperature = real(temperature, "temperature", where, low=0.0)
    if top_k is not None:
        top_k = count(top_k, "top_k", where)
    if top_p is not None:
        top_p = real(top_p, "top_p", where, low=0.0, high=1.0, low_open=True)
    greedy = temperature == 0.0 or top_k == 1
    if not greedy and rng is None:
        raise ValueError(f"{where}: rng is None but sampling needs randomness (temperature="
                         f"{temperature}, top_k={top_k}); pass rng=np.random.default_rng(seed), "
                         "or use greedy decoding with top_k=1 or temperature=0")
    if not greedy:
        generator(rng, "rng", where)
    return temperature, top_k, top_p


def next_token(logits, *, temperature=0.0, top_k=None, top_p=None, rng=None):
    """One token per row from last-position logits (B, V): greedy or sampled.

        greedy:  argmax_v logits[v]           (temperature == 0 or top_k == 1)
        sample:  p = softmax(logits / temperature) restricted to the top_k largest, then
                 to the nucleus (top_p): the smallest set of most likely tokens whose
                 probabilities sum to at least top_p, renormalised
    """
    if temperature == 0.0 or top_k == 1:
        return np.argmax(logits, axis=-1)
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]   # k-th largest per row
        z = np.where(z >= kth, z, -np.inf)                           # ties at the k-th may keep more
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        p = nucleus(p, top_p)
    # inverse-CDF sampling, all rows at once: first v with cumsum(p)[v] > u
    u = rng.random((p.shape[0], 1))
    idx = np.sum(np.cumsum(p, axis=-1) <= u, axis=-1)
    return np.minimum(idx, p.shape[-1] - 1)


def append_tokens(next_logits, out, n, *, temperature=0.0, top_k=None, top_p=None, rng=None,
                  eos_id=None):
    """The generation loop (000 §2.5): fill ``out[:, n:]`` (B, T_out) one token a step.

    Each step asks ``next_logits(n)`` for the next-token logits (B, V) of ``out[:, :n]``,
    picks a token per row (:func:`next_token`) and writes it at column n. A row that has
    produced ``eos_id`` gets ``eos_id`` from then on; once every row has, the rest of
    ``out`` is ``eos_id`` and the loop stops. Returns the logits of every step, a list.
    """
    chosen_from = []
    done = np.zeros(out.shape[0], dtype=bool)
    while n < out.shape[1]:
        last = next_logits(n)                                          # (B, V)
        chosen_from.append(last)
        token = next_token(last, temperature=temperature, top_k=top_k, top_p=top_p, rng=rng)
        if eos_id is not None:
            token = np.where(done, eos_id, token)
            done = done | (token == eos_id)
        out[:, n] = token
        n += 1
        if eos_id is not None and done.all():
            out[:, n:] = eos_id
            break
    return chosen_from


def nucleus(p, top_p):
    """Nucleus (top-p) filtering of distributions `p` (B, V): keep, per row, the most likely
    tokens until their probabilities sum to at least ``top_p`` (a token is kept when the
    tokens ranked above it sum to less than ``top_p``; equal probabilities rank by id),
    zero the rest and renormalise."""
    order = np.argsort(-p, axis=-1, kind="stable")                   # most likely first
    ranked = np.take_along_axis(p, order, axis=-1)
    above = np.cumsum(ranked, axis=-1) - ranked                      # mass ranked above each
    keep = np.empty(p.shape, dtype=bool)
    np.put_along_axis(keep, order, above < top_p, axis=-1)
    q = np.where(keep, p, 0.0)
    return q / q.sum(axis=-1, keepdims=True)
