"""Common mistakes, per op, as variants of the reference output.

Each entry is ``(sentence, thunk)``: ``thunk()`` computes what a submission with that mistake
returns on the case; when a submission's wrong output equals it, the sentence is the
feedback. The generic variants of :mod:`.compare` (a factor from the shapes, an option left
out or changed) catch many more; the ones here name the usual slips outright.
"""
import numpy as np

__all__ = ["known_mistakes"]


def _layernorm_variant(x, gamma, beta, eps, *, ddof=0, eps_outside=False):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - ddof)
    y = (x - mu) / (np.sqrt(var) + eps) if eps_outside else (x - mu) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def _rmsnorm_variant(x, gamma, eps, *, eps_outside=False, centered=False):
    if centered:
        x = x - x.mean(axis=-1, keepdims=True)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    y = x / (np.sqrt(ms) + eps) if eps_outside else x / np.sqrt(ms + eps)
    return y if gamma is None else y * gamma


def _attention_over_queries(Q, K, V, scale):
    S = (Q @ np.swapaxes(K, -1, -2)) * scale
    S = S - S.max(axis=-2, keepdims=True)
    A = np.exp(S)
    A = A / A.sum(axis=-2, keepdims=True)
    return A @ V


def known_mistakes(name, forward, args, kwargs):
    """``(sentence, thunk)`` pairs for the op ``name`` on one case (may be empty)."""
    def ref(*a, **kw):
        return forward(*a, **dict(kwargs, **kw))[0]

    out = []
    if name in ("attention", "flash_attention") and kwargs.get("scale") is None:
        d_k = args[0].shape[-1]
        out.append(("a constant factor in the scores: the 1/sqrt(d_k) scaling is missing (your output "
                    "equals the expected output with scale = 1); scores are Q K^T / sqrt(d_k)",
                    lambda: ref(*args, scale=1.0)))
        out.append(("the scores are divided by d_k instead of sqrt(d_k)",
                    lambda: ref(*args, scale=1.0 / d_k)))
        if kwargs.get("mask") is None and kwargs.get("bias") is None:
            out.append(("the softmax runs over the queries (axis -2) instead of over the keys (axis -1); "
                        "each row of weights, one per query, must sum to 1",
                        lambda: _attention_over_queries(*args[:3], 1.0 / np.sqrt(d_k))))
    elif name == "layernorm":
        x, gamma, beta = args[:3]
        eps = kwargs.get("eps", 1e-5)
        out.append(("the variance is divided by n - 1 (the unbiased estimate, ddof=1); LayerNorm uses "
                    "the population variance, divided by n (np.var's default ddof=0)",
                    lambda: _layernorm_variant(x, gamma, beta, eps, ddof=1)))
        out.append(("eps is added to the standard deviation; it belongs inside the square root: "
                    "(x - mu) / sqrt(var + eps)",
                    lambda: _layernorm_variant(x, gamma, beta, eps, eps_outside=True)))
    elif name == "rmsnorm":
        x, gamma = args[:2]
        eps = kwargs.get("eps", 1e-6)
        out.append(("eps is added outside the square root; RMSNorm divides by sqrt(mean(x^2) + eps)",
                    lambda: _rmsnorm_variant(x, gamma, eps, eps_outside=True)))
        out.append(("the mean is subtracted first: that is LayerNorm; RMSNorm does not centre x",
                    lambda: _rmsnorm_variant(x, gamma, eps, centered=True)))
    elif name == "lora_linear":
        r = args[2].shape[1] if isinstance(args[2], np.ndarray) and args[2].ndim == 2 else 1
        alpha = kwargs.get("alpha")
        if alpha is not None and r > 1:
            if kwargs.get("rank_stabilized"):
                out.append(("the LoRA branch is scaled by alpha/r; with rank_stabilized=True the scale "
                            "is alpha/sqrt(r)", lambda: ref(*args, rank_stabilized=False)))
            else:
                out.append(("the LoRA branch is scaled by alpha instead of alpha/r (r = A.shape[1] = "
                            f"{r}): the update is (alpha/r) (x A) B", lambda: ref(*args, alpha=alpha * r)))
                out.append(("the LoRA branch is scaled by alpha/sqrt(r) (rsLoRA) instead of alpha/r",
                            lambda: ref(*args, rank_stabilized=True)))
                out.append(("the LoRA branch is not scaled: the update is (alpha/r) (x A) B",
                            lambda: ref(*args, alpha=float(r))))
    elif name == "dpo_loss":
        pc, pr, rc, rr = args[:4]
        out.append(("the sign of the loss is flipped: DPO minimises -log sigma(z) (the loss is the "
                    "negative log-likelihood of the preference), you return +log sigma(z)",
                    lambda: -ref(*args)))
        out.append(("chosen and rejected are swapped: z = beta ((pc - rc) - (pr - rr)) has the wrong "
                    "sign", lambda: ref(pr, pc, rr, rc)))
        if kwargs.get("beta", 0.1) != 1.0:
            out.append(("beta is left out of z = beta ((pc - rc) - (pr - rr))",
                        lambda: ref(*args, beta=1.0)))
    elif name == "bradley_terry_loss":
        out.append(("the sign of the loss is flipped: the loss is -log sigma(r_c - r_r)",
                    lambda: -ref(*args)))
    return out
