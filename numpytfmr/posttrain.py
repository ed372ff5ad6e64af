"""Post-training a GPT: LoRA adapters inside the model, a scalar reward head, and DPO
(000 §2.7; 003 §9.1.2, §9.2).

LoRA in the model (000 §2.7). Chosen projections of every block -- by default the
queries and values, ``Wq`` and ``Wv``, as in the LoRA paper's main experiments -- get a
low-rank update, everything else stays frozen::

    W' = W + s A B,     A (d, r),  B (r, k),  s = alpha / r       (000 §2.7.2)

The adapters are a flat ``dict`` of arrays keyed by the weight they adapt,
``"h0.attn.Wq.A"``, ``"h0.attn.Wq.B"``, ... (:func:`add_lora`), so the optimizers of
``optim.py`` train them exactly as they train a model. The adapted model forms each
effective weight ``W'`` and runs the plain GPT (:func:`gpt_lora_forward`) -- this is what
the notes' ``LoRALinear`` does too (``F.linear(x, B @ A) * scaling``: the `d x k` product is
formed). Its backward is the GPT's backward followed by the chain rule through ``W'``,
which is exact and costs two thin matmuls per adapted matrix::

    dA = s dW' B^T,     dB = s A^T dW'

Merging (:func:`merge_lora`) stores ``W'`` for inference with no extra cost; unmerging
(:func:`unmerge_lora`) subtracts it again. ``B = 0`` at initialisation, so the adapted
model equals its base bit for bit before the first update.

Reward head (003 §9.1.2): a reward model is the GPT's trunk with the vocabulary head
replaced by one scalar, ``r(x, y) = h_T w_r + b_r``, with ``h_T`` the final (normalised)
hidden state of the last token of ``<bos> x <sep> y <eos>`` -- or the mean over the
sequence's tokens -- trained with the Bradley-Terry loss
``-log sigma(r(x, y_c) - r(x, y_r))``.

DPO (003 §9.2, eq. 9.1): the policy is base + adapters, the reference the frozen base
(the weights before adaptation), and ``log pi(y|x)`` sums the log-probabilities of the
completion tokens (``sequence_logprobs_forward``). :func:`dpo_loss_and_grads` is one
training step's loss and adapter gradients; :func:`completion_kl` measures how far the
policy has moved from the reference.
"""
import numpy as np

from .activations import log_softmax
from .blocks import decoder_block_backward, decoder_block_forward, norm_backward, norm_forward
from .contract import backward_of, count, describe, float_array, generator, one_of, op
from .gpt import GPTConfig, generate, gpt_backward, gpt_forward, gpt_param_shapes, init_gpt
from .lora import lora_init, lora_merge, lora_scale, lora_unmerge
from .losses import cross_entropy_backward, cross_entropy_forward
from .preference import (bradley_terry_loss_backward, bradley_terry_loss_forward, dpo_loss_backward,
                         dpo_loss_forward, dpo_metrics, sequence_logprobs_backward,
                         sequence_logprobs_forward)
from .transformer import (block_kwargs, check_config, check_ids, check_params, embed_backward,
                          embed_forward, rope_option)

__all__ = [
    "LORA_TARGETS", "lora_target_keys", "add_lora", "merge_lora", "unmerge_lora",
    "lora_parameter_counts", "lora_trainable_fraction",
    "gpt_lora_forward", "gpt_lora_backward", "gpt_lora_loss",
    "reward_head_forward", "reward_head_backward", "init_reward_model",
    "reward_model_forward", "reward_model_backward", "reward_model_loss",
    "completion_logprobs_forward", "completion_logprobs_backward", "dpo_loss_and_grads",
    "complete_prompts", "preference_pairs_from_samples", "completion_kl",
]

# Projection name -> (sublayer, weight) inside block h{l}.
LORA_TARGETS = {"Wq": "attn.Wq", "Wk": "attn.Wk", "Wv": "attn.Wv", "Wo": "attn.Wo",
                "W1": "mlp.W1", "W2": "mlp.W2"}
REWARD_KEYS = ("reward.w", "reward.b")
POOLINGS = ("last", "mean")


# ---------------------------------------------------------------------------------------
# LoRA in the model (000 §2.7)
# ---------------------------------------------------------------------------------------

def lora_target_keys(config, targets=("Wq", "Wv")):
    """The parameter keys LoRA adapts: ``h{l}.attn.Wq`` etc. for every block ``l``.

    targets: projection names among ``"Wq", "Wk", "Wv", "Wo"`` (attention) and
    ``"W1", "W2"`` (FFN). Returns a list of keys, block by block.
    """
    where = "lora_target_keys"
    c = check_config(config, GPTConfig, where)
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    if not targets:
        raise ValueError(f"{where}: targets is empty; expected projection names among "
                         f"{', '.join(LORA_TARGETS)}")
    for t in targets:
        one_of(*LORA_TARGETS)(t, "targets", where)
    if len(set(targets)) != len(targets):
        raise ValueError(f"{where}: targets {targets} repeats a name; expected each once")
    return [f"h{l}.{LORA_TARGETS[t]}" for l in range(c.n_layers) for t in targets]


