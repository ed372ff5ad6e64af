"""Student contracts: the docstrings of a generated skeleton.

A skeleton function is a contract between the student and the grader. Its docstring is built
from three sources:

- the reference's docstring: its first paragraph (what the function is, with the section of
  the notes) and its equation blocks (the indented paragraphs), as the notes write them;
- the op's contract (``fn.__contract__``, from ``@op(...)`` in the topic module): the inputs,
  their shapes and kinds, and the options with their defaults;
- the table :data:`NOTES` below: for each op, what the student must know that the reference's
  docstring says in terms of functions the student does not have (``causal_mask``,
  ``rope_frequencies``, the reference's private helpers), every behaviour the graded cases
  check (a fully masked row, ignored positions, ...), what the student may use (``math.erfc``
  element-wise, ``np.add.at``), and the suggested cache.

Each docstring separates what is **required and graded** (the inputs the grader passes, the
values returned, their shapes and dtypes, the order of the gradients) from what is only
**suggested** (the cache's contents, the algorithm). The skeleton names no function the
student cannot use: formulas are given instead.

Text pieces in the table are strings, or ``(tag, text)`` pairs: a piece tagged ``"opt"``
appears only when the option ``opt`` is kept, one tagged ``"!opt"`` only when it is dropped
(``make-assignment --drop op:opt``).
"""
from dataclasses import dataclass, field
import inspect
import re
import textwrap

__all__ = ["StudentNotes", "NOTES", "notes_for", "forward_doc", "backward_doc", "helper_doc",
           "clean_reference_text", "WIDTH"]

WIDTH = 92          # docstring lines are wrapped to this width (4 spaces of indent included)


@dataclass(frozen=True)
class StudentNotes:
    """What a student needs to know about one op (or helper) beyond its reference docstring.

    summary:  replaces the reference's first paragraph
    math:     replaces the reference's equation blocks (pieces, one line each)
    text:     paragraphs after the equations: conventions and the graded edge cases (pieces)
    params:   parameter -> its description in "Required" (replaces the one made from the
              contract); a parameter missing here is described from the contract
    out:      what the forward returns as ``out`` (shape, dtype)
    cache:    the suggested cache contents (pieces)
    suggest:  other suggestions, not graded (pieces)
    allowed:  what the student may use beyond plain NumPy (pieces)
    backward: replaces the reference's backward docstring (pieces)
    grads:    notes on the gradients: which are None, what is summed (pieces)
    omit:     options no skeleton shows (the grader never passes them)
    depends:  option -> the options that go with it when it is dropped
    """
    summary: str = None
    math: tuple = None
    text: tuple = ()
    params: dict = field(default_factory=dict)
    out: str = ""
    cache: tuple = ()
    suggest: tuple = ()
    allowed: tuple = ()
    backward: tuple = None
    grads: tuple = ()
    omit: tuple = ()
    depends: dict = field(default_factory=dict)


# --- shared wording ---------------------------------------------------------------------------

_ERFC = ("math.erf and math.erfc (NumPy has no erf): they take one number, so apply them "
         "element-wise, e.g. np.vectorize(math.erfc)(z), and cast the result to x.dtype")
_GELU_FORMS = (
    "gelu (exact):  x Phi(x),  Phi(x) = erfc(-x / sqrt(2)) / 2   (the standard normal CDF)",
    "gelu_tanh:     x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)",
)
_STABLE_GELU = ("Both forms must stay accurate for very negative x (the cases reach |x| = 50): "
                "1 + erf(z) is erfc(-z), and (1 + tanh u)/2 is sigmoid(2u) = 1/(1 + exp(-2u)); "
                "clipping x to [-50, 50] inside u keeps x^3 finite.")
_MASK = ("mask: True = may attend. Masked weights are exactly 0, and a query row with no allowed "
         "key gets zero weights, a zero output and zero gradients.")
_BIAS = ("bias: added to the scores: 0 or -inf entries (a -inf entry blocks that key; a row of "
         "-inf allows no key) or finite penalties such as a distance bias; it never holds NaN or "
         "+inf.")
_BROADCAST = ("The leading axes of Q, K and V broadcast against each other (e.g. K, V of shape "
              "(2, 1, 4, d) serve both heads of Q (2, 2, 3, d)); the gradient of a broadcast "
              "input is summed back to its shape.")
_ATTENTION_TILES = (
    "S_ij  = Q_i K_j^T * scale + M_ij                  (one block of queries i, keys j)",
    "m'    = max(m, rowmax(S_ij))",
    "l     = exp(m - m') l + rowsum(exp(S_ij - m'))",
    "o     = exp(m - m') o + exp(S_ij - m') V_j",
    "out_i = o / l,   L_i = m + log(l)                 (L: the row's log-sum-exp)",
)


