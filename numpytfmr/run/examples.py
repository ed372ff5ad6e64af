"""The notes' numeric worked examples, recomputed with numpytfmr beside the printed values.

One small function per example; each returns an :class:`Example`: its name, the notes'
section, a title and a list of :class:`Row` s. A row holds

- ``quantity``  what is computed, in the notes' symbols;
- ``computed``  numpytfmr's value (a number, an array, a string or a bool);
- ``printed``   what the notes print for it (their text, at their precision); where the notes'
  *formula* is wrong rather than a number, the value their formula gives, said so in the
  text; ``None`` when the notes print nothing to compare (a figure is missing, or only
  the formula is given);
- ``agrees``    True/False, or None when there is nothing to compare. A printed number
  agrees when the computed value rounds to it: ``|computed - printed| <= half a unit of
  the printed last digit`` (0.3374 allows 0.00005);
- ``erratum``   when the notes are wrong: what is wrong, the correct value, and the test
  that shows it; ``note`` a remark that is not an erratum.

``numpytfmr examples`` prints these tables (docs/commands.md); tests and notebooks call the
functions (``--list`` names them with their sections):

    >>> from numpytfmr.run.examples import run_example
    >>> ex = run_example("attention_context")
    >>> [(r.quantity, r.agrees) for r in ex.rows if r.erratum]

``decoding_growth`` is a measurement, not a printed example.
"""
from dataclasses import dataclass, field
import math
import re
import textwrap

import numpy as np

from ..attention import attention_forward, causal_mask
from ..classical import (cooccurrence_matrix, cross_entropy, edit_distance, edit_operations, entropy,
                        idf, kl_divergence, perplexity, pmi_matrix, sentence_tokenize, term_frequency)
from ..cost import (attention_score_memory, decoding_cost, matmul_cost,
                   mha_matmul_cost)
from ..linear import linear_forward
from ..lora import lora_init, lora_parameter_count
from ..mha import mha_forward, split_heads
from ..positional import rope_forward, sinusoidal_encoding
from ..scoring import dot_scores_forward
from .bench import fit_exponent, measure_decoding_growth

__all__ = [
    "Row", "Example", "example_names", "example_info", "run_example", "format_example",
    "example_attention_context", "example_kv_cache", "example_sinusoidal",
    "example_sinusoidal_rotation", "example_rope", "example_permutation", "example_lora_params",
    "example_matmul_cost", "example_score_memory", "example_perplexity", "example_edit_distance",
    "example_pmi", "example_tfidf", "example_decoding_cost", "example_decoding_growth",
]

_TESTS = "tests/test_examples.py::"


# ----------------------------------------------------------------------------- rows and examples

@dataclass(frozen=True)
class Row:
    """One quantity of a worked example: numpytfmr's value beside the notes' printed value."""
    quantity: str
    computed: object
    printed: object = None
    agrees: object = None          # True, False, or None (nothing to compare)
    erratum: str = ""
    note: str = ""
    digits: int = 6                # significant digits when the computed value is printed

    @property
    def status(self):
        """The check column: ok, WRONG (an erratum), differs (a disagreement that is no
        erratum) or - (nothing to compare)."""
        if self.agrees is None:
            return "-"
        if self.agrees:
            return "ok"
        return "WRONG" if self.erratum else "differs"


@dataclass(frozen=True)
class Example:
    """A worked example: ``rows`` of :class:`Row`, ``remarks`` printed under the table."""
    name: str
    section: str
    title: str
    rows: tuple = ()
    remarks: tuple = ()
    extra: dict = field(default_factory=dict)   # raw numbers (e.g. the timings of decoding_growth)

    def row(self, quantity_start):
        """The first row whose quantity starts with ``quantity_start`` (KeyError if none)."""
        for r in self.rows:
            if r.quantity.startswith(quantity_start):
                return r
        raise KeyError(f"Example.row: {self.name} has no row starting with {quantity_start!r}")


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _printed_numbers(text):
    """The numbers written in ``text`` and the half-unit of each one's last printed digit."""
    values, tols = [], []
    for m in _NUMBER.finditer(text.replace("\u2212", "-")):
        s = m.group()
        decimals = len(s.split(".")[1]) if "." in s else 0
        values.append(float(s))
        tols.append(0.5 * 10.0 ** (-decimals))
    return np.array(values), np.array(tols)


def _row(quantity, computed, printed=None, *, value=None, tol=None, agrees=None, erratum="",
         note="", digits=6):
    """Build a :class:`Row`, deciding ``agrees`` unless it is given.

    With ``value`` None the numbers are read from the ``printed`` text with their printed
    precision; with ``value`` given they are compared to ``tol`` (default: exact up to
    1e-9 relative). Strings compare exactly. An erratum row that agrees, or a comparison of
    different sizes, is a mistake in this module and raises.
    """
    if agrees is None and printed is not None:
        if isinstance(computed, str):
            agrees = computed == (printed if value is None else value)
        else:
            c = np.asarray(computed, dtype=np.float64).ravel()
            if value is None:
                p, t = _printed_numbers(printed)
            else:
                p = np.asarray(value, dtype=np.float64).ravel()
                t = np.full(p.shape, 0.0)
            if tol is not None:
                t = np.full(p.shape, float(tol))
            if c.shape != p.shape:
                raise ValueError(f"_row: {quantity!r}: computed has {c.size} numbers but the printed "
                                 f"{printed!r} has {p.size}")
            slack = 1e-9 * np.maximum(1.0, np.abs(p))
            agrees = bool(np.all(np.abs(c - p) <= t * (1 + 1e-9) + slack))
    if erratum and agrees:
        raise ValueError(f"_row: {quantity!r} is marked as an erratum but agrees with the notes")
    return Row(quantity, computed, printed, agrees, erratum, note, digits)


_REGISTRY = {}


