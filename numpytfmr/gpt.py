"""A decoder-only transformer (GPT): config, init, forward, backward, loss and generation.

Covers 004 "Transformer Decoder" (decoder-only, masked self-attention), "Position
representations" (learned eq. 12, sinusoids, RoPE), "Add & Norm" (eq. 30-31) and "The
Final Linear and Softmax Layer"; 000 §2.5 / 003 ch. 6 (autoregressive inference and KV
caching) and 001 §2.2 (the cache's shapes).

The whole model, read top to bottom (pre-norm)::

    x = E[ids] + P[positions]                 token + position embeddings (004 eq. 12)
    for each layer l:                         decoder block without cross-attention
        x = x + attn_l(N(x))                  masked multi-head self-attention
        x = x + ffn_l(N(x))
    x = N_f(x)                                final norm (pre-norm only)
    logits = x W_out                          final linear layer; W_out = E^T when tied

``softmax`` / cross-entropy are applied by the caller (``gpt_loss`` does it with
``cross_entropy_forward``). ``gpt_backward`` is the same list read bottom to top.

Parameter keys (a flat ``dict[str, ndarray]``, see :func:`gpt_param_shapes`)::

    wte                         (vocab_size, d_model)   token embedding table E
    wpe                         (max_len, d_model)      learned positions P (positional="learned")
    h{l}.attn_norm.gamma/.beta  (d_model,)              beta only for LayerNorm with bias
    h{l}.attn.Wq                (d_model, n_heads*d_head)
    h{l}.attn.Wk, .Wv           (d_model, n_kv_heads*d_head)
    h{l}.attn.Wo                (n_heads*d_head, d_model)
    h{l}.attn.bq/.bk/.bv/.bo    biases (bias=True)
    h{l}.mlp_norm.gamma/.beta   (d_model,)
    h{l}.mlp.W1 (d_model, d_ff), .b1 (d_ff,), .W2 (d_ff, d_model), .b2 (d_model,)
    h{l}.mlp.W_gate, .W_up (d_model, d_ff), .W_down (d_ff, d_model)   activation="swiglu" instead
    norm_f.gamma/.beta          (d_model,)              pre-norm only
    lm_head.W                   (d_model, vocab_size)   untied only (tied: logits = x E^T)

KV cache (003 §6.2, 001 §2.2): a list with one entry per layer, each the ``mha_forward``
kv_cache of that layer, holding keys and values of shape (B, n_kv_heads, T, d_head). It
grows in one place, ``mha.kv_cache_append``: each layer's attention appends the keys and
values of the new positions. ``gpt_forward`` always returns the cache covering every
position it has seen under ``cache["kv_cache"]``; pass it back as ``kv_cache=`` with only
the new token ids to decode one step (``generate`` below does, token by token).
"""
from dataclasses import dataclass

import numpy as np

from .blocks import decoder_block_backward, decoder_block_forward, norm_backward, norm_forward
from .contract import generator
from .losses import cross_entropy_backward, cross_entropy_forward
from .transformer import (append_tokens, block_kwargs, block_param_shapes, check_config,
                          check_config_fields, check_dlogits, check_ids, check_model,
                          check_params, check_sampling, config_from_dict, config_to_dict,
                          embed_backward, embed_forward, float_dtype, init_params,
                          kv_cache_length, lm_head_backward, lm_head_forward, masked_targets,
                          norm_param_shapes, rope_option, token_count, token_id)