def add_lora(params, config, *, r, rng, targets=("Wq", "Wv"), init="kaiming_uniform"):
    """New LoRA adapters for a GPT: ``{"<key>.A": (d, r), "<key>.B": (r, k)}`` per adapted
    weight ``<key>`` (000 §2.7.2; ``lora_init``: `A` random, `B = 0`).

    params:  the base model (``init_gpt`` dict; not modified, only read for shapes and dtype)
    r:       the rank;  targets: projections to adapt (:func:`lora_target_keys`), default
             the queries and values;  rng: np.random.Generator;  init: ``lora_init``'s init
    The scaling ``alpha`` is an option of the functions that use the adapters.
    """
    where = "add_lora"
    c = check_config(config, GPTConfig, where)
    r = count(r, "r", where)
    generator(rng, "rng", where)
    dtype = _base_dtype(params, c, where)
    adapters = {}
    for key in lora_target_keys(c, targets):
        d, k = params[key].shape
        if r > min(d, k):
            raise ValueError(f"{where}: r is {r} but {key} has shape {(d, k)}; expected "
                             f"r <= min(d, k) = {min(d, k)} (a low-rank update)")
        A, B = lora_init(d, k, r, rng=rng, init=init, dtype=dtype)
        adapters[key + ".A"], adapters[key + ".B"] = A, B
    return adapters


def _base_dtype(params, c, where):
    """Check the GPT's parameters in ``params`` against the config (keys and shapes; other
    keys, such as a reward head's, are let through); return their float dtype."""
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params is a {type(params).__name__}; expected a dict of arrays")
    shapes = gpt_param_shapes(c)
    return check_params({k: a for k, a in params.items() if k in shapes}, shapes, where)


def _adapter_pairs(params, adapters, where):
    """``[(key, A, B)]`` of an adapter dict, checked against ``params``."""
    if not isinstance(adapters, dict) or not adapters:
        raise TypeError(f"{where}: adapters is {describe(adapters)}; expected the non-empty "
                        "dict of add_lora")
    pairs = []
    for name in adapters:
        if not (isinstance(name, str) and name.endswith((".A", ".B"))):
            raise ValueError(f"{where}: adapters has the key {name!r}; expected keys "
                             "'<weight key>.A' and '<weight key>.B' (add_lora)")
    for name in sorted(adapters):
        if not name.endswith(".A"):
            continue
        key = name[:-2]
        if key + ".B" not in adapters:
            raise ValueError(f"{where}: adapters has {name!r} but no {key + '.B'!r}")
        if key not in params:
            raise ValueError(f"{where}: adapters adapt {key!r}, which is not a key of params")
        W = float_array(params[key], f"params[{key!r}]", where)
        A = float_array(adapters[name], f"adapters[{name!r}]", where)
        B = float_array(adapters[key + ".B"], f"adapters[{key + '.B'!r}]", where)
        if W.ndim != 2 or A.ndim != 2 or B.ndim != 2 or A.shape[0] != W.shape[0] or \
                B.shape != (A.shape[1], W.shape[1]):
            raise ValueError(f"{where}: adapters for {key!r} have shapes A {A.shape}, B {B.shape} "
                             f"but {key} has shape {np.shape(W)}; expected A (d, r) and B (r, k) "
                             "for W (d, k)")
        if A.dtype != W.dtype or B.dtype != W.dtype:
            raise TypeError(f"{where}: adapters for {key!r} have dtypes {A.dtype}, {B.dtype} but "
                            f"{key} has dtype {W.dtype}; expected the same dtype")
        pairs.append((key, A, B))
    orphans = [n for n in adapters if n.endswith(".B") and n[:-2] + ".A" not in adapters]
    if orphans:
        raise ValueError(f"{where}: adapters has {orphans[0]!r} but no {orphans[0][:-2] + '.A'!r}")
    return pairs


def merge_lora(params, adapters, *, alpha, rank_stabilized=False):
    """The adapted model as plain GPT parameters: ``W' = W + s A B`` for each adapted
    weight (000 §2.7.1; ``lora_merge``), every other array shared with ``params``.

    The result is a new dict (``params`` is not modified) that ``gpt_forward`` and
    ``generate`` run with no extra cost: merging for inference.
    """
    out = dict(params)
    for key, A, B in _adapter_pairs(params, adapters, "merge_lora"):
        out[key] = lora_merge(params[key], A, B, alpha=alpha, rank_stabilized=rank_stabilized)
    return out