def _example(name, section, title):
    """Register an example function under ``name`` with the notes' section and a title."""
    def register(fn):
        _REGISTRY[name] = (section, title, fn)
        return fn
    return register


def _make(name, rows, remarks=(), extra=None):
    section, title, _ = _REGISTRY[name]
    return Example(name, section, title, tuple(rows), tuple(remarks), dict(extra or {}))


def example_names():
    """The names of all examples, in the order ``numpytfmr examples`` runs them."""
    return list(_REGISTRY)


def example_info(name):
    """``(section, title)`` of an example; ValueError naming the valid names if unknown."""
    return _REGISTRY[_check_name(name)][:2]


def _check_name(name):
    key = str(name).replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(f"unknown example {name!r}; valid names: {', '.join(_REGISTRY)}")
    return key


def run_example(name, **options):
    """Run one example by name (``-`` and ``_`` are interchangeable) and return its :class:`Example`."""
    return _REGISTRY[_check_name(name)][2](**options)


# ----------------------------------------------------------------------------- printing

def _fmt(x, digits=6, grouped=True):
    """A value as the table shows it: floats to ``digits`` significant digits, ints with
    thousands separators (``grouped``, not inside tuples and arrays), arrays in brackets."""
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}" if grouped else str(int(x))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if x == 0.0:
            return "0"
        if abs(x) >= 1e4 and x.is_integer():
            return _fmt(int(x), digits, grouped)
        return f"{x:.{digits}g}"
    a = np.asarray(x)
    if a.ndim == 0:
        return _fmt(a.item(), digits, grouped)
    if a.ndim == 1:
        return "(" + ", ".join(_fmt(v, digits, False) for v in a.tolist()) + ")"
    return "[" + "; ".join(_fmt(r, digits, False)[1:-1] for r in a) + "]"


def format_example(ex):
    """The example as a text table with a check column; errata and notes as footnotes below."""
    head = ("quantity", "numpytfmr", "notes print", "check")
    cells, foot = [], []
    numbers = {}   # footnote text -> its number (one erratum shared by several rows prints once)
    for r in ex.rows:
        check = r.status
        for text, kind in ((r.erratum, "erratum"), (r.note, "note")):
            if text:
                key = f"{kind}: {text}"
                if key not in numbers:
                    numbers[key] = len(numbers) + 1
                    foot.append(f"[{numbers[key]}] {key}")
                check += f" [{numbers[key]}]"
        printed = "-" if r.printed is None else _fmt(r.printed)
        cells.append((r.quantity, _fmt(r.computed, r.digits), printed, check))
    caps = (58, 34, 40, 14)
    w = [min(max([len(head[i])] + [len(c[i]) for c in cells]), caps[i]) for i in range(4)]
    line = lambda c: "  ".join(s.ljust(w[i]) for i, s in enumerate(c)).rstrip()  # noqa: E731
    out = [f"{ex.name} -- {ex.section}: {ex.title}", "  " + line(head),
           "  " + "  ".join("-" * n for n in w)]
    out += ["  " + line(c) for c in cells]
    out += [textwrap.fill(f, width=100, initial_indent="  ", subsequent_indent="      ") for f in foot]
    out += [textwrap.fill(r, width=100, initial_indent="  ", subsequent_indent="  ") for r in ex.remarks]
    return "\n".join(out)


# ----------------------------------------------------------------------------- attention (003 §5.1)

@_example("attention_context", "003 §5.1, 000 §2.1",
          "dot-product scores, attention weights and the context vector c_t")
def example_attention_context():
    """003 §5.1 / 000 §2.1: ``e_tj = s_{t-1}^T h_j``, ``alpha_t = softmax(e_t)``,
    ``c_t = sum_j alpha_tj h_j``.

    Plain dot-product scores (no 1/sqrt(d)): ``attention_forward(s, H, H, scale=1.0)``.
    """
    s = np.array([[0.5, 0.2]])                          # s_{t-1} as a row
    H = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # h_1, h_2, h_3 as rows
    e, _ = dot_scores_forward(s, H)
    c, cache = attention_forward(s, H, H, scale=1.0)
    alpha, c = cache["weights"][0], c[0]
    exps = np.exp(e[0])
    err_alpha = ("the printed weights are not 1.6487/4.8839 and 2.0138/4.8839: those are 0.33758 "
                 "and 0.41233 (the notes' own exponentials give the same) "
                 f"({_TESTS}test_attention_context_erratum_003_5_1)")
    err_c = ("c_t2 = alpha_t2 + alpha_t3 = 0.25009 + 0.41233 = 0.66242; the printed 0.6626 adds "
             f"the wrong weights 0.2501 + 0.4125 ({_TESTS}test_attention_context_erratum_003_5_1)")
    rows = [
        _row("scores e_tj = s_{t-1}^T h_j, j = 1..3", e[0], "(0.5, 0.2, 0.7)"),
        _row("exp(e_tj)", exps, "(1.6487, 1.2214, 2.0138)"),
        _row("S = sum_k exp(e_tk)", exps.sum(), "4.8839"),
        _row("alpha_t1", alpha[0], "0.3374", erratum=err_alpha),
        _row("alpha_t2", alpha[1], "0.2501"),
        _row("alpha_t3", alpha[2], "0.4125", erratum=err_alpha),
        _row("alpha_t1 + alpha_t2 + alpha_t3", alpha.sum(), "1.0000"),
        _row("c_t, first entry (alpha_t1 + alpha_t3)", c[0], "0.7499",
             note="agrees only because the errors of alpha_t1 and alpha_t3 cancel"),
        _row("c_t, second entry (alpha_t2 + alpha_t3)", c[1], "0.6626", erratum=err_c),
        _row("c_t, rounded to two digits", c, "(0.75, 0.66)"),
    ]
    return _make("attention_context", rows)


