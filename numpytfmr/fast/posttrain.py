"""LoRA and DPO on the fast GPT: the functions of ``numpytfmr.posttrain`` that run the model,
with the same signatures and results, computed with ``numpytfmr.fast``.

The math is the reference's (000 §2.7, 003 §9.2): each adapted weight is merged,
``W' = W + s A B``, the fast GPT runs on the merged weights, and the adapters' gradients
follow from the GPT's weight gradient ``dW'`` by the chain rule::

    dA = s dW' B^T,     dB = s A^T dW'

The sequence log-probabilities of DPO (``log pi(y|x) = sum_t mask_t log p_t(y_t)``) are
computed straight from the logits with one max, one exp pass and one gather, and their
gradient ``mask_t (onehot(y_t) - p_t)`` is written into the logits' buffer.
"""
import numpy as np

from .. import posttrain as reference
from ..lora import lora_scale
from . import checks
from .gpt import generate, gpt_backward, gpt_forward, gpt_loss

__all__ = ["gpt_lora_forward", "gpt_lora_backward", "gpt_lora_loss",
           "completion_logprobs_forward", "completion_logprobs_backward", "dpo_loss_and_grads",
           "complete_prompts", "completion_kl", "merge_adapters"]


def _pairs(params, adapters, where):
    """[(key, A, B)] of an adapter dict, checked against ``params`` (shapes and dtypes)."""
    if not isinstance(adapters, dict) or not adapters:
        raise TypeError(f"{where}: adapters is {type(adapters).__name__}; expected the non-empty "
                        "dict of add_lora")
    out = []
    for name in sorted(adapters):
        if not (isinstance(name, str) and name.endswith((".A", ".B"))):
            raise ValueError(f"{where}: adapters has the key {name!r}; expected keys "
                             "'<weight key>.A' and '<weight key>.B' (add_lora)")
        key = name[:-2]
        other = key + (".B" if name.endswith(".A") else ".A")
        if other not in adapters:
            raise ValueError(f"{where}: adapters has {name!r} but no {other!r}")
        if not name.endswith(".A"):
            continue
        if key not in params:
            raise ValueError(f"{where}: adapters adapt {key!r}, which is not a key of params")
        W, A, B = np.asarray(params[key]), np.asarray(adapters[name]), np.asarray(adapters[other])
        if W.ndim != 2 or A.ndim != 2 or B.ndim != 2 or A.shape[0] != W.shape[0] or \
                B.shape != (A.shape[1], W.shape[1]):
            raise ValueError(f"{where}: adapters for {key!r} have shapes A {A.shape}, B {B.shape} "
                             f"but {key} has shape {W.shape}; expected A (d, r) and B (r, k)")
        if A.dtype != W.dtype or B.dtype != W.dtype:
            raise TypeError(f"{where}: adapters for {key!r} have dtypes {A.dtype}, {B.dtype} but "
                            f"{key} has dtype {W.dtype}; expected the same dtype")
        out.append((key, A, B))
    return out


def merge_adapters(params, adapters, *, alpha, rank_stabilized=False, where="merge_adapters"):
    """(effective params with W' = W + s A B, [(key, A, B, s)])."""
    effective = dict(params)
    pairs = []
    for key, A, B in _pairs(params, adapters, where):
        s = lora_scale(alpha, A.shape[1], rank_stabilized=rank_stabilized)
        effective[key] = params[key] + s * (A @ B)
        pairs.append((key, A, B, s))
    return effective, pairs


def _adapter_grads(grads, pairs):
    """dA = s dW' B^T, dB = s A^T dW' for every adapted weight."""
    out = {}
    for key, A, B, s in pairs:
        dW = grads[key]
        out[key + ".A"] = s * (dW @ B.T)
        out[key + ".B"] = s * (A.T @ dW)
    return out


def gpt_lora_forward(params, adapters, ids, *, config, alpha, rank_stabilized=False,
                     kv_cache=None, rng=None, train=False):
    """As ``numpytfmr.posttrain.gpt_lora_forward``: (logits, cache)."""
    effective, pairs = merge_adapters(params, adapters, alpha=alpha,
                                      rank_stabilized=rank_stabilized, where="gpt_lora_forward")
    logits, cache = gpt_forward(effective, ids, config=config, kv_cache=kv_cache, rng=rng,
                                train=train)
    return logits, {"gpt": cache, "pairs": pairs}


def gpt_lora_backward(dlogits, cache):
    """As ``numpytfmr.posttrain.gpt_lora_backward``: the adapters' gradients (a dict)."""
    return _adapter_grads(gpt_backward(dlogits, cache["gpt"]), cache["pairs"])


def gpt_lora_loss(params, adapters, ids, targets, *, config, alpha, rank_stabilized=False,
                  ignore_index=None, loss_mask=None):
    """As ``numpytfmr.posttrain.gpt_lora_loss``: (loss, adapter grads); the loss and its
    gradient come from the fused softmax-cross-entropy of ``fast.gpt_loss``."""
    effective, pairs = merge_adapters(params, adapters, alpha=alpha,
                                      rank_stabilized=rank_stabilized, where="gpt_lora_loss")
    loss, grads = gpt_loss(effective, ids, targets, config=config, ignore_index=ignore_index,
                           loss_mask=loss_mask)
    return loss, _adapter_grads(grads, pairs)


# ---------------------------------------------------------------------------------------
# Sequence log-probabilities and DPO (003 §9.2)
# ---------------------------------------------------------------------------------------