def unmerge_lora(merged, adapters, *, alpha, rank_stabilized=False):
    """Undo :func:`merge_lora`: ``W = W' - s A B`` (equal to the base up to rounding)."""
    out = dict(merged)
    for key, A, B in _adapter_pairs(merged, adapters, "unmerge_lora"):
        out[key] = lora_unmerge(merged[key], A, B, alpha=alpha, rank_stabilized=rank_stabilized)
    return out


def lora_parameter_counts(params, adapters):
    """Trainable vs. frozen parameters (000 §2.7.2, summed over the adapted weights).

    Returns a dict of ints and one float:
        ``"lora"``      sum of ``d r + r k`` over the adapted weights (what is trained)
        ``"adapted"``   sum of ``d k`` over the same weights (what full fine-tuning of
                        those matrices would train)
        ``"base"``      every parameter of the base model (all frozen)
        ``"fraction"``  ``lora / base``: the share of the model's size that is trained
    """
    pairs = _adapter_pairs(params, adapters, "lora_parameter_counts")
    lora = sum(A.size + B.size for _, A, B in pairs)
    adapted = sum(params[key].size for key, _, _ in pairs)
    base = sum(int(np.size(p)) for p in params.values())
    return {"lora": int(lora), "adapted": int(adapted), "base": int(base),
            "fraction": lora / base}


def lora_trainable_fraction(params, adapters):
    """Trained parameters as a fraction of the base model's: ``lora / base``."""
    return lora_parameter_counts(params, adapters)["fraction"]


def gpt_lora_forward(params, adapters, ids, *, config, alpha, rank_stabilized=False,
                     kv_cache=None, rng=None, train=False):
    """Forward pass of a GPT with LoRA adapters (000 §2.7.2, "Forward Pass Computation").

        W' = W + s A B  for each adapted weight,   logits = GPT(ids; W')

    params: the frozen base (``init_gpt`` dict);  adapters: :func:`add_lora` dict;
    ids: (B, T) ints;  alpha: LoRA's alpha (``s = alpha / r``, or ``alpha / sqrt(r)``
    with ``rank_stabilized``);  kv_cache, rng, train: as in ``gpt_forward``.
    returns logits (B, T, vocab_size), cache

    cache keys: "gpt" (the ``gpt_forward`` cache: "kv_cache", "attn_weights", ...),
    "pairs" (list of (key, A, B)), "scale" (dict key -> s).
    """
    where = "gpt_lora_forward"
    c = check_config(config, GPTConfig, where)
    pairs = _adapter_pairs(params, adapters, where)
    effective = dict(params)
    scale = {}
    for key, A, B in pairs:
        s = lora_scale(alpha, A.shape[1], rank_stabilized=rank_stabilized)
        effective[key] = params[key] + s * (A @ B)      # W' = W + s A B (exactly W when B = 0)
        scale[key] = s
    logits, cache = gpt_forward(effective, ids, config=c, kv_cache=kv_cache, rng=rng, train=train)
    return logits, {"gpt": cache, "pairs": pairs, "scale": scale}


def gpt_lora_backward(dlogits, cache):
    """Backward of :func:`gpt_lora_forward`: a dict with the keys of ``adapters``.

    The base weights are frozen and get no gradient. Through ``W' = W + s A B``:
    ``dA = s dW' B^T``, ``dB = s A^T dW'`` with ``dW'`` the GPT's weight gradient.
    """
    grads = gpt_backward(dlogits, cache["gpt"])
    out = {}
    for key, A, B in cache["pairs"]:
        s, dW = cache["scale"][key], grads[key]
        out[key + ".A"] = s * (dW @ B.T)                # dA = s dW' B^T
        out[key + ".B"] = s * (A.T @ dW)                # dB = s A^T dW'
    return out


def gpt_lora_loss(params, adapters, ids, targets, *, config, alpha, rank_stabilized=False,
                  ignore_index=None, loss_mask=None):
    """Mean next-token cross-entropy of the adapted model and its adapter gradients:
    ``(loss, grads)`` (``gpt_loss`` with LoRA; only the adapters are trained).

    ids, targets: (B, T) ints; positions whose target is ``ignore_index``, or where the
    optional (B, T) bool ``loss_mask`` is False, are left out of the mean.
    """
    if loss_mask is not None:
        loss_mask = np.asarray(loss_mask, dtype=bool)
        ignore_index = -1 if ignore_index is None else ignore_index
        targets = np.where(loss_mask, targets, ignore_index)
    logits, cache = gpt_lora_forward(params, adapters, ids, config=config, alpha=alpha,
                                     rank_stabilized=rank_stabilized)
    loss, c_loss = cross_entropy_forward(logits, targets, ignore_index=ignore_index)
    dlogits, _ = cross_entropy_backward(1.0, c_loss)
    return float(loss), gpt_lora_backward(dlogits, cache)