NOTES = {
    # --- core ops --------------------------------------------------------------------------
    "linear": StudentNotes(
        out="(..., d_out), of the inputs' float dtype",
        cache=("x and W, and whether b was given",),
        grads=("dW and db sum over every leading (batch) axis of x; db is None when b was None.",),
    ),
    "relu": StudentNotes(
        out="x's shape and dtype",
        cache=("x (or the boolean x > 0)",),
        grads=("At the kink x = 0 the gradient is 0 (the cases keep x away from it).",),
    ),
    "gelu": StudentNotes(
        text=("Phi is the standard normal CDF: Phi(x) = (1 + erf(x / sqrt(2))) / 2 = "
              "erfc(-x / sqrt(2)) / 2.", _STABLE_GELU),
        out="x's shape and dtype",
        cache=("x and approximate",),
        allowed=(_ERFC,),
    ),
    "softmax": StudentNotes(
        text=("The slices along axis sum to 1. The cases include logits of size 1e4: subtract "
              "the maximum along the axis before exp, or exp overflows.",),
        params={"axis": "an axis of x; negative counts from the end (default -1)"},
        out="x's shape and dtype",
        cache=("the output y and the axis",),
    ),
    "log_softmax": StudentNotes(
        text=("The result must be finite for any finite x, logits of +-1e4 included (compute "
              "the log-sum-exp after subtracting the maximum).",),
        params={"axis": "an axis of x; negative counts from the end (default -1)"},
        out="x's shape and dtype",
        cache=("the output (the log-probabilities) and the axis",),
    ),
    "cross_entropy": StudentNotes(
        math=(
            "log p_i(k) = z_ik - max_j z_ij - log sum_j exp(z_ij - max_j z_ij)   "
            "(over the K classes)",
            "q'_i(k)    = (1 - eps) [k = y_i] + eps / K                    "
            "(003 §3.7, smoothing eps)",
            "l_i        = -sum_k q'_i(k) log p_i(k)",
            "loss       = (1/N) sum_{i not ignored} l_i,   N = number of positions not ignored",
        ),
        text=("With eps = 0 this is -(1/N) sum_i log p_i(y_i), whose exp is the perplexity "
              "(003 §2.1.1). Positions where targets == ignore_index (e.g. -100, padding) count "
              "neither in the sum nor in N; when every position is ignored the loss is 0, and so "
              "is its gradient. The cases include logits of size 1e4: the log-probabilities must "
              "stay finite.",),
        params={"targets": "int array of shape logits.shape[:-1]: class ids in [0, K), or "
                           "ignore_index",
                "label_smoothing": "eps, a number in [0, 1] (default 0.0)",
                "ignore_index": "None, or an integer such as -100 (default None: every position "
                                "counts)"},
        out="the mean loss, a 0-d array (or NumPy scalar) of the logits' dtype, e.g. "
            "np.asarray(loss, dtype=logits.dtype)",
        cache=("the log-probabilities (or probabilities), the targets, which positions count, N "
               "and eps",),
        grads=("The integer targets take no gradient (None). Ignored positions get a zero "
               "gradient.",),
    ),
    "layernorm": StudentNotes(
        text=("A None gamma means a gain of 1 and a None beta a bias of 0, so with both None this "
              "is the plain LN(x_i) = (x_i - mu_i) / sigma_i of eq. 28. eps keeps a constant row "
              "finite: it maps to beta (the cases include one).",),
        out="(..., d), of the inputs' float dtype",
        cache=("xhat (the normalized x), sigma (..., 1), gamma, and whether beta was given",),
        grads=("dgamma and dbeta sum over every leading axis; each is None when its input was "
               "None.",),
    ),
    "rmsnorm": StudentNotes(
        text=("A None gamma means a gain of 1. Unlike LayerNorm, x is not centred.",),
        out="(..., d), of the inputs' float dtype",
        cache=("xhat = x / rms, rms (..., 1) and gamma",),
        grads=("dgamma sums over every leading axis; it is None when gamma was None.",),
    ),
    "embedding": StudentNotes(
        params={"ids": "int array of any shape, values in [0, V)"},
        out="ids.shape + (d,), the table's dtype",
        cache=("ids and the table's shape",),
        allowed=("np.add.at (unbuffered accumulation: a repeated id adds up, while "
                 "dtable[ids] += dout keeps only one of the repeats)",),
        grads=("The integer ids take no gradient (None). The cases repeat ids.",),
    ),
    "dropout": StudentNotes(
        math=("out = x * m / (1 - p),   m_ij ~ Bernoulli(1 - p)   (m_ij = 1: kept)",),
        text=(
            "so that E[out] = x and nothing needs rescaling at evaluation time. Draw the mask "
            "from rng only, any valid way: keep = rng.random(x.shape) < 1 - p, or >= p, or "
            "rng.binomial(1, 1 - p, x.shape) == 1 are all accepted.",
            ("train", "With train=False, or p == 0, out is x itself (a copy): nothing is dropped "
                      "and rng may be None."),
            ("!train", "With p == 0, out is x itself (a copy): nothing is dropped and rng may be "
                       "None."),
            "How it is graded: your mask is read off your output (kept where out = x/(1-p), "
            "dropped where out == 0 exactly). Every entry of out must be one or the other; the "
            "number of kept entries must be plausible for Bernoulli(1 - p) draws (an exact "
            "binomial test, failed by a fair draw with probability 1e-6; one case has 2000 "
            "entries); and dropout_backward is compared with the gradient for YOUR mask, so keep "
            "the mask in the cache.",
        ),
        params={"p": "the drop probability, a number in [0, 1)",
                "rng": "a numpy.random.Generator, the only source of randomness (None when "
                       "nothing is dropped)"},
        out="x's shape and dtype",
        cache=("the mask (bool, x's shape; None when nothing was dropped) and 1/(1-p)",),
        backward=("Gradient of dropout_forward: dx = dout * m / (1 - p), with the forward's "
                  "mask.",),
    ),
    "ffn": StudentNotes(
        text=("The activations:",
              "relu:          max(h, 0)",
              ) + _GELU_FORMS + (_STABLE_GELU,),
        out="(..., d_out), of the inputs' float dtype",
        cache=("x, the pre-activation h, the activation a, the weights and which biases were "
               "given",),
        allowed=(_ERFC,),
        grads=("dW1, db1, dW2, db2 sum over every leading axis; a bias that was None gets None.",),
        backward=("Gradient of ffn_forward: the three steps (linear, activation, linear) in "
                  "reverse.",),
    ),
    "silu": StudentNotes(
        text=("The cases reach |x| = 800: exp(-x) overflows to inf for x = -800, which is "
              "harmless when 1/(1 + inf) = 0 (silence the warning with np.errstate if you "
              "like), but the result must be finite.",),
        out="x's shape and dtype",
        cache=("x and sigmoid(x)",),
    ),
    "swiglu_ffn": StudentNotes(
        text=("activation picks the gate's nonlinearity act(g) in place of silu(g): "
              "\"silu\" (SwiGLU), or \"gelu\" / \"gelu_tanh\" (GEGLU):",
              "silu:          g sigmoid(g)",) + _GELU_FORMS,
        out="(..., d_out), of the inputs' float dtype",
        cache=("x, g, u, act(g), the weights and the activation",),
        allowed=(_ERFC,),
        grads=("x feeds both projections: its gradient is the sum of the two paths. The weight "
               "gradients sum over every leading axis.",),
        backward=("Gradient of swiglu_ffn_forward: the four steps in reverse.",),
    ),

    # --- attention -------------------------------------------------------------------------
    "attention": StudentNotes(
        text=(("scale", "scale defaults to 1/sqrt(d_k); a softmax temperature tau (003 §5.1.1) "
                        "is scale = 1/tau."),
              ("!scale", "scale = 1/sqrt(d_k)."),
              ("mask", _MASK + " A causal mask has mask[i, j] = j <= (n_k - n_q) + i."),
              ("bias", _BIAS),
              _BROADCAST),
        params={"mask": "bool array broadcastable to (..., n_q, n_k), or None (default)",
                "bias": "float array broadcastable to (..., n_q, n_k), or None (default)",
                "scale": "a number, or None for 1/sqrt(d_k) (default)"},
        out="(..., n_q, d_v): the broadcast leading axes of Q, K, V; the inputs' float dtype",
        cache=("Q, K, V, the weights A (..., n_q, n_k) and scale",),
        grads=("Masked weights are 0, so masked scores and empty rows get zero gradients.",),
    ),
    "dot_scores": StudentNotes(
        out="(..., n_q, n_k), the inputs' float dtype",
        cache=("Q and K",),
        text=("K may have fewer leading axes than Q (keys shared over the batch); its gradient "
              "is summed back to K's shape.",),
    ),
    "scaled_dot_scores": StudentNotes(
        out="(..., n_q, n_k), the inputs' float dtype",
        params={"scale": "a number, or None for 1/sqrt(d) (default)"},
        cache=("Q, K and scale",),
        text=("K may have fewer leading axes than Q (keys shared over the batch); its gradient "
              "is summed back to K's shape.",),
    ),
    "neg_sq_dist_scores": StudentNotes(
        out="(..., n_q, n_k), the inputs' float dtype",
        cache=("Q, K (and the differences q_t - k_s if you like)",),
        text=("K may have fewer leading axes than Q (keys shared over the batch); its gradient "
              "is summed back to K's shape.",),
    ),
    "bilinear_scores": StudentNotes(
        params={"M": "float array (d_q, d_k)"},
        out="(..., n_q, n_k), the inputs' float dtype",
        cache=("Q, K, M and the product Q M",),
        grads=("dM sums over every leading axis.",),
    ),
    "additive_scores": StudentNotes(
        params={"Wq": "float array (d_q, d_h)", "Wk": "float array (d_k, d_h)"},
        out="(..., n_q, n_k), the inputs' float dtype",
        cache=("Q, K, Wq, Wk, w and T = the tanh (..., n_q, n_k, d_h)",),
        grads=("The weight gradients sum over every leading axis.",),
    ),
    "additive_attention": StudentNotes(
        text=(("mask", _MASK.replace("a zero output", "a zero context")),),
        params={"Wq": "float array (d_q, d_h)", "Wk": "float array (d_k, d_h)",
                "mask": "bool array broadcastable to (..., n_q, n_k), or None (default)"},
        out="the context c (..., n_q, d_v), the inputs' float dtype",
        cache=("V, the weights alpha (..., n_q, n_k), and what the scores need: q, K, Wq, Wk, "
               "w and the tanh T",),
        grads=("The weight gradients sum over every leading axis.",),
    ),
    "mha": StudentNotes(
        math=(
            "Q = x_q Wq + bq,  K = x_kv Wk + bk,  V = x_kv Wv + bv     (split into heads)",
            ("rope", "Q, K = RoPE(Q), RoPE(K)                                   (if rope)"),
            ("kv_cache", "K, V = [K_cache; K], [V_cache; V]                         (if kv_cache)"),
            "head_h = softmax(Q_h K_{g(h)}^T * scale + M) V_{g(h)},  g(h) = h // (n_heads // "
            "n_kv_heads)",
            "out = Concat(head_1, ..., head_H) Wo + bo",
        ),
        text=(
            "Heads: with d_head = Wq.shape[1] // n_heads, head h of Q is the columns "
            "h*d_head .. (h+1)*d_head - 1 of x_q Wq + bq: reshape (..., n, H, d_head) and move "
            "the head axis before n, (..., H, n, d_head); K and V likewise with n_kv_heads "
            "heads. Concat is the inverse. Query head h uses key/value head g(h): "
            "n_kv_heads = n_heads is ordinary multi-head attention, 1 is MQA, in between GQA.",
            ("scale", "scale defaults to 1/sqrt(d_head)."),
            ("mask", "mask: True = may attend; it broadcasts to the scores (..., n_heads, n_q, "
                     "n_k), where n_k counts the cached keys too. Masked weights are exactly 0, "
                     "and a query row with no allowed key attends to nothing (its head output "
                     "is 0)."),
            ("bias", "bias: added to the scores, broadcastable to (..., n_heads, n_q, n_k) "
                     "(e.g. a per-head distance bias (n_heads, n_q, n_k))."),
            ("rope", "rope: None, a layout string (\"interleaved\" or \"half\"), or a dict with "
                     "any of the keys \"layout\" (default \"interleaved\"), \"base\" (10000.0), "
                     "\"freqs\" ((d_head/2,) frequencies alpha_k; default base^(-2k/d_head)), "
                     "\"positions_q\" ((n_q,), or (..., n_q): one row of positions per batch "
                     "item, shared by the heads) and \"positions_k\" (likewise for the new keys). "
                     "Positions default to T_past + 0, 1, ..., with T_past the cached length. "
                     "RoPE rotates each plane k of every per-head query and new key at "
                     "position i by theta = i alpha_k:"),
            ("rope", "    x~_a = x_a cos(theta) - x_b sin(theta),   x~_b = x_b cos(theta) + "
                     "x_a sin(theta)"),
            ("rope", "with the planes (a, b) = (2k, 2k+1) for \"interleaved\" and (k, k + "
                     "d_head/2) for \"half\"."),
            ("kv_cache", "kv_cache: None, or {\"k\": (..., n_kv_heads, T_past, d_head), \"v\": "
                         "the same shape}: the past keys (already rotated) and values, put "
                         "before the new ones. They are constants (no gradient reaches them) and "
                         "must not be modified."),
        ),
        params={"bq": "float array (n_heads*d_head,), or None",
                "bk": "float array (n_kv_heads*d_head,), or None",
                "bv": "float array (n_kv_heads*d_head,), or None",
                "bo": "float array (d_out,), or None",
                "Wq": "float array (d_model, n_heads*d_head)",
                "Wk": "float array (d_kv, n_kv_heads*d_head)",
                "Wv": "float array (d_kv, n_kv_heads*d_head)",
                "Wo": "float array (n_heads*d_head, d_out)",
                "x_kv": "float array (..., n_k, d_kv) with x_q's leading axes (self-attention "
                        "passes a copy of x_q; cross-attention the encoder's output)",
                "n_heads": "a positive integer dividing Wq.shape[1]",
                "n_kv_heads": "None (= n_heads, the default) or a divisor of n_heads",
                "mask": "bool array broadcastable to (..., n_heads, n_q, n_k), or None "
                        "(default)",
                "bias": "float array broadcastable to (..., n_heads, n_q, n_k), or None "
                        "(default)",
                "rope": "None (default), \"interleaved\", \"half\", or a dict (see above)",
                "kv_cache": "None (default), or a dict {\"k\", \"v\"} (see above)",
                "scale": "a number, or None for 1/sqrt(d_head) (default)"},
        out="(..., n_q, d_out), the inputs' float dtype",
        cache=("whatever mha_backward needs: the inputs, the per-head Q, K, V (after RoPE), the "
               "attention weights and the merged heads.",
               ("kv_cache", "For decoding step by step, the new {\"k\", \"v\"} (past and new keys "
                            "and values) is handy in the cache too; it is not graded."),),
        grads=("Self-attention passes x_q and "
               "x_kv as two arrays: return their gradients separately. A key/value head's "
               "gradient sums over the query heads that use it. The weight and bias gradients "
               "sum over every leading axis.",),
        backward=("Backward of mha_forward: the forward's steps, reversed.",),
    ),
    "rope": StudentNotes(
        text=("layout=\"interleaved\" uses the planes (2k, 2k+1) (RoFormer, GPT-J); "
              "layout=\"half\" the planes (k, k + d/2) (GPT-NeoX, LLaMA). With freqs None, "
              "alpha_k = base^(-2k/d).",
              "Form the angles, their cosines and sines in float64 and cast only the output to "
              "x's dtype, so large positions stay accurate in float32."),
        params={"positions": "int or float array: (n,), or any shape ending in n that "
                             "broadcasts to x.shape[:-1] (e.g. (batch, 1, n): one row per "
                             "sequence); a decoding step passes its absolute positions, e.g. [t]",
                "freqs": "None (default), or (d/2,) frequencies alpha_k (float64)",
                "base": "a number > 1 (default 10000.0), used when freqs is None",
                "x": "float array (..., n, d), d even"},
        out="x's shape and dtype",
        cache=("the cosines and sines (..., n, d/2) and the layout",),
        backward=("Gradient of rope_forward: rotate dout back by -theta. The forward is out = "
                  "R(theta) x plane by plane with R orthogonal, so dx = R(theta)^T dout = "
                  "R(-theta) dout (003 §7.3).",),
    ),
    "gru_cell": StudentNotes(
        text=("The gates' weights are stacked in column blocks [r | z | h~]: W_e = [W_re | W_ze | "
              "W_he] (d_e, 3d), W_h = [W_rh | W_zh | W_hh] (d, 3d), b (3d,), W_c (d_c, 3d). "
              "sigma is the logistic sigmoid. Without a context (c and W_c None, the encoder's "
              "cell) the c_t terms vanish; a None b is a zero bias. e, h_prev and c share their "
              "leading axes (the cases include a single vector with none).",),
        params={"W_h": "float array (d, 3d)", "b": "float array (3d,), or None",
                "c": "float array (..., d_c) with h_prev's leading axes, or None",
                "W_c": "float array (d_c, 3d), given exactly when c is given",
                "e": "float array (..., d_e) with h_prev's leading axes"},
        out="h (..., d), the inputs' float dtype",
        cache=("e, h_prev, c, the weights, R, Z, R * h_prev and h~",),
        grads=("db is None without b, dc and dW_c None without a context. The weight gradients "
               "sum over every leading axis.",),
    ),

    # --- post-training ---------------------------------------------------------------------
    "lora_linear": StudentNotes(
        math=(
            ("dropout", "y = x W + b + s (drop(x) A) B,    s = alpha / r,   r = A.shape[1]"),
            ("!dropout", "y = x W + b + s (x A) B,    s = alpha / r,   r = A.shape[1]"),
            ("rank_stabilized", "s = alpha / sqrt(r) when rank_stabilized (rsLoRA)"),
        ),
        text=(
            "W and b are frozen: the backward returns None for them. A None b is a zero bias.",
            ("dropout", "drop(x) = x * m / (1 - p) is inverted dropout with p = dropout, on the "
                        "input of the LoRA branch only: the frozen path x W + b always sees the "
                        "plain x. Draw the mask from rng only, any valid way (keep = "
                        "rng.random(x.shape) < 1 - p, or >= p, or rng.binomial(1, 1 - p, x.shape) "
                        "== 1). With dropout == 0 (or train=False) drop(x) = x and rng may be "
                        "None."),
            ("dropout", "How dropout is graded: your mask is read off your output (the one mask "
                        "of each row's branch input that reproduces the row); the output must "
                        "match the formula for that mask, the number of kept entries must be "
                        "plausible for Bernoulli(1 - p) draws (an exact binomial test), and "
                        "lora_linear_backward is compared with the gradients for YOUR mask, so "
                        "keep it in the cache."),
        ),
        params={"alpha": "the LoRA alpha, a number > 0",
                "rank_stabilized": "True or False (default False)",
                "dropout": "the drop probability p of the branch's input, in [0, 1) (default 0.0)",
                "rng": "a numpy.random.Generator, required when dropout > 0 and train (default "
                       "None)",
                "train": "True or False (default True); False turns dropout off",
                "b": "float array (d_out,), or None (default)"},
        out="(..., d_out), the inputs' float dtype",
        cache=(("dropout", "A, B, W, s, the branch input drop(x), u = drop(x) A, and the mask"),
               ("!dropout", "A, B, W, s, x and u = x A")),
        suggest=("Compute the branch as (x A) B: two thin products, never the d_in x d_out "
                 "product A B (not graded).",),
        backward=(
            "Gradient of lora_linear_forward; the leading (batch) axes are summed for dA, dB.",
            "",
            ("dropout", "    du = s dy B^T,   dB = s u^T dy,   dA = drop(x)^T du,   "
                        "dx = dy W^T + drop'(du A^T)"),
            ("dropout", ""),
            ("dropout", "with u = drop(x) A and drop'(g) = g * m / (1 - p), the forward's mask."),
            ("!dropout", "    du = s dy B^T,   dB = s u^T dy,   dA = x^T du,   "
                         "dx = dy W^T + du A^T"),
            ("!dropout", ""),
            ("!dropout", "with u = x A."),
        ),
        grads=("W and b are frozen: dW and db are None.",),
        depends={"dropout": ("rng", "train")},
    ),
    "sequence_logprobs": StudentNotes(
        text=("The log pi_theta(y|x) and log pi_ref(y|x) of DPO (003 eq. 9.1): the chain rule "
              "pi(y|x) = prod_t pi(y_t | x, y_<t) as a sum of logs over the completion's tokens "
              "only (prompt and padding positions have mask False). Targets at masked-out "
              "positions may hold any integer (e.g. -100) and are ignored. A sequence with no "
              "counted token gets 0. The cases include logits of size 1e4: stay finite.",),
        params={"targets": "int array (..., T): token ids, in [0, V) where mask is True",
                "mask": "(..., T), bool, or 0/1 numbers (True = token counted)"},
        out="logp (...,): one number per sequence, the logits' dtype",
        cache=("the softmax probabilities, the targets (masked ones set to 0) and the mask as "
               "bool",),
        grads=("targets and mask take no gradient (None).",),
    ),
    "dpo_loss": StudentNotes(
        text=("pc = policy_chosen = log pi_theta(y_c|x), rc = ref_chosen = log pi_ref(y_c|x), "
              "and so on (003 §9.2); r_c = beta (pc - rc) and r_r = beta (pr - rr) are the "
              "implicit rewards. eps = label_smoothing is the probability that a pair's label is "
              "flipped (conservative DPO); eps = 0 is eq. 9.1. An array eps, one value per pair, "
              "gives per-pair labels: the notes' -[p log sigma(z) + (1-p) log sigma(-z)] is "
              "eps = 1 - p. The cases pass label smoothing only with \"sigmoid\". The cases "
              "include margins of +-1e4: use a stable log sigma (log sigma(z) = -log(1 + "
              "exp(-z)), computed without overflow).",),
        params={"label_smoothing": "eps: a number in [0, 1], or an array of policy_chosen's "
                                   "shape (one per pair) (default 0.0)",
                "policy_chosen": "float array (...): one sequence log-prob per pair",
                "policy_rejected": "float array of policy_chosen's shape",
                "ref_chosen": "float array of policy_chosen's shape",
                "ref_rejected": "float array of policy_chosen's shape"},
        out="the mean loss over the pairs, a 0-d array (or NumPy scalar) of the inputs' dtype",
        cache=("beta, eps, the loss type, h, z and the number of pairs",),
        grads=("The reference model is frozen: d_ref_chosen and d_ref_rejected are None.",),
    ),
    "bradley_terry_loss": StudentNotes(
        text=("The cases include reward gaps of +-1e4: compute -log sigma(d) without overflow.",),
        params={"r_chosen": "float array (...): one reward per pair",
                "r_rejected": "float array of r_chosen's shape"},
        out="the mean loss, a 0-d array (or NumPy scalar) of the inputs' dtype",
        cache=("d = r_c - r_r",),
    ),
    "reward_head": StudentNotes(
        text=("mask: True at the tokens of the sequence (not padding); None means every token "
              "counts. t* is the last position where mask is True (every sequence has one).",),
        params={"b_r": "float array of shape () (a scalar bias), or None (default)",
                "mask": "bool array (..., T), or None (default)",
                "pooling": "\"last\" (default) or \"mean\""},
        out="r (...,): one reward per sequence, the inputs' float dtype",
        cache=("the pooled states (..., d), the pooling weights a_t (..., T), w_r and b_r's "
               "shape",),
        grads=("db_r has b_r's shape, and is None when b_r was None.",),
    ),

    # --- efficient attention ---------------------------------------------------------------
    "flash_attention": StudentNotes(
        summary="Scaled dot-product attention computed tile by tile (001 §2.1 \"Memory-Efficient "
                "Implementations\"; Dao et al. 2022).",
        math=("out = softmax(Q K^T * scale + M) V        (row-wise softmax over the keys)",),
        text=("The same result as plain scaled dot-product attention: scale defaults to "
              "1/sqrt(d_k).",
              ("mask", _MASK),
              ("bias", _BIAS),
              _BROADCAST,
              ("block_size", "block_size: the number of queries and keys per tile (the last "
                             "tile may be smaller). Only the results are graded, and they must "
                             "not depend on block_size.")),
        params={"mask": "bool array broadcastable to (..., n_q, n_k), or None (default)",
                "bias": "float array broadcastable to (..., n_q, n_k), or None (default)",
                "scale": "a number, or None for 1/sqrt(d_k) (default)",
                "block_size": "a positive integer (default 128)"},
        out="(..., n_q, d_v): the broadcast leading axes of Q, K, V; the inputs' float dtype",
        suggest=("The point of the exercise (not graded): never hold the (..., n_q, n_k) "
                 "scores. For each block of queries i visit the key blocks j in turn, keeping "
                 "per query row a running maximum m, a running normaliser l and an unnormalised "
                 "output o:",) + tuple("    " + line for line in _ATTENTION_TILES) + (
                 "Rescaling by exp(m - m') makes the result exact.",),
        cache=("Q, K, V, out, the row log-sum-exp L (..., n_q, 1) and the options; the "
               "backward can then recompute each tile's weights P_ij = exp(S_ij - L_i)",),
        grads=("Masked weights are 0, so masked scores and empty rows get zero gradients.",),
    ),
    "sliding_window_attention": StudentNotes(
        summary="Sliding-window (local) attention (001 §2.1 \"Sparse or Limited Attention\"; "
                "Longformer's local window, Mistral's sliding window).",
        text=("Query i sits at position p_i = n_k - n_q + i: the queries are the last n_q of "
              "the n_k positions (n_k >= n_q). Every query sees at least itself; a window as "
              "long as the sequence gives plain (causal) attention. scale defaults to "
              "1/sqrt(d_k).",
              _BROADCAST),
        params={"window": "a non-negative integer: the keys each query sees before its own "
                          "position (and after it, when not causal); 0: itself only",
                "causal": "True or False (default True)",
                "scale": "a number, or None for 1/sqrt(d_k) (default)",
                "block_size": "a positive integer (default 128); the result must not depend "
                              "on it"},
        out="(..., n_q, d_v): the broadcast leading axes of Q, K, V; the inputs' float dtype",
        suggest=("The point of the exercise (not graded): compute only the band, never an "
                 "n_q x n_k array. Take the queries in blocks of block_size and score a block "
                 "against the keys its windows reach, at most block_size + window of them "
                 "(block_size + 2 window when not causal); each row's softmax is complete "
                 "inside its tile.",),
        cache=("Q, K, V, the band's weights of each query block, window, causal, scale and "
               "block_size",),
        backward=("Gradient of sliding_window_attention_forward: the attention backward on "
                  "each band tile, the key gradients of overlapping tiles summed:",
                  "",
                  "    dV_j += A^T dO_i,   dA = dO_i V_j^T,   dS = A * (dA - rowsum(dA * A)),",
                  "    dQ_i = dS K_j * scale,   dK_j += dS^T Q_i * scale"),
    ),
    "linear_attention": StudentNotes(
        text=("phi(x) = elu(x) + 1, i.e. x + 1 for x > 0 and exp(x) for x <= 0. Causal linear "
              "attention needs n_k >= n_q: query i sits at position p_i = n_k - n_q + i.",
              _BROADCAST),
        params={"causal": "True or False (default False); True needs n_k >= n_q",
                "eps": "a number > 0 added to the normaliser (default 1e-06)"},
        out="(..., n_q, d_v), the inputs' float dtype",
        cache=("Q, K, V, phi(Q), phi(K), S, z, the normaliser and out",),
    ),

    # --- plain functions -------------------------------------------------------------------
    "causal_mask": StudentNotes(
        params={"n_q": "a positive integer",
                "n_k": "None (= n_q, the default) or an integer >= n_q"},
        out="a bool array (n_q, n_k)"),
    "padding_mask": StudentNotes(
        params={"lengths": "int array of any shape (...), values in [0, n_k]",
                "n_k": "a positive integer"},
        out="a bool array (..., 1, n_k)"),
    "split_heads": StudentNotes(
        params={"x": "array (..., n, h*d), at least 2 axes",
                "n_heads": "h, a positive integer dividing x.shape[-1]"},
        out="(..., h, n, d), x's dtype"),
    "merge_heads": StudentNotes(params={"x": "array (..., h, n, d), at least 3 axes"},
                                out="(..., n, h*d), x's dtype"),
    "sinusoidal_encoding": StudentNotes(
        text=(("!base", "base = 10000."),
              "Positions start at 0. Sine and cosine of one i share the frequency omega_i = "
              "base^(-2i/d_model), so each pair is a point on the unit circle and a shift by k "
              "positions is the block-diagonal rotation of 003 §7.2.2. An odd d_model keeps the "
              "same rule: the last column is the sine of an unpaired frequency.",),
        params={"n_positions": "a positive integer", "d_model": "a positive integer",
                "base": "a number > 1 (default 10000.0)"},
        out="PE (n_positions, d_model), float64", omit=("dtype",)),
    "lora_merge": StudentNotes(
        params={"W": "float array (d_in, d_out)", "A": "float array (d_in, r)",
                "B": "float array (r, d_out)", "alpha": "a number > 0",
                "rank_stabilized": "True or False (default False): s = alpha / sqrt(r) instead "
                                   "of s = alpha / r"},
        out="W' (d_in, d_out), W's dtype"),
    "alibi_slopes": StudentNotes(params={"n_heads": "a positive integer"},
                                 out="(n_heads,) float64"),
    "rel_error": StudentNotes(
        text=("The floor 1e-8 keeps entries where both values are ~0 from dividing by zero.",),
        params={"a": "float array", "b": "float array of a's shape"},
        out="a Python float"),
}