# ----------------------------------------------------------------------------- KV cache (003 §6.2.1)

@_example("kv_cache", "003 §6.2.1, 000 §2.5.1",
          "queries, keys and values of x_1..x_3, and one cached decoding step")
def example_kv_cache():
    """003 §6.2.1 / 000 §2.5.1: ``q_i = x_i W^Q``, ``k_i = x_i W^K``, ``v_i = x_i W^V`` (one head, d = 2),
    read from the cache ``mha_forward`` returns; then a step for a made-up x_4 from the cache.
    """
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    WQ, WK = np.eye(2), np.array([[1.0, 2.0], [0.0, 1.0]])
    WV, WO = np.array([[0.5, -0.5], [1.0, 0.5]]), np.eye(2)
    _, cache = mha_forward(x, x, WQ, WK, WV, WO, n_heads=1)
    Q, _ = linear_forward(x, WQ)
    K, V = cache["kv_cache"]["k"][0], cache["kv_cache"]["v"][0]     # (T, d_head) of the one head
    err_k = ("003 §6.2.1 writes k_i as a matrix times the column x_1 (k_1 = W^K x_1, and for k_2, "
             "k_3 the matrix with x_i in its first row); the printed results (1, 4), (3, 10), (5, 16) "
             "are the row products x_i W^K, as 000 §2.5.1 writes them "
             f"({_TESTS}test_kv_cache_erratum_003_6_2_1)")
    garbled = [np.array([x[i], WK[1]]) @ x[0] for i in range(3)]    # [[x_i], [0 1]] [1 2]^T as printed
    # a made-up x_4 (the notes leave it as ?): the cached step equals recomputing all four rows
    x4 = np.array([[0.5, -1.0]])
    z4, c4 = mha_forward(x4, x4, WQ, WK, WV, WO, n_heads=1, kv_cache=cache["kv_cache"])
    x_all = np.concatenate([x, x4])
    z_all, _ = mha_forward(x_all, x_all, WQ, WK, WV, WO, n_heads=1, mask=causal_mask(4))
    rows = [
        _row("q_1, q_2, q_3 (W^Q = I)", Q, "[1 2], [3 4], [5 6]",
             note="printed in 000 §2.5.1; 003 §6.2.1 leaves the queries out"),
        _row("k_1 = x_1 W^K", K[0], "[1 4]"),
        _row("k_2 = x_2 W^K", K[1], "[3 10]"),
        _row("k_3 = x_3 W^K", K[2], "[5 16]"),
        _row("k_1, as the product 003 §6.2.1 writes", K[0], "W^K [1 2]^T = (5, 2)",
             value=WK @ x[0], erratum=err_k),
        _row("k_2, k_3, as the products 003 §6.2.1 writes", K[1:], "[[3 4],[0 1]] [1 2]^T = (11, 2); "
             "[[5 6],[0 1]] [1 2]^T = (17, 2)", value=garbled[1:], erratum=err_k),
        _row("v_1 = x_1 W^V", V[0], "[2.5 0.5]"),
        _row("v_2 = x_2 W^V", V[1], "[5.5 0.5]"),
        _row("v_3 = x_3 W^V", V[2], "[8.5 0.5]"),
        _row("K cache shape after the step for x_4 = (0.5, -1)", str(c4["kv_cache"]["k"].shape),
             note="(heads, t, d_k): one new key appended; x_4 is made up, the notes leave it as ?"),
        _row("z_4 from the cache minus z_4 recomputed from x_1..x_4", np.abs(z4[0] - z_all[3]).max(),
             "0 (the cache only saves work)", value=0.0, tol=1e-12),
    ]
    return _make("kv_cache", rows)


# ----------------------------------------------------------------------------- sinusoidal PE (003 §7.2)

@_example("sinusoidal", "003 §7.2.1, 000 §2.3.2",
          "sinusoidal positional encoding, d_model = 4, positions 0 and 1")
def example_sinusoidal():
    """003 §7.2.1 / 000 §2.3.2:

        PE(p, 2i) = sin(p / 10000^(2i/d)),   PE(p, 2i+1) = cos(p / 10000^(2i/d))
    """
    pe = sinusoidal_encoding(2, 4)
    wrong = math.cos(1 / 10000 ** (3 / 4))   # 000 §2.3.2's cosine exponent (2i+1)/d
    err = ("000 §2.3.2 prints PE(pos, 2i+1) = cos(pos / 10000^((2i+1)/d)), which gives "
           "cos(10000^(-3/4)) = 0.9999995 here; the cosine uses the sine's exponent 2i/d (003 §7.2), "
           f"and the notes' own 0.99995 is cos(0.01) ({_TESTS}test_sinusoidal_erratum_000_2_3_2)")
    rows = [
        _row("PE(0)", pe[0], "[0, 1, 0, 1]"),
        _row("PE(1, 0) = sin(1)", pe[1, 0], "0.84147"),
        _row("PE(1, 1) = cos(1)", pe[1, 1], "0.54030"),
        _row("PE(1, 2) = sin(0.01)", pe[1, 2], "0.00999983", digits=8),
        _row("PE(1, 3) = cos(0.01)", pe[1, 3], "0.99995"),
        _row("PE(1, 3), by 000 §2.3.2's formula", pe[1, 3],
             f"cos(1/10000^(3/4)) = {wrong:.7f}", value=wrong, tol=5e-6, erratum=err),
        _row("sin^2 + cos^2 of each pair, positions 0..49, d = 8",
             np.abs(sinusoidal_encoding(50, 8)[:, 0::2] ** 2 + sinusoidal_encoding(50, 8)[:, 1::2] ** 2
                    - 1).max(),
             "0 (a point on the unit circle, 003 §7.2.2)", value=0.0, tol=1e-12,
             note="max |sin^2 + cos^2 - 1|"),
    ]
    return _make("sinusoidal", rows)