# ---------------------------------------------------------------------------------------
# Reward head and reward model (003 §9.1.2)
# ---------------------------------------------------------------------------------------

def _scalar_bias(b_r, name, where, args):
    """None, or a scalar of shape () or (1,)."""
    if b_r is not None and b_r.shape not in ((), (1,)):
        raise ValueError(f"{where}: b_r has shape {b_r.shape}; expected a scalar, shape () or (1,)")
    return b_r


def _token_mask(mask, name, where, args):
    """None, or one bool per token of h: the shape of h without its last axis."""
    h = args["h"]
    if mask is not None and mask.shape != h.shape[:-1]:
        raise ValueError(f"{where}: mask is {describe(mask)}; expected a bool array of "
                         f"shape {h.shape[:-1]} (True = token of the sequence)")
    return mask


@op("h: (..., T, d)", "w_r: (d,)", "b_r: (...)?", "mask: bool (..., T)?", b_r=_scalar_bias,
    mask=_token_mask, pooling=one_of(*POOLINGS))
def reward_head_forward(h, w_r, b_r=None, *, mask=None, pooling="last"):
    """Scalar reward head (003 §9.1.2): one score per sequence from its hidden states.

        "last":  r = h_t* w_r + b_r,                         t* = last position where mask
        "mean":  r = (sum_t mask_t h_t / sum_t mask_t) w_r + b_r

    Both are ``r = (sum_t a_t h_t) w_r + b_r`` with pooling weights ``a_t``: one-hot at t*
    for "last", ``mask_t / sum mask`` for "mean". "last" reads the final token (the
    ``<eos>`` of ``<bos> x <sep> y <eos>``), whose state has attended to the whole
    sequence through the causal mask: the usual choice of reward models (InstructGPT).
    "mean" pools every counted token.

    h: (..., T, d) hidden states   w_r: (d,)   b_r: () or (1,), or None
    mask: (..., T) bool, True at the tokens of the sequence (not padding); None = all T
    -> r: (...,)

    cache keys: "pooled" (..., d), "weights" (..., T) the pooling weights `a_t`, "w_r",
    "b_shape".
    """
    if mask is None:
        mask = np.ones(h.shape[:-1], bool)                       # every token counts
    n = mask.sum(axis=-1)                                        # tokens per sequence
    if np.any(n == 0):
        raise ValueError("reward_head_forward: mask has a row with no True entry; expected at "
                         "least one token per sequence")
    T = h.shape[-2]
    if pooling == "last":
        last = T - 1 - np.argmax(mask[..., ::-1], axis=-1)       # t*: the last True of each row
        a = (np.arange(T) == last[..., None]) * 1.0              # a_t one-hot at t*
    else:
        a = mask / n[..., None]                                  # a_t = mask_t / sum mask
    pooled = np.einsum("...t,...td->...d", a, h)                 # sum_t a_t h_t
    r = pooled @ w_r                                             # r = pooled w_r
    if b_r is not None:
        r = r + b_r.reshape(())                                  #     + b_r
    return r, {"pooled": pooled, "weights": a, "w_r": w_r,
               "b_shape": None if b_r is None else b_r.shape}


@backward_of(reward_head_forward)
def reward_head_backward(dr, cache):
    """Backward of :func:`reward_head_forward` -> ``(dh, dw_r, db_r)`` (db_r None without b_r).

        dpooled = dr w_r,   dw_r = sum over sequences dr pooled,   db_r = sum dr
        dh_t = a_t dpooled
    """
    pooled, a, w_r = cache["pooled"], cache["weights"], cache["w_r"]
    dpooled = dr[..., None] * w_r                                      # r = pooled w_r
    dw = pooled.reshape(-1, pooled.shape[-1]).T @ dr.reshape(-1)       # dw = sum pooled^T dr
    db = None if cache["b_shape"] is None else np.full(cache["b_shape"], dr.sum())   # dr/db = 1
    dh = a[..., :, None] * dpooled[..., None, :]                       # pooled = sum_t a_t h_t
    return dh, dw, db


def init_reward_model(config, *, rng, params=None, dtype=np.float32):
    """A reward model: a GPT trunk (``params`` of a trained GPT, or a fresh ``init_gpt``)
    plus a head ``"reward.w"`` (d_model,) `~ N(0, 1/d_model)` and ``"reward.b"`` (1,) = 0
    (shape (1,) rather than () so that the optimizers' updates stay arrays).

    The GPT's own vocabulary head (``lm_head.W``, or the tied table's output role) is
    unused by the reward. Returns a new dict; ``params`` is not modified.
    """
    where = "init_reward_model"
    c = check_config(config, GPTConfig, where)
    generator(rng, "rng", where)
    if params is None:
        params = init_gpt(c, rng=rng, dtype=dtype)
    dtype = _base_dtype(params, c, where)
    w = rng.standard_normal(c.d_model) / np.sqrt(c.d_model)
    return {**params, "reward.w": w.astype(dtype), "reward.b": np.zeros(1, dtype=dtype)}