def notes_for(name):
    """The :class:`StudentNotes` of an op or helper (empty ones when it has none)."""
    return NOTES.get(name, StudentNotes())


# --- text -------------------------------------------------------------------------------------

_FUNC = re.compile(r":(?:func|class|meth|data):`~?([\w.]+)`")


def clean_reference_text(text):
    """Reference prose for a student: Sphinx roles and the backticks around code (double) and
    math (single, docs/math.md) removed."""
    text = _FUNC.sub(r"\1", text)
    return text.replace("``", "").replace("`", "")


def _pieces(pieces, dropped):
    """The texts of ``pieces`` that apply with the options ``dropped`` left out."""
    out = []
    for piece in pieces or ():
        if isinstance(piece, tuple):
            tag, text = piece
            present = tag[1:] in dropped if tag.startswith("!") else tag not in dropped
            if not present:
                continue
            piece = text
        out.append(piece)
    return out


def _paragraphs(doc):
    doc = inspect.cleandoc(doc or "")
    return [p for p in re.split(r"\n\s*\n", doc) if p.strip()]


def _is_math(paragraph):
    lines = [line for line in paragraph.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("    ") for line in lines)


def _fill(text, indent="", hang=None):
    hang = indent if hang is None else hang
    return textwrap.fill(" ".join(text.split()), width=WIDTH - 4, initial_indent=indent,
                         subsequent_indent=hang, break_long_words=False, break_on_hyphens=False)


