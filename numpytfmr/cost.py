"""Cost accounting: operation counts and memory sizes, as the notes count them.

- 001 §1.1      multiplications and additions of a matrix product
- 001 §2.1      multi-head attention: matmul counts per stage, score memory `B h n^2`
- 001 §2.2      KV cache shapes (B, h, T, d_k) for `K` and `V`, per layer
- 000 §2.5.1 / 003 §6.2.1   decoding cost with and without a KV cache (`sum t^2` vs `sum t`)
- 000 §2.7.2    LoRA trainable parameter counts
- 001 §1.1, §2.1  one training step of a GPT: matrix-product FLOPs and saved activations

Plain integer arithmetic, no arrays: every function returns Python ints (a float only where
a fractional byte size is passed in).
"""
import numbers

from .contract import count, real

__all__ = [
    "matmul_cost", "mha_matmul_cost", "attention_score_memory", "kv_cache_bytes",
    "decoding_cost", "train_step_cost",
]


def _nonneg_int(v, name, where):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{where}: {name} is {v!r}; expected a non-negative integer")
    if v < 0:
        raise ValueError(f"{where}: {name} is {v}; expected a non-negative integer")
    return int(v)


def _bytes_per_element(v, where):
    b = real(v, "bytes_per_element", where, low=0.0, low_open=True)
    return int(v) if isinstance(v, numbers.Integral) else b


def matmul_cost(m, k, n):
    """Scalar operations of the standard product ``C = A B``, ``A (m, k)``, ``B (k, n)`` (001 §1.1).

        c_ij = sum_{l=1}^k a_il b_lj :  k multiplications and k - 1 additions per element,
        m n elements  ->  (m n k multiplications, m n (k - 1) additions),  O(m n k)

    Returns ``(multiplications, additions)``.
    """
    where = "matmul_cost"
    m, k, n = (count(v, name, where) for v, name in ((m, "m"), (k, "k"), (n, "n")))
    return m * n * k, m * n * (k - 1)


def _scaled(cost, times):
    return cost[0] * times, cost[1] * times


def mha_matmul_cost(n, d_model, n_heads, *, batch=1, n_kv_heads=None):
    """Matrix-product cost of one multi-head self-attention layer, stage by stage (001 §2.1).

    With ``d_head = d_model / n_heads`` and `B n` tokens (each stage a :func:`matmul_cost`):

        "q"        X Wq:            (B n, d_model) x (d_model, h d_head)
        "k", "v"   X Wk, X Wv:      (B n, d_model) x (d_model, h_kv d_head)
        "scores"   Q K^T per head:  B h x (n, d_head) x (d_head, n)
        "values"   A V per head:    B h x (n, n) x (n, d_head)
        "output"   concat Wo:       (B n, h d_head) x (h d_head, d_model)
        "total"    the sum

    Each value is ``(multiplications, additions)``. Softmax and scaling are not counted.
    The notes' toy case (`n = 4`, `d_model = 8`): one head computes a `(4, 8) x (8, 4)` score
    product, two heads two `(4, 4) x (4, 4)` products: the same 128 multiplications (twice the
    score steps at half the dimension), but 112 vs 96 additions.
    """
    where = "mha_matmul_cost"
    n = count(n, "n", where)
    d_model = count(d_model, "d_model", where)
    h = count(n_heads, "n_heads", where)
    B = count(batch, "batch", where)
    h_kv = h if n_kv_heads is None else count(n_kv_heads, "n_kv_heads", where)
    if d_model % h:
        raise ValueError(f"{where}: d_model is {d_model} and n_heads is {h}; expected d_model "
                         "divisible by n_heads")
    if h % h_kv:
        raise ValueError(f"{where}: n_kv_heads is {h_kv}; expected a divisor of n_heads ({h})")
    d_head = d_model // h
    stages = {
        "q": matmul_cost(B * n, d_model, h * d_head),
        "k": matmul_cost(B * n, d_model, h_kv * d_head),
        "v": matmul_cost(B * n, d_model, h_kv * d_head),
        "scores": _scaled(matmul_cost(n, d_head, n), B * h),
        "values": _scaled(matmul_cost(n, n, d_head), B * h),
        "output": matmul_cost(B * n, h * d_head, d_model),
    }
    stages["total"] = (sum(c[0] for c in stages.values()), sum(c[1] for c in stages.values()))
    return stages


def attention_score_memory(batch, n_heads, n, *, n_layers=1, bytes_per_element=4):
    """Size of the attention score (or weight) tensors kept for the backward pass (001 §2.1).

        elements = n_layers B h n^2      (a (B, h, n, n) tensor per layer)

    The notes' example: `n = 1000` tokens gives `1000 x 1000` = 1 million scores per head, and
    `h = 12` heads 12 million in one layer. Returns ``(elements, bytes)``; the default 4 bytes
    is float32.
    """
    where = "attention_score_memory"
    B = count(batch, "batch", where)
    h = count(n_heads, "n_heads", where)
    n = count(n, "n", where)
    L = count(n_layers, "n_layers", where)
    elements = L * B * h * n * n
    return elements, elements * _bytes_per_element(bytes_per_element, where)