def _sequence_logprobs(logits, targets, mask):
    """sum_t mask_t log softmax(logits_t)[targets_t] per row, and softmax for the backward
    (the logits' buffer is overwritten with exp(z - max))."""
    B, T, V = logits.shape
    z = logits.reshape(-1, V)
    t = targets.reshape(-1)
    rows = np.arange(z.shape[0])
    m = np.max(z, axis=1)
    z -= m[:, None]
    zt = z[rows, t].astype(np.float64)
    with np.errstate(under="ignore"):
        np.exp(z, out=z)
    s = z @ np.ones(V, z.dtype)
    lp = (zt - np.log(s.astype(np.float64))).reshape(B, T)
    w = mask.astype(np.float64)
    logp = (lp * w).sum(axis=1).astype(logits.dtype)
    z *= (1.0 / s)[:, None]                                        # p = softmax
    return logp, z.reshape(B, T, V)


def completion_logprobs_forward(params, adapters, ids, mask, *, config, alpha=None,
                                rank_stabilized=False):
    """As ``numpytfmr.posttrain.completion_logprobs_forward``: (logp (B,), cache)."""
    where = "completion_logprobs_forward"
    inputs, targets, tmask = reference.completion_inputs(ids, mask, adapters, alpha)
    tmask = tmask.astype(bool)
    pairs = None
    if adapters is None:
        logits, mcache = gpt_forward(params, inputs, config=config)
    else:
        logits, mcache = gpt_lora_forward(params, adapters, inputs, config=config, alpha=alpha,
                                          rank_stabilized=rank_stabilized)
        pairs = mcache["pairs"]
    targets = np.where(tmask, targets, 0)                      # masked positions read id 0
    checks.check_ids(targets, "ids", config.vocab_size, where)
    logp, p = _sequence_logprobs(logits, targets, tmask)
    return logp, {"model": mcache, "p": p, "targets": targets, "mask": tmask, "pairs": pairs}


def completion_logprobs_backward(dlogp, cache):
    """As ``numpytfmr.posttrain.completion_logprobs_backward``: the adapters' gradients."""
    if cache["pairs"] is None:
        raise ValueError("completion_logprobs_backward: the forward ran the frozen base "
                         "(adapters=None); there are no trainable parameters")
    p, targets, mask = cache["p"], cache["targets"], cache["mask"]
    B, T, V = p.shape
    dlogp = np.asarray(dlogp, dtype=np.float64).reshape(B)
    w = (mask * dlogp[:, None]).astype(p.dtype)                    # (B, T)
    dz = p * -w[..., None]                                         # -w p
    flat = dz.reshape(-1, V)
    flat[np.arange(flat.shape[0]), targets.reshape(-1)] += w.reshape(-1)   # + w onehot
    return gpt_lora_backward(dz, cache["model"])


def dpo_loss_and_grads(params, adapters, batch, *, config, alpha, beta=0.1, ref_chosen=None,
                       ref_rejected=None, rank_stabilized=False, loss_type="sigmoid",
                       label_smoothing=0.0, nll_weight=0.0):
    """As ``numpytfmr.posttrain.dpo_loss_and_grads``: (loss, grads, metrics), the same DPO
    step with the log-probabilities of this module."""
    return reference.dpo_loss_and_grads(
        params, adapters, batch, config=config, alpha=alpha, beta=beta, ref_chosen=ref_chosen,
        ref_rejected=ref_rejected, rank_stabilized=rank_stabilized, loss_type=loss_type,
        label_smoothing=label_smoothing, nll_weight=nll_weight,
        logprobs=(completion_logprobs_forward, completion_logprobs_backward))


def complete_prompts(params, ids, prompt_lengths, *, config, max_new_tokens, temperature=0.0,
                     top_k=None, rng=None, batch_size=256, eos_id=2, pad_id=0):
    """As ``numpytfmr.posttrain.complete_prompts``: (seqs, mask), with the fast generate."""
    return reference.complete_prompts(
        params, ids, prompt_lengths, config=config, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, rng=rng, batch_size=batch_size, eos_id=eos_id,
        pad_id=pad_id, decode=generate)


def _log_softmax64(z):
    z = z.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z


def completion_kl(params, adapters, seqs, mask, *, config, alpha, rank_stabilized=False,
                  batch_size=256):
    """As ``numpytfmr.posttrain.completion_kl``: {"kl_per_token", "kl_per_sequence"}."""
    seqs, mask = np.asarray(seqs), np.asarray(mask)
    total, count, per_seq = 0.0, 0, []
    merged, _ = merge_adapters(params, adapters, alpha=alpha, rank_stabilized=rank_stabilized,
                               where="completion_kl")
    for start in range(0, seqs.shape[0], batch_size):
        s, m = seqs[start:start + batch_size], mask[start:start + batch_size, 1:]
        lp, _ = gpt_forward(merged, s[:, :-1], config=config)
        lq, _ = gpt_forward(params, s[:, :-1], config=config)
        lp, lq = _log_softmax64(lp), _log_softmax64(lq)
        kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)               # (b, T-1)
        kl = np.where(m, kl, 0.0)
        total += float(kl.sum())
        count += int(m.sum())
        per_seq.append(kl.sum(axis=-1))
    per_seq = np.concatenate(per_seq) if per_seq else np.zeros(0)
    return {"kl_per_token": total / count if count else 0.0,
            "kl_per_sequence": float(per_seq.mean()) if per_seq.size else 0.0}