def _block(lines, dropped, indent="    "):
    return "\n".join(indent + line.strip() if line.strip() else ""
                     for line in _pieces(lines, dropped))


def _text_lines(pieces, dropped):
    """Paragraph pieces as blocks: prose is filled, formula lines (indented, or ``name:  ...``
    with two spaces after the colon) are kept together as one indented block."""
    blocks, formulas = [], []
    for piece in _pieces(pieces, dropped):
        if piece.startswith("    ") or re.match(r"^[\w ()]+:\s{2,}", piece):
            formulas.append("    " + piece.strip() if not piece.startswith("    ") else piece)
            continue
        if formulas:
            blocks.append("\n".join(formulas))
            formulas = []
        blocks.append(_fill(piece))
    if formulas:
        blocks.append("\n".join(formulas))
    return blocks


# --- parameters ---------------------------------------------------------------------------------

def _validator_text(v):
    """A validator's condition in a student's words: ``a number > 0``, ``None or ...``."""
    from .. import contract as c
    known = {c.positive: "a number > 0", c.nonnegative: "a number >= 0",
             c.fraction: "a number in [0, 1)", c.probability: "a number in [0, 1]",
             c.real: "a number", c.count: "a positive integer", c.flag: "True or False",
             c.generator: "a numpy.random.Generator"}
    if v in known:
        return known[v]
    if getattr(v, "__qualname__", "").startswith("optional.") and v.__closure__:
        inner = next((cell.cell_contents for cell in v.__closure__
                      if callable(cell.cell_contents)), None)
        if inner is not None:
            return "None or " + _validator_text(inner)
    doc = " ".join(clean_reference_text((v.__doc__ or "").strip().split("\n\n")[0]).split())
    if doc[:1].isupper() and not doc[1:2].isupper():
        doc = doc[0].lower() + doc[1:]
    return doc.rstrip(".") or v.__name__