@_example("sinusoidal_rotation", "003 §7.2.2",
          "a shift by k positions as a rotation of each (sin, cos) pair; period-8 example")
def example_sinusoidal_rotation():
    """003 §7.2.2: ``PE(p + k) = R(k) PE(p)``, one 2x2 block per frequency; period T = 8, p = 2, k = 3.

    The notes' block ``R(wk) = [[cos, -sin], [sin, cos]]`` is exactly what ``rope_forward`` applies
    to a pair at position k; for ``[sin, cos]`` pairs the shift is ``R(-wk)``, i.e. ``rope_forward``
    at position ``-k``.
    """
    h = math.sqrt(2) / 2
    w = np.array([np.pi / 4])                          # omega = 2 pi / T, T = 8
    # columns 2, 3 of a d = 4 encoding use omega = base^(-2/4); base = (4/pi)^2 makes it pi/4
    pe = sinusoidal_encoding(8, 4, base=(4 / np.pi) ** 2)[:, 2:4]
    R_rows, _ = rope_forward(np.eye(2), positions=np.array([3, 3]), freqs=w)
    R = R_rows.T                                       # the rotated basis vectors are R's columns
    notes_shift, _ = rope_forward(pe[2][None], positions=np.array([3]), freqs=w)
    true_shift, _ = rope_forward(pe[2][None], positions=np.array([-3]), freqs=w)
    # the identity PE(p + k) = R(k) PE(p) for every p, k < 32, d = 8
    d, n = 8, 64
    P = sinusoidal_encoding(n, d)
    worst_notes = worst_true = 0.0
    for k in range(1, 32):
        ks = np.full(n - k, k)
        worst_notes = max(worst_notes, np.abs(rope_forward(P[:n - k], positions=ks)[0] - P[k:]).max())
        worst_true = max(worst_true, np.abs(rope_forward(P[:n - k], positions=-ks)[0] - P[k:]).max())
    err = ("for a pair [sin a, cos a] the angle-addition identities give the block "
           "[[cos wk, sin wk], [-sin wk, cos wk]] = R(-wk), not R(wk); so R [1, 0]^T = "
           "[-sqrt2/2, +sqrt2/2] is not [sin(5pi/4), cos(5pi/4)] = [-sqrt2/2, -sqrt2/2] "
           f"({_TESTS}test_sinusoidal_rotation_erratum_003_7_2_2)")
    rows = [
        _row("PE(2) = [sin(pi/2), cos(pi/2)], omega = pi/4", pe[2], "[1, 0]"),
        _row("R(3pi/4) = [[cos, -sin], [sin, cos]] as printed", R,
             "[[-sqrt2/2, -sqrt2/2], [sqrt2/2, -sqrt2/2]]", value=[[-h, -h], [h, -h]], tol=5e-13),
        _row("R [1, 0]^T", notes_shift[0], "[-sqrt2/2, sqrt2/2]", value=[-h, h], tol=5e-13),
        _row("PE(5) = [sin(5pi/4), cos(5pi/4)]", pe[5], "= R [1, 0]^T = [-sqrt2/2, sqrt2/2]",
             value=[-h, h], tol=1e-3, erratum=err),
        _row("[[cos, sin], [-sin, cos]] PE(2) = R(-3pi/4) PE(2)", true_shift[0],
             note="equals PE(5): the correct shift for [sin, cos] pairs"),
        _row("max |R(k) PE(p) - PE(p+k)|, R as printed, d = 8, k < 32", worst_notes,
             "0 (PE(p+k) = R(k) PE(p))", value=0.0, tol=1e-9, erratum=err),
        _row("max |R(-k) PE(p) - PE(p+k)|, the corrected blocks", worst_true,
             "0 (PE(p+k) = R(k) PE(p))", value=0.0, tol=1e-9),
    ]
    return _make("sinusoidal_rotation", rows)


# ----------------------------------------------------------------------------- RoPE (004)

@_example("rope", "004 RoPE, Example",
          "RoPE on \"the dog slept\", d = 4, positions 1 to 3")