def check_reward_inputs(params, ids, config, where):
    """The checks at the reward model's entry: ``(config, dtype, trunk, ids)``, trunk the
    GPT's parameters (``params`` without the head, checked against the config)."""
    c = check_config(config, GPTConfig, where)
    missing = [k for k in REWARD_KEYS if k not in params]
    if missing:
        raise ValueError(f"{where}: params has no {missing}; expected the dict of "
                         "init_reward_model")
    trunk = {k: p for k, p in params.items() if k not in REWARD_KEYS}
    dtype = check_params(trunk, gpt_param_shapes(c), where)
    return c, dtype, trunk, check_ids(ids, "ids", c.vocab_size, c, where)


def reward_model_forward(params, ids, *, config, mask=None, pooling="last", pad_id=0):
    """Reward of each sequence (003 §9.1.2): the GPT's trunk, then the scalar head.

        x = E[ids] + P;  x = block_l(x) for l = 0..L-1;  h = N_f(x);  r = head(h)

    params: GPT parameters plus ``"reward.w"``, ``"reward.b"`` (:func:`init_reward_model`)
    ids: (B, T) ints;  mask: (B, T) bool, True at real tokens (default ``ids != pad_id``,
    the tokenizers' ``<pad>`` is 0)
    -> r: (B,), cache: the steps' caches "embed", "h0" .. "h{L-1}", "norm_f" (pre-norm),
    "reward" (the head's), as in ``gpt_forward``
    """
    c, dtype, trunk, ids = check_reward_inputs(params, ids, config, "reward_model_forward")
    mask = ids != pad_id if mask is None else mask
    o, rope = block_kwargs(c, rng=None, train=False), rope_option(c)
    cache = {"config": c, "options": o, "dtype": dtype, "shapes": gpt_param_shapes(c)}
    x, cache["embed"] = embed_forward(trunk, ids, np.arange(ids.shape[1]), c)        # E[ids] + P
    for l in range(c.n_layers):
        x, cache[f"h{l}"] = decoder_block_forward(x, None, trunk, prefix=f"h{l}.", rope=rope,
                                                  **o)                                # x = block_l(x)
    if c.norm == "pre":
        x, cache["norm_f"] = norm_forward(x, trunk, "norm_f", o)                     # h = N_f(x)
    r, cache["reward"] = reward_head_forward(x, params["reward.w"], params["reward.b"],
                                             mask=mask, pooling=pooling)              # r = head(h)
    return r, cache


def reward_model_backward(dr, cache):
    """Backward of :func:`reward_model_forward`: a dict with every key of ``params``
    (zeros for the unused vocabulary head ``lm_head.W``)."""
    c, o, grads = cache["config"], cache["options"], {}
    dx, grads["reward.w"], grads["reward.b"] = reward_head_backward(dr, cache["reward"])  # head(h)
    if c.norm == "pre":
        dx = norm_backward(dx, cache["norm_f"], grads, "norm_f", o)                  # h = N_f(x)
    for l in reversed(range(c.n_layers)):
        dx, _, g = decoder_block_backward(dx, cache[f"h{l}"])                        # x = block_l(x)
        grads.update(g)
    embed_backward(dx, cache["embed"], grads)                                        # E[ids] + P
    for k, shape in cache["shapes"].items():
        if k not in grads:                  # the vocabulary head takes no part in the reward
            grads[k] = np.zeros(shape, grads["reward.w"].dtype)
    return grads


def reward_model_loss(params, chosen_ids, rejected_ids, *, config, chosen_mask=None,
                      rejected_mask=None, pooling="last", pad_id=0):
    """Bradley-Terry loss of a reward model on preference pairs (003 §9.1.2):
    ``(loss, grads, metrics)``.

        loss = mean_i -log sigma(r(x_i, y_c,i) - r(x_i, y_r,i))

    chosen_ids, rejected_ids: (B, T) whole sequences ``<bos> x <sep> y <eos> <pad>...``;
    masks: True at the tokens the reward reads (default: ``ids != pad_id``). Both halves go
    through the model in one batch. metrics: "accuracy" (fraction with `r_c > r_r`),
    "margin" (mean `r_c - r_r`).
    """
    chosen_ids, rejected_ids = np.asarray(chosen_ids), np.asarray(rejected_ids)
    if chosen_ids.shape != rejected_ids.shape:
        raise ValueError(f"reward_model_loss: rejected_ids has shape {rejected_ids.shape} but "
                         f"chosen_ids has shape {chosen_ids.shape}; expected the same shape")
    n = chosen_ids.shape[0]
    cm = chosen_ids != pad_id if chosen_mask is None else np.asarray(chosen_mask)
    rm = rejected_ids != pad_id if rejected_mask is None else np.asarray(rejected_mask)
    r, cache = reward_model_forward(params, np.concatenate([chosen_ids, rejected_ids]),
                                    config=config, mask=np.concatenate([cm, rm]), pooling=pooling)
    loss, lcache = bradley_terry_loss_forward(r[:n], r[n:])
    dc, drj = bradley_terry_loss_backward(1.0, lcache)
    grads = reward_model_backward(np.concatenate([dc, drj]), cache)
    d = r[:n] - r[n:]
    return float(loss), grads, {"accuracy": float(np.mean(d > 0)), "margin": float(np.mean(d))}