def _array_text(spec):
    kinds = {"float": "float array", "int": "int array", "bool": "bool array", "any": "array"}
    kind = kinds[spec.kind]
    shape = spec.shape_text
    text = f"{kind} broadcastable to {shape}" if spec.broadcast else f"{kind} {shape}"
    if spec.ellipsis and not spec.axes and not spec.broadcast:
        text = f"{kind} of any shape"
    return text + (", or None" if spec.optional else "")


def _default_text(param):
    if param.default is param.empty:
        return ""
    d = param.default
    shown = getattr(d, "__name__", None) if isinstance(d, type) else None
    return f" (default {shown or repr(d)})"


def _param_lines(fn, name, dropped, kind):
    """The "Required" lines of the parameters of ``fn`` (a reference forward or helper)."""
    notes = notes_for(name)
    contract = getattr(fn, "__contract__", None)
    arrays = {s.name: s for s in contract.arrays} if contract else {}
    options = dict(contract.options) if contract else {}
    lines = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in dropped:
            continue
        if p.name in notes.params:
            text = notes.params[p.name]
        elif p.name in arrays:
            text = _array_text(arrays[p.name])
            if arrays[p.name].kind == "any" and p.name in options:
                text = _validator_text(options[p.name])
            text += _default_text(p) if p.default is not p.empty and p.default is not None else ""
            if p.default is None and not arrays[p.name].optional:
                text += ", or None"
        elif p.name in options:
            text = _validator_text(options[p.name]) + _default_text(p)
        else:
            text = ("" if kind == "function" else "a value") + _default_text(p)
            text = text.strip() or "as described above"
        lines.append(_fill(f"{p.name}: {text}", "    ", "        "))
    return lines