def example_rope():
    """004 "Rotary Position Embedding", worked example: ``theta_{i,p} = p / 10000^(2i/d)``; each
    pair ``(x_2i, x_2i+1)`` of the embedding at position p is rotated by ``R(theta_{i,p})``.
    The example counts positions from 1 (its cos(theta) = 0.540 for "the" is cos 1).
    """
    emb = np.array([[0.9, 0.1, 0.2, 0.8],      # the
                    [0.5, 0.7, 0.3, 0.1],      # dog
                    [0.2, 0.1, 0.9, 0.7]])     # slept
    pos = np.array([1, 2, 3])
    out, cache = rope_forward(emb, positions=pos)
    cos, sin = cache["cos"], cache["sin"]

    def angle(a, b):  # degrees between two 2-D vectors (the notes' "angle between vectors")
        c = np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))
        return math.degrees(math.acos(min(1.0, max(-1.0, c))))

    # 004 "Integration into Transformers": RoPE on the embeddings, then Q = X W_q, K = X W_k.
    # Its W_q, W_k are 4 x 3; a zero fourth column lets the same q, k also be rotated after
    # the projection (RoPE needs an even width), without changing any score.
    Wq = np.array([[0.549, 0.715, 0.603], [0.545, 0.424, 0.646], [0.438, 0.892, 0.964],
                   [0.383, 0.792, 0.529]])
    Wk = np.array([[0.568, 0.926, 0.071], [0.087, 0.020, 0.833], [0.778, 0.870, 0.979],
                   [0.799, 0.461, 0.781]])
    Wq4, Wk4 = (np.concatenate([W, np.zeros((4, 1))], axis=1) for W in (Wq, Wk))

    def score_before(shift):  # q_dog . k_the, RoPE on the embeddings, then the projections
        x, _ = rope_forward(emb, positions=pos + shift)
        return linear_forward(x[1], Wq4)[0] @ linear_forward(x[0], Wk4)[0]

    def score_after(shift):   # RoPE on the projected q and k (003 §7.3)
        q, _ = rope_forward(linear_forward(emb, Wq4)[0], positions=pos + shift)
        k, _ = rope_forward(linear_forward(emb, Wk4)[0], positions=pos + shift)
        return q[1] @ k[0]

    err = ("004 applies RoPE to the embeddings and computes Q, K, V from the rotated embeddings; "
           "then q_i . k_j = x_i^T R_i^T W_q W_k^T R_j x_j depends on i and j, not only on j - i. "
           "RoPE rotates the projected queries and keys (003 §7.3, 001 §3.2) "
           f"({_TESTS}test_rope_erratum_004_rotate_queries_and_keys)")
    before = (score_before(0), score_before(10))
    after = (score_after(0), score_after(10))
    rows = [
        _row("cos(theta), pair (0,1), positions 1..3", cos[:, 0], "(0.540, -0.416, -0.990)"),
        _row("sin(theta), pair (0,1)", sin[:, 0], "(0.841, 0.909, 0.141)"),
        _row("cos(theta), pair (2,3)", cos[:, 1], "(0.99995, 0.99980, 0.99955)"),
        _row("sin(theta), pair (2,3)", sin[:, 1], "(0.01000, 0.02000, 0.03000)"),
        _row("new embedding of \"the\" (position 1)", out[0], "(0.402, 0.811, 0.192, 0.802)"),
        _row("new embedding of \"dog\" (position 2)", out[1], "(-0.845, 0.163, 0.298, 0.106)"),
        _row("new embedding of \"slept\" (position 3)", out[2], "(-0.212, -0.071, 0.879, 0.727)"),
        _row("angle dog-the, dims (0,1), degrees: before, after", (angle(emb[1, :2], emb[0, :2]),
                                                                  angle(out[1, :2], out[0, :2])),
             note="the notes' figures are missing; after RoPE it grows by 1 radian (57.3 deg)"),
        _row("angle dog-slept, dims (0,1), degrees: before, after", (angle(emb[1, :2], emb[2, :2]),
                                                                    angle(out[1, :2], out[2, :2]))),
        _row("q_dog . k_the at positions (2,1), then (12,11): 004's order", before,
             "equal (scores depend on j - i only)", agrees=bool(np.isclose(*before)), erratum=err),
        _row("the same with RoPE on the projected q, k (003 §7.3)", after,
             "equal (scores depend on j - i only)", agrees=bool(np.isclose(*after))),
    ]
    return _make("rope", rows, remarks=(
        "The example counts positions from 1 (cos theta = cos 1 = 0.540 for \"the\"); the encodings "
        "of 003 §7.2 count from 0.",))


# ----------------------------------------------------------------------------- permutation (003 §7.1)

@_example("permutation", "003 §7.1, 000 §2.3.1",
          "self-attention is permutation equivariant; positions break it")
def example_permutation():
    """003 §7.1: ``Attention(PX) = P Attention(X)``; identical tokens get identical outputs.

    The notes' listing uses bert-tiny embeddings of "The dog chased another dog" and a
    randomly initialised 4-head attention (std 0.1); here random embeddings (seed 0) and the
    same kind of attention, through ``mha_forward``.
    """
    rng = np.random.default_rng(0)
    d, heads = 16, 4
    words = ["the", "dog", "chased", "another", "dog"]
    table = {w: rng.standard_normal(d) for w in dict.fromkeys(words)}
    X = np.stack([table[w] for w in words])
    W = [rng.normal(0.0, 0.1, size=(d, d)) for _ in range(4)]
    attn = lambda X: mha_forward(X, X, *W, n_heads=heads)  # noqa: E731
    out, cache = attn(X)
    P = np.eye(5)[[4, 2, 0, 1, 3]]
    out_p, cache_p = attn(P @ X)
    A, A_p = cache["weights"], cache_p["weights"]       # (heads, n, n)
    out_pe, _ = attn(X + sinusoidal_encoding(5, d))
    gap_pe = np.abs(out_pe[1] - out_pe[4]).max()
    rows = [
        _row("max |out(dog #1) - out(dog #2)|, no positions", np.abs(out[1] - out[4]).max(),
             "identical (allclose, atol 1e-6)", value=0.0, tol=1e-6),
        _row("max |Attention(PX) - P Attention(X)|", np.abs(out_p - P @ out).max(),
             "0 (equivariant)", value=0.0, tol=1e-12),
        _row("max |A' - P A P^T|, every head", np.abs(A_p - P @ A @ P.T).max(),
             "0 (A' = P A P^T)", value=0.0, tol=1e-12),
        _row("max |out(dog #1) - out(dog #2)|, sinusoidal PE added", gap_pe,
             "differ (positions break the invariance)", agrees=bool(gap_pe > 1e-6)),
    ]
    return _make("permutation", rows, remarks=(
        "Random embeddings stand in for the listing's bert-tiny ones (no download); any embeddings "
        "give the same equalities.",))


# ----------------------------------------------------------------------------- LoRA (000 §2.7.2)

@_example("lora_params", "000 §2.7.2",
          "trainable parameters: d k for W versus d r + r k for A and B")