def kv_cache_bytes(batch, n_layers, n_kv_heads, seq_len, d_head, *, bytes_per_element=2):
    """Memory of a KV cache (001 §2.2: ``K, V in R^{B x h x T x d_k}`` in every layer):

        bytes = 2 (K and V) n_layers B h_kv T d_head bytes_per_element

    The default 2 bytes is float16/bfloat16. With grouped-query attention pass the number of
    key/value heads. Grows linearly in `T` and `B` (000 §2.5.1).
    """
    where = "kv_cache_bytes"
    B = count(batch, "batch", where)
    L = count(n_layers, "n_layers", where)
    h_kv = count(n_kv_heads, "n_kv_heads", where)
    T = _nonneg_int(seq_len, "seq_len", where)
    d = count(d_head, "d_head", where)
    return 2 * L * B * h_kv * T * d * _bytes_per_element(bytes_per_element, where)


def decoding_cost(n_new, *, prompt_len=1, use_cache=True, causal=False, d_k=1):
    """Attention work of generating ``n_new`` tokens one at a time (000 §2.5.1, 003 §6.2.1, 001 §2.2).

    Generation runs ``n_new`` forward passes over contexts of length ``L = p, p+1, ..., p+n_new-1``
    (``p = prompt_len``). Per pass, one layer, one head:

        without a cache: all L queries against all L keys:   L^2 scores   (L(L+1)/2 if ``causal``)
                         and all L key/value rows re-projected
        with a cache:    the first pass (prefill) as above; afterwards only the new query
                         against the L cached keys: L scores, and 1 new key/value row

    With ``p = 1`` this is the notes' count: ``1^2 + 2^2 + ... + n^2 = n(n+1)(2n+1)/6 = O(n^3)``
    scores without a cache and ``1 + 2 + ... + n = n(n+1)/2 = O(n^2)`` with one. The projected
    rows (``kv_rows``) are 001 §2.2's count: ``O(t)`` per token without a cache, ``O(1)`` with.

    Returns a dict: ``"passes"``, ``"scores"`` (query-key dot products),
    ``"score_multiplications"`` (``scores * d_k``, the multiplications of ``Q K^T``) and
    ``"kv_rows"`` (key/value rows projected).
    """
    where = "decoding_cost"
    n_new = count(n_new, "n_new", where)
    p = count(prompt_len, "prompt_len", where)
    d_k = count(d_k, "d_k", where)

    def full_pass(L):  # all L queries against their keys
        return L * (L + 1) // 2 if causal else L * L

    lengths = range(p, p + n_new)
    if use_cache:
        scores = full_pass(p) + sum(lengths[1:])  # prefill, then one query per step
        kv_rows = p + (n_new - 1)
    else:
        scores = sum(full_pass(L) for L in lengths)
        kv_rows = sum(lengths)
    return {"passes": n_new, "scores": scores, "score_multiplications": scores * d_k,
            "kv_rows": kv_rows}


def train_step_cost(batch, seq_len, d_model, n_layers, n_heads, d_ff, vocab_size, *,
                    n_kv_heads=None):
    """Matrix-product FLOPs and saved activations of one GPT training step (001 §1.1, §2.1).

    FLOPs count each product ``(m, k) x (k, n)`` as ``2 m k n`` (:func:`matmul_cost`'s
    `m k n` multiplications, each with its addition), with `N = B n` tokens:

        forward, per layer:  the attention's six products (:func:`mha_matmul_cost`:
                             q, k, v, the scores Q K^T, the values A V, the output
                             projection) and the FFN's two, (N, d) x (d, d_ff), (N, d_ff) x (d_ff, d)
        output layer:        (N, d) x (d, V)
        backward:            2 x forward (each product's two operand gradients)

    Activations kept for the backward pass, in elements (what a straightforward
    implementation saves; norms, softmax and the optimizer are not counted):

        per layer:  B h n^2 attention weights (:func:`attention_score_memory`)
                    + 6 N d (the two norms' outputs, Q, K, V, the heads' concatenation)
                    + 2 N d_ff (the FFN's pre-activation and activation)
        plus        N V logits

    and the weight matrices, which the step's gradients match one for one: per layer
    `4 d^2 + 2 d d_ff` (biases and norm gains, `O(d)`, are left out), plus the `V d` embedding.

    So time follows `d^2` and `n` (projections) plus `n^2` (attention); activation memory
    follows `d` and `n` plus `n^2` (the weights), the gradients `d^2` and not `n` or `B`; all grow
    linearly in the number of layers.

    Returns a dict: ``"forward_flops"``, ``"step_flops"`` (3 x forward),
    ``"activation_elements"``, ``"score_elements"`` (the attention-weight part of it),
    ``"parameter_elements"`` and ``"memory_elements"`` (activations + one gradient per weight).
    """
    where = "train_step_cost"
    B = count(batch, "batch", where)
    n = count(seq_len, "seq_len", where)
    d = count(d_model, "d_model", where)
    L = count(n_layers, "n_layers", where)
    h = count(n_heads, "n_heads", where)
    f = count(d_ff, "d_ff", where)
    V = count(vocab_size, "vocab_size", where)
    N = B * n
    attention = mha_matmul_cost(n, d, h, batch=B, n_kv_heads=n_kv_heads)["total"][0]
    ffn = matmul_cost(N, d, f)[0] + matmul_cost(N, f, d)[0]
    forward = 2 * (L * (attention + ffn) + matmul_cost(N, d, V)[0])
    scores = attention_score_memory(B, h, n, n_layers=L)[0]
    activations = scores + L * (6 * N * d + 2 * N * f) + N * V
    weights = L * (4 * d * d + 2 * d * f) + V * d
    return {"forward_flops": forward, "step_flops": 3 * forward,
            "activation_elements": activations, "score_elements": scores,
            "parameter_elements": weights, "memory_elements": activations + weights}