def _positional(fn, dropped=()):
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in dropped]


def grad_name(name):
    """``dx``, ``dW``; ``d_policy_chosen`` for long names (as the grader's messages write them)."""
    return f"d_{name}" if "_" in name or len(name) > 5 else f"d{name}"


# --- docstrings ---------------------------------------------------------------------------------

def _summary_and_math(doc, notes, dropped):
    paragraphs = _paragraphs(clean_reference_text(doc))
    summary = _fill(notes.summary or (paragraphs[0] if paragraphs else ""))
    if notes.math is not None:
        math = _block(notes.math, dropped)
    else:
        blocks = []
        for para in paragraphs[1:]:
            if para.lstrip().lower().startswith("cache"):
                break
            if _is_math(para):
                blocks.append(textwrap.dedent(para).rstrip())
        math = "\n\n".join(textwrap.indent(b, "    ") for b in blocks)
    return summary, math


def _assemble(parts):
    return "\n\n".join(p.rstrip() for p in parts if p and p.strip())


def forward_doc(name, forward, backward_name, dropped=()):
    """The student docstring of an op's forward (text without the quotes, not indented)."""
    notes = notes_for(name)
    summary, math = _summary_and_math(forward.__doc__, notes, dropped)
    text = "\n\n".join(_text_lines(notes.text, dropped))
    required = ["Required (graded):"] + _param_lines(forward, name, dropped, "op")
    required.append("    returns (out, cache):")
    required.append(_fill(f"out: {notes.out or 'an array of the inputs float dtype (see above)'}",
                          "        ", "            "))
    required.append(_fill(f"cache: anything you like; the grader passes it, unchanged, to "
                          f"{backward_name}", "        ", "            "))
    suggested = ["Suggested (not graded):"]
    cache = _pieces(notes.cache, dropped)
    if cache:
        suggested.append(_fill("cache: " + " ".join(cache), "    ", "        "))
    suggested += [_fill(s, "    ", "    ") if not s.startswith("    ") else "    " + s
                  for s in _pieces(notes.suggest, dropped)]
    allowed = _pieces(notes.allowed, dropped)
    parts = [summary, math, text, "\n".join(required)]
    if len(suggested) > 1:
        parts.append("\n".join(suggested))
    if allowed:
        parts.append(_fill("You may use: " + " ".join(allowed), "", "    "))
    return _assemble(parts)