def example_lora_params():
    """000 §2.7.2: full fine-tuning of ``W (d x k)`` trains ``d k`` numbers, LoRA ``d r + r k``.
    The notes give only the formula; here d = k = 4096 (a 7B model's attention projection), r = 8.
    """
    d, k, r = 4096, 4096, 8
    counts = lora_parameter_count(d, k, r)
    full, lora, frac = counts["full"], counts["lora"], counts["fraction"]
    A, B = lora_init(d, k, r, rng=np.random.default_rng(0))
    full_rank = lora_parameter_count(d, k, min(d, k))["lora"]
    rows = [
        _row("full fine-tuning, W 4096 x 4096", full, "d x k", value=d * k),
        _row("LoRA, r = 8", lora, "d x r + r x k", value=d * r + r * k),
        _row("A.size + B.size of lora_init(4096, 4096, 8)", A.size + B.size, "d x r + r x k",
             value=d * r + r * k),
        _row("LoRA / full", frac, note="1/256"),
        _row("LoRA at r = min(d, k) = 4096", full_rank,
             note="twice W itself: the saving needs r << min(d, k)"),
    ]
    return _make("lora_params", rows)


# ----------------------------------------------------------------------------- cost (001 §1.1, §2.1)

@_example("matmul_cost", "001 §1.1, §2.1",
          "multiplications and additions of a matrix product; one head versus two")
def example_matmul_cost():
    """001 §1.1: ``C = A B`` with A (m x k), B (k x n) costs ``m n k`` multiplications and
    ``m n (k - 1)`` additions; 001 §2.1's toy layer: n = 4 tokens, d_model = 8, 1 or 2 heads.
    """
    rng = np.random.default_rng(0)
    n, dm = 4, 8
    x = rng.standard_normal((n, dm))
    W = [rng.standard_normal((dm, dm)) for _ in range(4)]
    _, one = mha_forward(x, x, *W, n_heads=1)
    _, two = mha_forward(x, x, *W, n_heads=2)
    c1, c2 = mha_matmul_cost(n, dm, 1), mha_matmul_cost(n, dm, 2)
    rows = [
        _row("A (2x3) B (3x4): multiplications, additions", matmul_cost(2, 3, 4),
             "m n k, m n (k - 1)", value=(2 * 3 * 4, 2 * 4 * (3 - 1))),
        _row("score matrices Q K^T, 1 head (shape)", str(one["weights"].shape),
             "one 4 x 4 attention matrix", agrees=one["weights"].shape == (1, 4, 4)),
        _row("score matrices Q K^T, 2 heads (shape)", str(two["weights"].shape),
             "two separate 4 x 4 score matrices", agrees=two["weights"].shape == (2, 4, 4)),
        _row("per-head outputs, 2 heads (shape)", str(split_heads(two["concat"], 2).shape),
             "4 x 4 per head, concatenated to 8 per token",
             agrees=split_heads(two["concat"], 2).shape == (2, 4, 4)),
        _row("Q K^T multiplications, 1 head vs 2 heads", (c1["scores"][0], c2["scores"][0]),
             "the same: twice the steps at half the dimension",
             agrees=c1["scores"][0] == c2["scores"][0]),
        _row("Q K^T additions, 1 head vs 2 heads", (c1["scores"][1], c2["scores"][1]),
             note="k - 1 additions per entry: fewer with more, shorter heads"),
        _row("whole layer, multiplications, 1 head vs 2 heads", (c1["total"][0], c2["total"][0]),
             note="004: multi-head is \"no more expensive than single-head\" in multiplications"),
    ]
    return _make("matmul_cost", rows)


@_example("score_memory", "001 §2.1",
          "attention-score memory B h n^2: 1000 tokens, 12 heads")
def example_score_memory():
    """001 §2.1: a ``(B, h, n, n)`` score tensor per layer; n = 1000 gives 10^6 scores per head."""
    rows = [
        _row("n = 1000, one head", attention_score_memory(1, 1, 1000)[0], "1 million", value=1e6),
        _row("n = 1000, h = 12 heads, one layer", attention_score_memory(1, 12, 1000)[0],
             "12 million", value=12e6),
        _row("the same in float32 bytes", attention_score_memory(1, 12, 1000)[1]),
        _row("n = 4, one head (the toy layer)", attention_score_memory(1, 1, 4)[0],
             "one 4 x 4 matrix", value=16),
        _row("n = 4, two heads", attention_score_memory(1, 2, 4)[0], "two 4 x 4 matrices", value=32),
        _row("B = 8, n = 1000, h = 12, 24 layers", attention_score_memory(8, 12, 1000, n_layers=24)[0],
             note="\"dozens of layers\": B h n^2 per layer"),
    ]
    return _make("score_memory", rows)


# ----------------------------------------------------------------------------- perplexity (003 §2.1)

@_example("perplexity", "003 §2.1.1-2.1.2",
          "perplexity, entropy in bits, and cross-entropy = entropy + KL")
def example_perplexity():
    """003 §2.1.1: three bits of entropy means choosing among 2^3 = 8 options: perplexity 8;
    ``PPL = exp(L_CE)``; 003 §2.1.2: ``H(P, Q) = H(P) + D_KL(P || Q)``.
    """
    uniform8 = np.full(8, 1 / 8)
    H_bits = entropy(uniform8, base=2)
    p = np.array([0.5, 0.25, 0.125])                    # probabilities of three observed tokens
    no_log = math.exp(-np.mean(p))                      # eq. 2.1 as printed: -E[P], no log
    P, Q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.5, 0.25])
    err = ("eq. 2.1 prints L_CE = -E[P_theta(w_i | w_<i)] without the log; only -E[log P_theta] "
           "leads to eq. 2.2-2.5 and PPL = exp(L_CE) "
           f"({_TESTS}test_perplexity_erratum_003_eq_2_1)")
    rows = [
        _row("entropy of a uniform choice among 8, in bits", H_bits, "three bits", value=3.0, tol=1e-12),
        _row("2^H", 2 ** H_bits, "2^3 = 8 options", value=8.0, tol=1e-12),
        _row("perplexity of a model giving each token 1/8", perplexity(np.full(20, 1 / 8)),
             "a perplexity of 8", value=8.0, tol=1e-12),
        _row("exp(H in nats)", math.exp(entropy(uniform8)), "8 (2^H in bits)", value=8.0, tol=1e-12,
             note="the base of the log does not matter"),
        _row("PPL of tokens with p = (1/2, 1/4, 1/8)", perplexity(p),
             f"exp(L_CE), L_CE by eq. 2.1 as printed: {no_log:.4f}", value=no_log, tol=1e-4,
             erratum=err),
        _row("(p_1 p_2 p_3)^(-1/3), the N-th root form", float(np.prod(p) ** (-1 / 3)), "4 = PPL",
             value=perplexity(p), tol=1e-12),
        _row("H(P,Q) - H(P) - D_KL(P||Q), P = (.5,.25,.25), Q = (.25,.5,.25)",
             cross_entropy(P, Q) - entropy(P) - kl_divergence(P, Q), "0", value=0.0, tol=1e-12),
    ]
    return _make("perplexity", rows)