# ---------------------------------------------------------------------------------------
# DPO with LoRA (003 §9.2)
# ---------------------------------------------------------------------------------------

def completion_logprobs_forward(params, adapters, ids, mask, *, config, alpha=None,
                                rank_stabilized=False):
    """``log pi(y | x)`` of each sequence: the sum of the log-probabilities of its
    completion tokens under the GPT (with LoRA adapters, or the plain base when
    ``adapters`` is None) -- the ``log pi_theta(y|x)`` and ``log pi_ref(y|x)`` of DPO
    (003 eq. 9.1).

        log pi(y|x) = sum_t mask_t log softmax(GPT(ids[:, :-1]))[t, ids[t+1]]

    ids: (B, T) ``<bos> x <sep> y <eos> <pad>...``;  mask: (B, T) bool, True at the
    completion tokens ``y`` and the ``<eos>`` (``make_task``'s ``loss_mask`` layout).
    -> logp: (B,), cache ("model", "logp", "has_adapters")
    """
    inputs, targets, tmask = completion_inputs(ids, mask, adapters, alpha)
    if adapters is None:
        logits, mcache = gpt_forward(params, inputs, config=config)
    else:
        logits, mcache = gpt_lora_forward(params, adapters, inputs, config=config, alpha=alpha,
                                          rank_stabilized=rank_stabilized)
    logp, lcache = sequence_logprobs_forward(logits, targets, tmask)
    return logp, {"model": mcache, "logp": lcache, "has_adapters": adapters is not None}


def completion_inputs(ids, mask, adapters, alpha):
    """:func:`completion_logprobs_forward`'s arguments checked, and split for next-token
    prediction (token t+1 from tokens <= t): (inputs, targets, mask) = (ids[:, :-1],
    ids[:, 1:], mask[:, 1:]). ``numpytfmr.fast`` checks its calls with it too."""
    where = "completion_logprobs_forward"
    ids, mask = np.asarray(ids), np.asarray(mask)
    if ids.ndim != 2 or ids.shape[1] < 2 or mask.shape != ids.shape:
        raise ValueError(f"{where}: ids has shape {ids.shape} and mask {mask.shape}; expected "
                         "equal shapes (B, T) with T >= 2")
    if adapters is not None and alpha is None:
        raise ValueError(f"{where}: adapters are given but alpha is None; expected LoRA's alpha")
    return ids[:, :-1], ids[:, 1:], mask[:, 1:]


def completion_logprobs_backward(dlogp, cache):
    """Backward of :func:`completion_logprobs_forward`: the adapters' gradients (a dict).

    The base weights are frozen; with ``adapters=None`` there is nothing to train and
    this is a ValueError.
    """
    if not cache["has_adapters"]:
        raise ValueError("completion_logprobs_backward: the forward ran the frozen base "
                         "(adapters=None); there are no trainable parameters")
    dlogits, _, _ = sequence_logprobs_backward(dlogp, cache["logp"])
    return gpt_lora_backward(dlogits, cache["model"])