def backward_doc(name, forward, backward, dropped=()):
    """The student docstring of an op's backward (text without the quotes, not indented)."""
    notes = notes_for(name)
    if notes.backward is not None:
        body = "\n".join(line if line.startswith("    ") or not line else _fill(line)
                         for line in _pieces(notes.backward, dropped))
    else:
        kept = []
        for para in _paragraphs(clean_reference_text(backward.__doc__)):
            low = para.lower()
            first = para.split("\n")[0]
            if low.startswith(("returns", "->", "dout:", "cache")) and "=" not in first:
                continue
            if not _is_math(para):          # the "Returns (...)" sentences: "Required" says it
                para = "\n".join(line for line in para.splitlines()
                                 if not line.lstrip().startswith("Returns ("))
            if para.strip():
                kept.append(textwrap.indent(textwrap.dedent(para), "    ") if _is_math(para)
                            else para)
        if not kept or not kept[0].startswith(("Gradient", "Backward", "Returns")):
            kept.insert(0, f"Gradient of {forward.__name__}.")
        body = "\n\n".join(kept)
    inputs = _positional(forward, dropped)
    grads = [grad_name(n) for n in inputs]
    fwd = forward.__name__
    dname = next(iter(inspect.signature(backward).parameters), "dout")
    required = ["Required (graded):",
                _fill(f"{dname}: the upstream gradient, of the shape and dtype of {fwd}'s out",
                      "    ", "        "),
                _fill(f"cache: what {fwd} returned", "    ", "        ")]
    if len(grads) == 1:
        ret = (f"returns {grads[0]}, the gradient of {inputs[0]} (bare, not in a tuple), of "
               f"{inputs[0]}'s shape and dtype.")
    else:
        ret = (f"returns ({', '.join(grads)}): one gradient per positional input of {fwd}, in "
               "this order, each of its input's shape and dtype; None for an input that was "
               "None or takes no gradient.")
    required.append(_fill(ret + " " + " ".join(_pieces(notes.grads, dropped)), "    ", "        "))
    return _assemble([body, "\n".join(required)])


def helper_doc(name, fn, dropped=()):
    """The student docstring of a plain function of the contract."""
    notes = notes_for(name)
    if notes.text or notes.math is not None:
        summary, math = _summary_and_math(fn.__doc__, notes, dropped)
        body = _assemble([summary, math, "\n\n".join(_text_lines(notes.text, dropped))])
    else:
        paragraphs = _paragraphs(clean_reference_text(fn.__doc__))
        body = "\n\n".join(textwrap.indent(textwrap.dedent(p), "    ") if _is_math(p) else p
                           for p in paragraphs)
    required = ["Required (graded):"] + _param_lines(fn, name, dropped, "function")
    if notes.out:
        required.append(_fill(f"returns: {notes.out}", "    ", "        "))
    return _assemble([body, "\n".join(required)])