__all__ = ["GPTConfig", "init_gpt", "gpt_param_shapes", "gpt_forward", "gpt_backward",
           "gpt_loss", "generate", "kv_cache_size"]


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    """The shape and options of a GPT.

    vocab_size, n_layers, d_model, n_heads: as in the notes (`d_head = d_model / n_heads`)
    n_kv_heads:   key/value heads; None = n_heads (MHA), 1 = MQA, between = GQA (000 §2.2)
    d_ff:         FFN hidden width; None = `4 * d_model`
    max_len:      context length: rows of the learned position table P
    positional:   "learned" (004 eq. 12) | "sinusoidal" (added, 003 §7.2) | "rope" (003 §7.3)
    norm:         "pre" (004 eq. 30) | "post" (004 eq. 31)
    norm_type:    "layernorm" | "rmsnorm";  norm_eps: its epsilon
    activation:   the FFN activation, "gelu" | "relu" | "gelu_tanh" (GPT-2) | "swiglu"
                  (LLaMA's gated FFN, ``swiglu_ffn_forward``; needs bias=False)
    tie_embeddings: the final linear layer reuses the token table (`logits = x E^T`)
    dropout:      rate on the embeddings and on every sublayer output (training only)
    bias:         linear layers and LayerNorm have biases (GPT-2: True, LLaMA: False)
    rope_base, rope_layout, rope_scaling: RoPE's base, pairing ("interleaved" as in the
                  notes, or "half" as LLaMA) and context-extension ``scaling`` dict
                  (``rope_frequencies``)
    """
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int = None
    d_ff: int = None
    max_len: int = 256
    positional: str = "learned"
    norm: str = "pre"
    activation: str = "gelu"
    tie_embeddings: bool = True
    dropout: float = 0.0
    norm_type: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = True
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    rope_scaling: dict = None

    def __post_init__(self):
        check_config_fields(self, "GPTConfig", ("vocab_size", "n_layers"))

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        """A plain dict (JSON-ready) of every field."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of :meth:`to_dict`; unknown keys are an error (a typo would be ignored otherwise)."""
        return config_from_dict(cls, d)

# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------

def gpt_param_shapes(config):
    """``{key: shape}`` of every parameter of a GPT with this config (module docstring)."""
    c = check_config(config, GPTConfig, "gpt_param_shapes")
    s = {"wte": (c.vocab_size, c.d_model)}
    if c.positional == "learned":
        s["wpe"] = (c.max_len, c.d_model)
    for l in range(c.n_layers):
        s.update(block_param_shapes(f"h{l}.", c))
    if c.norm == "pre":
        s.update(norm_param_shapes("norm_f", c))
    if not c.tie_embeddings:
        s["lm_head.W"] = (c.d_model, c.vocab_size)
    return s


def init_gpt(config, *, rng, dtype=np.float32):
    """Initial parameters of a GPT (GPT-2 scheme): a flat ``dict[str, ndarray]``.

    Weights and embedding tables `~ N(0, 0.02^2)`; the residual projections ``attn.Wo`` and
    ``mlp.W2`` `~ N(0, (0.02 / sqrt(2 n_layers))^2)`; biases and betas 0; gammas 1.
    rng: np.random.Generator;  dtype: np.float32 (default) or np.float64
    """
    where = "init_gpt"
    c = check_config(config, GPTConfig, where)
    generator(rng, "rng", where)
    return init_params(gpt_param_shapes(c), c.n_layers, rng=rng, dtype=float_dtype(dtype, where))


def kv_cache_size(kv_cache):
    """Number of floats held by a KV cache: `2 * n_layers * B * n_kv_heads * T * d_head`.

    With GQA/MQA the cache is `n_heads / n_kv_heads` times smaller than with MHA
    (000 §2.2, 001 §2.2).
    """
    return int(sum(layer["k"].size + layer["v"].size for layer in kv_cache))


# ---------------------------------------------------------------------------------------
# Forward / backward
# ---------------------------------------------------------------------------------------

def check_gpt_inputs(params, ids, config, kv_cache, rng, train, where):
    """The checks at the GPT's entry: ``(config, dtype of the params, ids, n_past)``.

    config a GPTConfig; params with the keys and shapes of :func:`gpt_param_shapes`, one
    float dtype; a KV cache of `n_past` positions (0 without one); ids (B, T) in the
    vocabulary, at positions the model has (learned positions stop at max_len); an rng
    when dropout is on.
    """
    c, dtype = check_model(params, config, GPTConfig, gpt_param_shapes, where, rng=rng, train=train)
    n_past = 0 if kv_cache is None else kv_cache_length(kv_cache, c.n_layers, where)
    ids = check_ids(ids, "ids", c.vocab_size, c, where, n_past=n_past)
    return c, dtype, ids, n_past