def dpo_loss_and_grads(params, adapters, batch, *, config, alpha, beta=0.1, ref_chosen=None,
                       ref_rejected=None, rank_stabilized=False, loss_type="sigmoid",
                       label_smoothing=0.0, nll_weight=0.0, logprobs=None):
    """One DPO step (003 §9.2, eq. 9.1) for LoRA adapters: ``(loss, grads, metrics)``.

        pc, pr = log pi_theta(y_c|x), log pi_theta(y_r|x)     policy = base + adapters
        rc, rr = log pi_ref(y_c|x),   log pi_ref(y_r|x)       reference = the frozen base
        loss   = mean -log sigma(beta ((pc - rc) - (pr - rr)))

    batch: dict with "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask" (B, T)
    (``make_preference_pairs`` layout). ref_chosen, ref_rejected: (B,) reference
    log-probs if already known (they never change, so a training run computes them once);
    None computes them with ``params`` alone. Chosen and rejected go through the policy
    in one batch of `2B` sequences.
    nll_weight: ``w >= 0`` adds ``w`` times the negative log-likelihood per token of the
    chosen completions, ``-sum_i pc_i / (number of chosen tokens)`` -- DPO + NLL, the RPO
    objective (Pang et al. 2024; TRL's ``rpo_alpha``). Plain DPO can lower the likelihood
    of the chosen answers too, as long as the rejected ones fall faster; the NLL term keeps
    the chosen answers likely. 0 (default) is eq. 9.1 alone.
    grads: dict with the keys of ``adapters``; metrics: ``dpo_metrics`` plus
    "logps/chosen", "logps/rejected" (policy means) and "nll".
    logprobs: None (the pair completion_logprobs_forward/_backward above), or another pair
    with their signatures (the fast path passes its own).
    """
    logprobs_forward, logprobs_backward = logprobs or (completion_logprobs_forward,
                                                       completion_logprobs_backward)
    ci, cm = np.asarray(batch["chosen_ids"]), np.asarray(batch["chosen_mask"])
    ri, rm = np.asarray(batch["rejected_ids"]), np.asarray(batch["rejected_mask"])
    if ci.shape != ri.shape:
        raise ValueError(f"dpo_loss_and_grads: rejected_ids has shape {ri.shape} but chosen_ids "
                         f"has shape {ci.shape}; expected the same (B, T)")
    n = ci.shape[0]
    ids, mask = np.concatenate([ci, ri]), np.concatenate([cm, rm])
    if ref_chosen is None or ref_rejected is None:
        ref, _ = logprobs_forward(params, None, ids, mask, config=config)
        ref_chosen, ref_rejected = ref[:n], ref[n:]
    logp, cache = logprobs_forward(params, adapters, ids, mask, config=config, alpha=alpha,
                                   rank_stabilized=rank_stabilized)
    dtype = logp.dtype
    loss, dcache = dpo_loss_forward(logp[:n], logp[n:], np.asarray(ref_chosen, dtype=dtype),
                                    np.asarray(ref_rejected, dtype=dtype), beta=beta,
                                    loss_type=loss_type, label_smoothing=label_smoothing)
    d_pc, d_pr, _, _ = dpo_loss_backward(1.0, dcache)
    nll = 0.0
    if nll_weight:
        # + w * NLL of the chosen completions per token: -w sum_i pc_i / sum_i |y_c,i|
        n_tok = max(int(cm[:, 1:].sum()), 1)
        nll = -float(np.sum(logp[:n])) / n_tok
        d_pc = d_pc - (nll_weight / n_tok)
        loss = loss + nll_weight * nll
    grads = logprobs_backward(np.concatenate([d_pc, d_pr]), cache)
    metrics = dpo_metrics(dcache)
    metrics.update({"logps/chosen": float(np.mean(logp[:n])),
                    "logps/rejected": float(np.mean(logp[n:])), "nll": nll})
    return float(loss), grads, metrics


def complete_prompts(params, ids, prompt_lengths, *, config, max_new_tokens, temperature=0.0,
                     top_k=None, rng=None, batch_size=256, eos_id=2, pad_id=0, decode=None):
    """Continue the prompts ``ids[i, :L_i]`` until ``<eos>`` (``generate`` with the KV cache):
    greedy by default, or sampled with ``temperature``/``top_k`` and ``rng``.

    ids: (n, T) rows starting with a prompt of length ``prompt_lengths[i]`` (e.g. a
    ``make_task`` dict's "ids" and "prompt_lengths"). Prompts of one length are generated
    together, ``batch_size`` at a time. eos_id, pad_id: the ``<eos>`` and ``<pad>`` ids
    (2 and 0 in the package's tokenizers). Returns ``(seqs, mask)``: (n, W) ids
    ``prompt, completion`` then ``<pad>``, ``W = max(L_i) + max_new_tokens``, and the bool
    mask of the completion tokens up to and including the first ``<eos>`` (all
    ``max_new_tokens`` of them when none came) -- the layout that
    :func:`completion_logprobs_forward` and :func:`completion_kl` read.
    decode: None (``generate``), or a function with ``generate``'s signature (the fast path
    passes its own).
    """
    where = "complete_prompts"
    decode = decode or generate
    batch_size = count(batch_size, "batch_size", where)
    ids, prompt_lengths = np.asarray(ids), np.asarray(prompt_lengths)
    if ids.ndim != 2 or prompt_lengths.shape != (ids.shape[0],):
        raise ValueError(f"{where}: ids has shape {ids.shape} and prompt_lengths "
                         f"{prompt_lengths.shape}; expected (n, T) and (n,)")
    n = ids.shape[0]
    width = int(prompt_lengths.max()) + max_new_tokens
    seqs = np.full((n, width), pad_id, dtype=np.int64)
    mask = np.zeros((n, width), dtype=bool)
    for L in np.unique(prompt_lengths).tolist():      # generate takes prompts of one length
        rows = np.flatnonzero(prompt_lengths == L)
        for idx in (rows[i:i + batch_size] for i in range(0, rows.size, batch_size)):
            out = decode(params, ids[idx, :L], config=config, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_k=top_k, rng=rng, eos_id=eos_id)
            new = out[:, L:]
            # keep the tokens up to and including the first <eos>
            is_eos = new == eos_id
            first = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1), new.shape[1] - 1)
            keep = np.arange(new.shape[1]) <= first[:, None]
            seqs[idx, :L] = ids[idx, :L]
            seqs[idx, L:L + new.shape[1]] = np.where(keep, new, pad_id)
            mask[idx, L:L + new.shape[1]] = keep
    return seqs, mask