# ----------------------------------------------------------------------------- edit distance (003 §3.1)

def _script(a, b):
    """An optimal edit script of ``edit_operations`` as short text, matches left out."""
    parts = []
    for op, _, _, src, dst in edit_operations(a, b):
        if op == "substitute":
            parts.append(f"replace {src} by {dst}")
        elif op == "delete":
            parts.append(f"delete {src}")
        elif op == "insert":
            parts.append(f"insert {dst}")
    return ", ".join(parts) or "nothing"


@_example("edit_distance", "003 §3.1",
          "spelling correction of \"carr\" by edit distance")
def example_edit_distance():
    """003 §3.1: Levenshtein distance from "carr" to each dictionary word; the closest wins."""
    words = ["cat", "car", "cart", "care", "cards", "cast"]
    dist = {w: edit_distance("carr", w) for w in words}
    best = min(dist.values())
    closest = ", ".join(w for w in words if dist[w] == best)
    ref = f"({_TESTS}test_edit_distance_errata_003_3_1)"
    rows = [
        _row("d(carr, cat)", dist["cat"], "3", erratum=f"carr -> cat is 2: replace r by t, delete r {ref}"),
        _row("  script carr -> cat", _script("carr", "cat"), "insert r and r, then delete t",
             erratum=f"that script turns cat into carr (3 steps); the shortest carr -> cat has 2 {ref}"),
        _row("d(carr, car)", dist["car"], "1"),
        _row("  script carr -> car", _script("carr", "car"), "replace second r with t",
             erratum=f"replacing the second r with t gives cart; carr -> car deletes an r {ref}"),
        _row("d(carr, cart)", dist["cart"], "2", erratum=f"carr -> cart is 1: replace the last r by t {ref}"),
        _row("  script carr -> cart", _script("carr", "cart"), "insert t and delete second r",
             erratum=f"a 2-step script; one substitution suffices {ref}"),
        _row("d(carr, care)", dist["care"]),
        _row("d(carr, cards)", dist["cards"]),
        _row("d(carr, cast)", dist["cast"]),
        _row("closest word(s)", closest, "car",
             erratum=f"car, cart and care all lie at distance 1: a tie the method must break {ref}"),
    ]
    return _make("edit_distance", rows)


# ----------------------------------------------------------------------------- PMI (003 §3.2)

@_example("pmi", "003 §3.2",
          "forward co-occurrence counts and PMI of \"The cat sat on the mat. The dog sat on the mat.\"")
def example_pmi():
    """003 §3.2: the 6 x 6 matrix of adjacent (forward) pairs within sentences, and
    ``PMI[x, y] = log p(x, y) / (p(x) p(y))`` with marginals from that matrix.
    """
    text = "The cat sat on the mat. The dog sat on the mat."
    vocab = ["the", "cat", "dog", "sat", "on", "mat"]
    printed = {"the": "0 1 1 0 0 2", "cat": "0 0 0 1 0 0", "dog": "0 0 0 1 0 0",
               "sat": "0 0 0 0 2 0", "on": "2 0 0 0 0 0", "mat": "0 0 0 0 0 0"}
    _, C = cooccurrence_matrix(sentence_tokenize(text), window=1, direction="forward", vocab=vocab)
    M = pmi_matrix(C)
    i = {w: n for n, w in enumerate(vocab)}
    ratio = (C[i["sat"], i["on"]] / C.sum()) / (C[i["sat"]].sum() / C.sum() * C[:, i["on"]].sum() / C.sum())
    err = ("eq. 3.2 drops the log: PMI = log p(x|y)/p(x) = log p(y|x)/p(y); the printed ratio is "
           f"exp(PMI) ({_TESTS}test_pmi_erratum_003_eq_3_2)")
    rows = [_row(f"row \"{w}\": counts of the next word", C[i[w]], printed[w]) for w in vocab]
    rows += [
        _row("PMI(the, cat) = ln((1/10) / (4/10 * 1/10))", M[i["the"], i["cat"]],
             note="= ln 2.5; the notes print no PMI values"),
        _row("PMI(sat, on)", M[i["sat"], i["on"]], f"p(x|y)/p(x) = {ratio:g} (eq. 3.2)", value=ratio,
             tol=1e-9, erratum=err),
        _row("PMI(the, the) (never adjacent)", M[i["the"], i["the"]], note="log 0 = -inf; PPMI makes it 0"),
    ]
    return _make("pmi", rows, remarks=(
        "Pairs are counted within sentences: the \"mat\" row is all zeros, so no pair crosses the period.",))


# ----------------------------------------------------------------------------- TF-IDF (003 §3.3)

@_example("tfidf", "003 §3.3.1",
          "TF-IDF of \"cat\": 3 of 100 words, in 1,000 of 10 million documents")