def gpt_forward(params, ids, *, config, kv_cache=None, rng=None, train=False):
    """Forward pass of a GPT: token ids to next-token logits (module docstring).

        x = E[ids] + P;  x = block_l(x) for l = 0..L-1;  x = N_f(x);  logits = x W_out

    params:   dict from :func:`init_gpt` (float32 or float64; the logits have that dtype)
    ids:      (B, T) ints in `[0, vocab_size)`
    config:   GPTConfig
    kv_cache: None (a whole sequence, positions `0..T-1`), or ``cache["kv_cache"]`` of an
              earlier call: ``ids`` are then the NEW tokens, at positions `n_past..n_past+T-1`,
              attending to the cached keys/values (003 §6.2)
    rng, train: dropout (rng required when train and config.dropout > 0)
    returns logits (B, T, vocab_size), cache

    cache: a flat dict of the steps' caches, named like the parameters: "embed", "h0" ..
    "h{L-1}" (the blocks' caches; ``cache["h0"]["attn"]["weights"]`` are layer 0's
    attention weights), "norm_f" (pre-norm), "lm_head"; and for readers "kv_cache" (list
    per layer of {"k", "v"} of shape (B, n_kv_heads, n_past + T, d_head): pass it back to
    continue decoding), "attn_weights" (list per layer of (B, n_heads, T, n_past + T)),
    "positions" (T,). Raises ValueError for ids outside the vocabulary and, with learned
    positions, for positions beyond `max_len - 1` (sinusoidal and RoPE positions are
    computed for any position). ``gpt_backward`` also works after a cached forward: the
    cached keys and values are constants, the gradient reaches only the new positions.
    """
    c, dtype, ids, n_past = check_gpt_inputs(params, ids, config, kv_cache, rng, train,
                                             "gpt_forward")
    positions = np.arange(n_past, n_past + ids.shape[1])          # absolute positions of ids
    o, rope = block_kwargs(c, rng=rng, train=train), rope_option(c)
    past = [None] * c.n_layers if kv_cache is None else kv_cache
    cache = {"config": c, "options": o, "dtype": dtype, "positions": positions}
    x, cache["embed"] = embed_forward(params, ids, positions, c, rng=rng, train=train)  # E[ids] + P
    for l in range(c.n_layers):                                            # x = block_l(x)
        x, cache[f"h{l}"] = decoder_block_forward(x, None, params, prefix=f"h{l}.", rope=rope,
                                                  kv_cache=past[l], **o)
    if c.norm == "pre":
        x, cache["norm_f"] = norm_forward(x, params, "norm_f", o)          # x = N_f(x)
    logits, cache["lm_head"] = lm_head_forward(x, params, c)               # logits = x W_out
    cache["kv_cache"] = [cache[f"h{l}"]["kv_cache"] for l in range(c.n_layers)]
    cache["attn_weights"] = [cache[f"h{l}"]["attn_weights"] for l in range(c.n_layers)]
    cache["logits_shape"] = logits.shape
    return logits, cache


def gpt_backward(dlogits, cache):
    """Backward of :func:`gpt_forward`: ``dict`` of gradients with the keys of ``params``.

    The forward read bottom to top: final linear, final norm, blocks `L-1..0`, embeddings.
    With tied embeddings ``wte`` gets both the output-layer and the lookup contribution.
    """
    dlogits = check_dlogits(dlogits, cache, "gpt_backward")
    c, o, grads = cache["config"], cache["options"], {}
    dx = lm_head_backward(dlogits, cache["lm_head"], grads, c)             # logits = x W_out
    if c.norm == "pre":
        dx = norm_backward(dx, cache["norm_f"], grads, "norm_f", o)        # x = N_f(x)
    for l in reversed(range(c.n_layers)):
        dx, _, g = decoder_block_backward(dx, cache[f"h{l}"])              # x = block_l(x)
        grads.update(g)
    embed_backward(dx, cache["embed"], grads)                              # x = E[ids] + P
    return grads


def gpt_loss(params, ids, targets, *, config, loss_mask=None, ignore_index=None,
             label_smoothing=0.0, rng=None, train=False):
    """Mean next-token cross-entropy and its gradients: ``(loss, grads)``.

        loss = mean_t -log softmax(logits_t)[targets_t]     (003 §2.1.2)

    ids, targets: (B, T) ints (for language modelling ``targets`` is ``ids`` shifted by
    one, e.g. from ``next_token_arrays``); positions where ``loss_mask`` (B, T) bool is
    False, or whose target is ``ignore_index``, are left out of the mean (prompt, padding).
    loss: a Python float; grads: dict with the keys of ``params``.
    """
    targets, ignore_index = masked_targets(targets, loss_mask, ignore_index, "gpt_loss")
    logits, cache = gpt_forward(params, ids, config=config, rng=rng, train=train)
    loss, c_loss = cross_entropy_forward(logits, targets, label_smoothing=label_smoothing,
                                         ignore_index=ignore_index)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), gpt_backward(dlogits, cache)