def preference_pairs_from_samples(seqs, mask, prompt_index, preferred):
    """Preference pairs (003 §9.1.1: sample several responses per prompt, rank them) from
    sampled completions labelled by a verifier.

    seqs, mask: (n, W) sampled sequences and completion masks (:func:`complete_prompts`)
    prompt_index: (n,) ints, the prompt each sample continues
    preferred: (n,) bool, True when the sample shows the preferred behaviour
    For every prompt with at least one preferred and one other sample, the first of each
    becomes a pair (chosen, rejected); prompts whose samples all agree give no pair.
    Returns a dict "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask" (m, W) and
    "prompt_index" (m,) -- the batch layout of :func:`dpo_loss_and_grads`.
    """
    where = "preference_pairs_from_samples"
    seqs, mask = np.asarray(seqs), np.asarray(mask)
    prompt_index, preferred = np.asarray(prompt_index), np.asarray(preferred, dtype=bool)
    n = seqs.shape[0]
    if mask.shape != seqs.shape or prompt_index.shape != (n,) or preferred.shape != (n,):
        raise ValueError(f"{where}: seqs {seqs.shape}, mask {mask.shape}, prompt_index "
                         f"{prompt_index.shape}, preferred {preferred.shape}; expected (n, W), "
                         "(n, W), (n,), (n,)")
    chosen, rejected = {}, {}
    for row in range(n):           # first preferred and first other sample of each prompt
        target = chosen if preferred[row] else rejected
        target.setdefault(int(prompt_index[row]), row)
    prompts = sorted(set(chosen) & set(rejected))
    c_rows = np.array([chosen[p] for p in prompts], dtype=np.int64)
    r_rows = np.array([rejected[p] for p in prompts], dtype=np.int64)
    return {"chosen_ids": seqs[c_rows], "chosen_mask": mask[c_rows],
            "rejected_ids": seqs[r_rows], "rejected_mask": mask[r_rows],
            "prompt_index": np.array(prompts, dtype=np.int64)}


def completion_kl(params, adapters, seqs, mask, *, config, alpha, rank_stabilized=False,
                  batch_size=256):
    """KL divergence of the adapted policy from the reference (the base) along given
    completions (003 §9.1: the ``KL(pi || pi_0)`` that DPO's implicit objective bounds).

    At every position `t` that predicts a completion token (``mask[:, t+1]``):

        KL_t = sum_v pi(v | y_<t) (log pi(v | y_<t) - log pi_ref(v | y_<t))

    the exact KL of the two next-token distributions given the same prefix.
    Returns ``{"kl_per_token": mean of KL_t over every counted position,
    "kl_per_sequence": mean over sequences of sum_t KL_t}``. With ``seqs`` the policy's own
    greedy completions (:func:`complete_prompts` of the merged model), this is a
    per-token estimate of ``KL(pi || pi_ref)`` along the policy's typical outputs.
    """
    seqs, mask = np.asarray(seqs), np.asarray(mask)
    total, count, per_seq = 0.0, 0, []
    merged = merge_lora(params, adapters, alpha=alpha, rank_stabilized=rank_stabilized)
    for start in range(0, seqs.shape[0], batch_size):
        s, m = seqs[start:start + batch_size], mask[start:start + batch_size, 1:]
        lp, _ = gpt_forward(merged, s[:, :-1], config=config)
        lq, _ = gpt_forward(params, s[:, :-1], config=config)
        lp, lq = log_softmax(lp.astype(np.float64)), log_softmax(lq.astype(np.float64))
        kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)                   # (b, T-1)
        kl = np.where(m, kl, 0.0)
        total += float(kl.sum())
        count += int(m.sum())
        per_seq.append(kl.sum(axis=-1))
    per_seq = np.concatenate(per_seq) if per_seq else np.zeros(0)
    return {"kl_per_token": total / count if count else 0.0,
            "kl_per_sequence": float(per_seq.mean()) if per_seq.size else 0.0}