def example_tfidf():
    """003 §3.3.1: ``tf = 3/100``, ``idf = log(10^7 / 10^3)``, ``tf-idf = tf * idf``."""
    tf = float(term_frequency(np.array([3, 97]))[0])
    idf10 = idf(1000, 10_000_000, log_base=10)
    idf_e = idf(1000, 10_000_000)
    err = ("the text names log_e, but its 4 is log10(10^4); with the natural log IDF = 9.21 and "
           f"TF-IDF = 0.28 ({_TESTS}test_tfidf_erratum_003_3_3_1)")
    rows = [
        _row("TF = 3 / 100", tf, "0.03"),
        _row("IDF = log10(10,000,000 / 1,000)", idf10, "4"),
        _row("TF-IDF with log10", tf * idf10, "0.12"),
        _row("IDF = ln(10,000,000 / 1,000), the log the text names", idf_e, "4", erratum=err),
        _row("TF-IDF with ln", tf * idf_e, "0.12", erratum=err),
    ]
    return _make("tfidf", rows)


# ----------------------------------------------------------------------------- decoding cost (000 §2.5.1)

@_example("decoding_cost", "000 §2.5.1, 003 §6.2.1",
          "attention scores of generating n tokens: sum t^2 without a cache, sum t with one")
def example_decoding_cost():
    """000 §2.5.1 / 003 §6.2.1: without a cache step t attends t tokens to t tokens (t^2 scores),
    with a cache one new query to t keys (t scores); ``decoding_cost`` counts them.
    """
    no = [decoding_cost(t, use_cache=False)["scores"] for t in (1, 2, 3)]
    yes = [decoding_cost(t, use_cache=True)["scores"] for t in (1, 2, 3)]
    step_no = np.diff([0] + no)
    step_yes = np.diff([0] + yes)
    ns = np.array([500, 1000, 2000, 4000])
    p_no = fit_exponent(ns, [decoding_cost(int(n), use_cache=False)["scores"] for n in ns])
    p_yes = fit_exponent(ns, [decoding_cost(int(n), use_cache=True)["scores"] for n in ns])
    rows = [
        _row("scores per step, no cache, steps 1..3", step_no, "1^2, 2^2, 3^2", value=[1, 4, 9]),
        _row("total, 3 tokens, no cache", no[-1], "1^2 + 2^2 + 3^2", value=14),
        _row("scores per step, KV cache, steps 1..3", step_yes, "1, 2, 3"),
        _row("total, 3 tokens, KV cache", yes[-1], "1 + 2 + 3", value=6),
        _row("growth exponent of the total, no cache, n = 500..4000", p_no, "O(n^3)", value=3.0,
             tol=0.01),
        _row("growth exponent of the total, KV cache", p_yes, "O(n^2)", value=2.0, tol=0.01),
        _row("key/value rows projected, 1000 tokens: no cache, cache",
             (decoding_cost(1000, use_cache=False)["kv_rows"], decoding_cost(1000)["kv_rows"]),
             note="001 §2.2: O(t) new projections per token without a cache, O(1) with one"),
    ]
    return _make("decoding_cost", rows, remarks=(
        "Closed forms: n(n+1)(2n+1)/6 scores without a cache, n(n+1)/2 with one "
        "(see decoding_growth for numpytfmr's measured times).",))


@_example("decoding_growth", "000 §2.5.1, 003 §6.2.1 (measured)",
          "numpytfmr's decoding-step time against the cost model, with and without a KV cache")
def example_decoding_growth(*, tolerance=0.35, **options):
    """Measured growth of a decoding step (see ``bench.measure_decoding_growth``, whose keyword
    options this passes on) against the cost model; a measured exponent within ``tolerance``
    of the predicted one agrees. Timings depend on the machine: this is a check, not a test.
    """
    m = measure_decoding_growth(**options)

    def span(Ls, ts):
        return f"{ts[0] * 1e3:.3g} ms at L={Ls[0]} .. {ts[-1] * 1e3:.3g} ms at L={Ls[-1]}"

    p, pc = m["exponent"], m["cached_exponent"]
    q, qc = m["predicted_exponent"], m["predicted_cached_exponent"]
    rows = [
        _row("step time, no cache", span(m["contexts"], m["seconds"])),
        _row("growth exponent p (time ~ L^p), no cache", p, f"{q:.2g} (L^2 scores per step)",
             value=q, tol=tolerance, digits=3),
        _row("  all multiplications of the step, same L", m["flop_exponent"], digits=3,
             note="projections (linear in L) lower the exponent at small L"),
        _row("step time, KV cache", span(m["cached_contexts"], m["cached_seconds"])),
        _row("growth exponent p, KV cache", pc, f"{qc:.2g} (L scores per step)", value=qc,
             tol=tolerance, digits=3),
        _row("  all multiplications of the step, same L", m["cached_flop_exponent"], digits=3),
        _row("whole generation of n tokens: p + 1, no cache", p + 1, "O(n^3)", value=3.0,
             tol=tolerance, digits=3),
        _row("whole generation of n tokens: p + 1, KV cache", pc + 1, "O(n^2)", value=2.0,
             tol=tolerance, digits=3),
    ]
    common = sorted(set(m["contexts"]) & set(m["cached_contexts"]))
    if common:
        L = common[-1]
        speedup = m["seconds"][m["contexts"].index(L)] / m["cached_seconds"][m["cached_contexts"].index(L)]
        rows.append(_row(f"speed-up of the cached step at L = {L}", speedup, digits=3))
    return _make("decoding_growth", rows, remarks=(
        f"Measured on this machine: the fastest of {options.get('repeats', 3)}+ runs per length, "
        "one BLAS thread; an exponent agrees within "
        f"{tolerance} of the cost model's. A constant per-call overhead (argument checks) flattens "
        "the cached curve at small L; the cached step also copies the cache (np.concatenate), "
        "linear in L like its scores.",), extra=m)