# ---------------------------------------------------------------------------------------
# Generation (000 §2.5, 003 §6.1-6.2)
# ---------------------------------------------------------------------------------------

def generate(params, prompt_ids, *, config, max_new_tokens, temperature=1.0, top_k=None,
             top_p=None, rng=None, use_cache=True, eos_id=None, return_logits=False):
    """Autoregressive generation (000 §2.5, 003 §6.1-6.2): append ``max_new_tokens`` tokens.

    Each step feeds the model, takes the logits of the last position and picks the next
    token: greedy (``top_k=1`` or ``temperature=0``) or sampled from
    ``softmax(logits / temperature)`` over the ``top_k`` most likely tokens (all when
    None), then over the nucleus: the smallest set of most likely tokens whose
    probabilities sum to at least ``top_p`` (all when None). Sampling needs ``rng`` (a
    np.random.Generator): without one it is a ValueError, never hidden global randomness.

    use_cache: True runs the prompt once and then one new token per step against the KV
               cache (003 §6.2); False re-runs the whole sequence each step (003 §6.2.1).
               Both give the same tokens.
    eos_id:    optional end-of-sequence id; a row that has produced it is filled with
               ``eos_id`` from then on, and generation stops early when every row has.
    return_logits: also return the logits each step chose from, (B, n_steps, V), where
               `n_steps = max_new_tokens` unless every row reached ``eos_id`` earlier.
    prompt_ids: (B, T) ints  ->  (B, T + max_new_tokens) ints (and the logits)

    With learned positions the model can read at most max_len positions: a request with
    `T + max_new_tokens - 1 > max_len` is a ValueError (no silent sliding window).
    """
    where = "generate"
    c = check_config(config, GPTConfig, where)
    dtype = check_params(params, gpt_param_shapes(c), where)
    prompt_ids = check_ids(prompt_ids, "prompt_ids", c.vocab_size, c, where)
    options = generation_options(c, prompt_ids.shape[1], max_new_tokens, temperature, top_k,
                                 top_p, rng, eos_id, where)
    B, T = prompt_ids.shape
    out = np.empty((B, T + options.pop("max_new_tokens")), dtype=prompt_ids.dtype)
    out[:, :T] = prompt_ids
    kv = None

    def next_logits(n):                       # (B, V): the logits after out[:, :n]
        nonlocal kv
        if not use_cache:
            logits, _ = gpt_forward(params, out[:, :n], config=c)   # the whole sequence again
            return logits[:, -1]
        # prefill with the prompt, then feed one token against the cache (003 §6.2)
        new = out[:, :n] if kv is None else out[:, n - 1:n]
        logits, cache = gpt_forward(params, new, config=c, kv_cache=kv)
        kv = cache["kv_cache"]                # every layer's K, V: n positions now (kv_cache_append)
        return logits[:, -1]

    step_logits = append_tokens(next_logits, out, T, **options)
    if return_logits:
        if not step_logits:   # max_new_tokens = 0
            return out, np.empty((B, 0, c.vocab_size), dtype=dtype)
        return out, np.stack(step_logits, axis=1)
    return out


def generation_options(config, T, max_new_tokens, temperature, top_k, top_p, rng, eos_id, where):
    """:func:`generate`'s options checked, for a prompt of T tokens: a dict of
    ``max_new_tokens`` and :func:`append_tokens`'s keyword arguments (``numpytfmr.fast``
    checks its calls with it too)."""
    max_new_tokens = token_count(max_new_tokens, "max_new_tokens", where)
    temperature, top_k, top_p = check_sampling(temperature, top_k, rng, where, top_p=top_p)
    if eos_id is not None:
        eos_id = token_id(eos_id, "eos_id", config.vocab_size, where)
    if config.positional == "learned" and T + max_new_tokens - 1 > config.max_len:
        raise ValueError(f"{where}: T + max_new_tokens - 1 = {T + max_new_tokens - 1} positions "
                         f"exceed max_len={config.max_len} (prompt T={T}, max_new_tokens="
                         f"{max_new_tokens}); learned positions have no row beyond max_len - 1")
    return {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "rng": rng, "eos_id": eos_id}
