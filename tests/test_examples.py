"""The notes' worked examples (numpytfmr.run.examples and ``numpytfmr examples``).

Each example is checked against the notes' printed values at the notes' printed precision,
or, where the notes are wrong, against the correct value worked out here by hand (closed
forms), with the erratum named. The values go through ``numpytfmr.run.examples`` so that the
numbers the command prints are the tested ones.
"""
import functools
import math
import re

import numpy as np
import pytest

from numpytfmr.run import examples as ex
from numpytfmr.run.bench import measure_decoding_growth
from numpytfmr.run.cli import main
from numpytfmr.run.examples import run_example

NAMES = ex.example_names()
STATIC = [n for n in NAMES if n != "decoding_growth"]   # the one measured example is timed


def rounds_to(x, printed):
    """x rounds to the printed decimal string (half a unit of its last digit)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(x - float(printed)) <= 0.5 * 10 ** -decimals + 1e-12


def values(row):
    return np.asarray(row.computed, dtype=np.float64)


# ----------------------------------------------------------------------------- the library

def test_every_example_is_registered_with_section_and_title():
    assert len(NAMES) == 15 and len(set(NAMES)) == 15
    for name in NAMES:
        section, title = ex.example_info(name)
        assert re.match(r"00[0-4] ", section), section
        assert title


@pytest.mark.parametrize("name", STATIC)
def test_rows_agree_with_the_notes_or_carry_an_erratum(name):
    e = run_example(name)
    assert e.name == name and e.rows
    for r in e.rows:
        if r.erratum:
            assert r.agrees is False and r.status == "WRONG" and r.printed is not None, r
            # every erratum names the test that shows it, and that test exists in this file
            cited = re.findall(r"tests/test_examples\.py::(\w+)", r.erratum)
            assert cited and all(c in globals() for c in cited), r.erratum
        elif r.printed is None:
            assert r.agrees is None, r           # nothing printed: nothing to compare
        else:
            assert r.agrees is True, r           # no unexplained disagreement


def test_row_compares_at_the_printed_precision():
    assert ex._row("a", 0.25009, "0.2501").agrees is True      # rounds to the printed digits
    assert ex._row("a", 0.33759, "0.3374").agrees is False
    assert ex._row("a", [0.84147, 0.5403], "(0.84147, 0.54030)").agrees is True
    assert ex._row("a", 2, "3").agrees is False
    assert ex._row("a", 1e6, "1 million", value=1e6).agrees is True
    assert ex._row("a", "car", "car").agrees is True
    assert ex._row("a", 1.0).agrees is None
    with pytest.raises(ValueError, match="marked as an erratum but agrees"):
        ex._row("a", 0.5, "0.5", erratum="wrong")
    with pytest.raises(ValueError, match="computed has 2 numbers"):
        ex._row("a", [1.0, 2.0], "(1, 2, 3)")


def test_unknown_example_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown example 'nope'; valid names: attention_context"):
        run_example("nope")
    assert run_example("edit-distance").name == "edit_distance"   # - and _ are the same


def test_format_example_marks_errata_with_footnotes():
    text = ex.format_example(run_example("tfidf"))
    lines = text.splitlines()
    assert lines[0].startswith("tfidf -- 003 §3.3.1")
    wrong = [l for l in lines if "WRONG [1]" in l]
    assert len(wrong) == 2                                   # IDF and TF-IDF with ln share footnote 1
    assert text.count("[1] erratum:") == 1
    assert "test_tfidf_erratum_003_3_3_1" in text
    assert any(l.rstrip().endswith("ok") and l.lstrip().startswith("TF = 3 / 100") for l in lines)


# ----------------------------------------------------------------------------- attention (003 §5.1)

def _softmax_by_hand():
    e = [0.5, 0.2, 0.7]
    total = sum(math.exp(v) for v in e)
    return [math.exp(v) / total for v in e], total


def test_attention_context_003_5_1():
    e = run_example("attention_context")
    alpha, total = _softmax_by_hand()
    np.testing.assert_allclose(values(e.row("scores")), [0.5, 0.2, 0.7], atol=1e-15)
    for got, printed in zip(values(e.row("exp(e_tj)")), ["1.6487", "1.2214", "2.0138"]):
        assert rounds_to(got, printed)
    assert rounds_to(e.row("S =").computed, "4.8839")
    assert e.row("alpha_t2").computed == pytest.approx(alpha[1], rel=1e-14)
    assert rounds_to(e.row("alpha_t2").computed, "0.2501")
    assert e.row("alpha_t1 + alpha_t2").computed == pytest.approx(1.0, abs=1e-15)
    assert rounds_to(e.row("c_t, first").computed, "0.7499")
    c = values(e.row("c_t, rounded"))
    assert rounds_to(c[0], "0.75") and rounds_to(c[1], "0.66")


def test_attention_context_erratum_003_5_1():
    # 003 §5.1 / 000 §2.1 print alpha = (0.3374, 0.2501, 0.4125) and c_t = (0.7499, 0.6626):
    # 1.6487/4.8839 = 0.33758, 2.0138/4.8839 = 0.41233, and c_t2 = alpha_2 + alpha_3 = 0.66242
    e = run_example("attention_context")
    alpha, _ = _softmax_by_hand()
    a1, a3, c2 = e.row("alpha_t1").computed, e.row("alpha_t3").computed, e.row("c_t, second").computed
    assert a1 == pytest.approx(alpha[0], rel=1e-14) and round(a1, 5) == 0.33758
    assert a3 == pytest.approx(alpha[2], rel=1e-14) and round(a3, 5) == 0.41233
    assert c2 == pytest.approx(alpha[1] + alpha[2], rel=1e-14) and round(c2, 5) == 0.66242
    assert round(1.6487 / 4.8839, 4) == 0.3376   # the notes' own inputs do not give 0.3374 either
    for q in ("alpha_t1", "alpha_t3", "c_t, second"):
        assert e.row(q).status == "WRONG"


# ----------------------------------------------------------------------------- KV cache (003 §6.2.1)

def test_kv_cache_003_6_2_1():
    e = run_example("kv_cache")
    # hand computed: x_i W^K with W^K = [[1, 2], [0, 1]] is (x1, 2 x1 + x2); W^V = [[.5, -.5], [1, .5]]
    x = [(1, 2), (3, 4), (5, 6)]
    for i, (a, b) in enumerate(x, start=1):
        np.testing.assert_array_equal(values(e.row(f"k_{i} = x_{i} W^K")), [a, 2 * a + b])
        np.testing.assert_allclose(values(e.row(f"v_{i} = x_{i} W^V")), [0.5 * a + b, -0.5 * a + 0.5 * b])
    np.testing.assert_array_equal(values(e.row("q_1, q_2, q_3")), x)       # W^Q = I (000 §2.5.1)
    assert e.row("z_4 from the cache").computed <= 1e-12                 # caching changes no output
    assert e.row("K cache shape").computed == "(1, 4, 2)"


def test_kv_cache_erratum_003_6_2_1():
    # 003 §6.2.1 writes k_1 = W^K x_1 (a column product, (5, 2)) and garbles k_2, k_3; the printed
    # (1, 4), (3, 10), (5, 16) are x_i W^K, as 000 §2.5.1 has them
    e = run_example("kv_cache")
    r = e.row("k_1, as the product")
    np.testing.assert_array_equal(values(r), [1, 4])
    assert "(5, 2)" in r.printed and r.status == "WRONG"
    assert e.row("k_2, k_3, as the products").status == "WRONG"


# ----------------------------------------------------------------------------- positional encodings

def test_sinusoidal_003_7_2_1():
    e = run_example("sinusoidal")
    np.testing.assert_array_equal(values(e.row("PE(0)")), [0, 1, 0, 1])
    printed = {"PE(1, 0)": "0.84147", "PE(1, 1)": "0.54030", "PE(1, 2)": "0.00999983", "PE(1, 3) =": "0.99995"}
    exact = {"PE(1, 0)": math.sin(1), "PE(1, 1)": math.cos(1), "PE(1, 2)": math.sin(0.01),
             "PE(1, 3) =": math.cos(0.01)}
    for q, p in printed.items():
        assert e.row(q).computed == pytest.approx(exact[q], abs=1e-15)
        assert rounds_to(e.row(q).computed, p)


def test_sinusoidal_erratum_000_2_3_2():
    # 000 §2.3.2: cos(pos / 10000^((2i+1)/d)) would give cos(10000^(-3/4)) = 0.9999995, not 0.99995
    r = run_example("sinusoidal").row("PE(1, 3), by 000")
    assert r.computed == pytest.approx(math.cos(0.01), abs=1e-15)
    assert not rounds_to(math.cos(10000 ** -0.75), "0.99995")
    assert r.status == "WRONG"


def test_sinusoidal_rotation_erratum_003_7_2_2():
    # 003 §7.2.2: R(3pi/4) [1, 0] = [-sqrt2/2, sqrt2/2] is printed as [sin 5pi/4, cos 5pi/4];
    # both are -sqrt2/2: for [sin, cos] pairs the shift block is [[cos, sin], [-sin, cos]]
    e = run_example("sinusoidal_rotation")
    h = math.sqrt(2) / 2
    np.testing.assert_allclose(values(e.row("PE(2)")), [1, 0], atol=1e-15)
    np.testing.assert_allclose(values(e.row("R(3pi/4)")), [[-h, -h], [h, -h]], atol=1e-15)
    np.testing.assert_allclose(values(e.row("R [1, 0]^T")), [-h, h], atol=1e-15)   # as printed
    np.testing.assert_allclose(values(e.row("PE(5)")), [math.sin(5 * math.pi / 4), math.cos(5 * math.pi / 4)],
                               atol=1e-15)
    np.testing.assert_allclose(values(e.row("PE(5)")), [-h, -h], atol=1e-15)
    assert e.row("PE(5)").status == "WRONG"
    np.testing.assert_allclose(values(e.row("[[cos, sin], [-sin, cos]] PE(2)")), [-h, -h], atol=1e-15)
    assert e.row("max |R(k) PE(p) - PE(p+k)|, R as printed").computed > 1.0
    assert e.row("max |R(-k) PE(p)").computed < 1e-12


def test_rope_004_the_dog_slept():
    e = run_example("rope")
    # positions 1, 2, 3; theta = p for pair (0, 1) and p / 100 for pair (2, 3)
    np.testing.assert_allclose(values(e.row("cos(theta), pair (0,1)")), np.cos([1, 2, 3]), atol=1e-15)
    np.testing.assert_allclose(values(e.row("sin(theta), pair (2,3)")), np.sin([0.01, 0.02, 0.03]),
                               atol=1e-15)
    printed = {"\"the\"": [0.402, 0.811, 0.192, 0.802], "\"dog\"": [-0.845, 0.163, 0.298, 0.106],
               "\"slept\"": [-0.212, -0.071, 0.879, 0.727]}
    emb = {"\"the\"": (0.9, 0.1, 0.2, 0.8, 1), "\"dog\"": (0.5, 0.7, 0.3, 0.1, 2),
           "\"slept\"": (0.2, 0.1, 0.9, 0.7, 3)}
    for word, p in printed.items():
        got = values(e.row(f"new embedding of {word}"))
        a, b, c, d, pos = emb[word]
        t0, t1 = pos, pos / 100                                   # hand-written 2x2 rotations
        by_hand = [a * math.cos(t0) - b * math.sin(t0), b * math.cos(t0) + a * math.sin(t0),
                   c * math.cos(t1) - d * math.sin(t1), d * math.cos(t1) + c * math.sin(t1)]
        np.testing.assert_allclose(got, by_hand, atol=1e-14)
        assert all(rounds_to(g, f"{v:.3f}") for g, v in zip(got, p)), (word, got)
    # the rotation of pair (0, 1) adds (2 - 1) rad to the dog-the angle
    before, after = e.row("angle dog-the").computed
    assert after - before == pytest.approx(math.degrees(1.0), abs=1e-9)


def test_rope_erratum_004_rotate_queries_and_keys():
    # 004 "Integration into Transformers": rotating the embeddings and then projecting makes the
    # score depend on the absolute positions; rotating the projected q and k does not
    e = run_example("rope")
    s0, s10 = e.row("q_dog . k_the").computed
    assert abs(s0 - s10) > 0.1 and e.row("q_dog . k_the").status == "WRONG"
    a0, a10 = e.row("the same with RoPE on the projected").computed
    assert a0 == pytest.approx(a10, rel=1e-12)


def test_permutation_003_7_1():
    e = run_example("permutation")
    assert e.row("max |out(dog #1) - out(dog #2)|, no positions").computed <= 1e-12
    assert e.row("max |Attention(PX)").computed <= 1e-12
    assert e.row("max |A' - P A P^T|").computed <= 1e-12
    assert e.row("max |out(dog #1) - out(dog #2)|, sinusoidal").computed > 1e-4


# ----------------------------------------------------------------------------- cost (000 §2.7.2, 001)

def test_lora_params_000_2_7_2():
    e = run_example("lora_params")
    d = k = 4096
    r = 8
    assert e.row("full fine-tuning").computed == d * k == 16_777_216
    assert e.row("LoRA, r = 8").computed == d * r + r * k == 65_536
    assert e.row("A.size + B.size").computed == d * r + r * k
    assert e.row("LoRA / full").computed == pytest.approx(1 / 256)
    assert e.row("LoRA at r = min").computed == 2 * d * k


def test_matmul_cost_001_1_1_and_toy_heads_001_2_1():
    e = run_example("matmul_cost")
    assert tuple(e.row("A (2x3) B (3x4)").computed) == (2 * 4 * 3, 2 * 4 * 2)
    assert e.row("score matrices Q K^T, 1 head").computed == "(1, 4, 4)"    # one 4 x 4 matrix
    assert e.row("score matrices Q K^T, 2 heads").computed == "(2, 4, 4)"   # two 4 x 4 matrices
    # hand computed: (4, 8) x (8, 4) is 4*4*8 = 128 multiplications, two (4, 4) x (4, 4) 2*4*4*4 = 128
    assert tuple(e.row("Q K^T multiplications").computed) == (128, 128)
    assert tuple(e.row("Q K^T additions").computed) == (4 * 4 * 7, 2 * 4 * 4 * 3)


def test_score_memory_001_2_1():
    e = run_example("score_memory")
    assert e.row("n = 1000, one head").computed == 1000 * 1000        # "1 million entries per head"
    assert e.row("n = 1000, h = 12").computed == 12 * 1000 * 1000      # "12 million ... in one layer"
    assert e.row("the same in float32").computed == 4 * 12_000_000
    assert e.row("n = 4, one head").computed == 16 and e.row("n = 4, two heads").computed == 32


def test_decoding_cost_000_2_5_1():
    e = run_example("decoding_cost")
    np.testing.assert_array_equal(values(e.row("scores per step, no cache")), [1, 4, 9])
    np.testing.assert_array_equal(values(e.row("scores per step, KV cache")), [1, 2, 3])
    assert e.row("total, 3 tokens, no cache").computed == 1 + 4 + 9
    assert e.row("total, 3 tokens, KV cache").computed == 1 + 2 + 3
    assert e.row("growth exponent of the total, no cache").computed == pytest.approx(3.0, abs=0.01)
    assert e.row("growth exponent of the total, KV cache").computed == pytest.approx(2.0, abs=0.01)
    assert tuple(e.row("key/value rows").computed) == (1000 * 1001 // 2, 1000)


# ----------------------------------------------------------------------------- classical NLP (003 ch. 2-3)

def test_perplexity_003_2_1():
    e = run_example("perplexity")
    assert e.row("entropy of a uniform").computed == pytest.approx(3.0, abs=1e-12)   # three bits
    assert e.row("2^H").computed == pytest.approx(8.0)                               # 2^3 = 8
    assert e.row("perplexity of a model").computed == pytest.approx(8.0)
    assert e.row("exp(H in nats)").computed == pytest.approx(8.0)
    assert abs(e.row("H(P,Q) - H(P)").computed) < 1e-12


def test_perplexity_erratum_003_eq_2_1():
    # eq. 2.1 drops the log: exp(-mean p) is not the perplexity; (1/2 * 1/4 * 1/8)^(-1/3) = 4 is
    r = run_example("perplexity").row("PPL of tokens")
    assert r.computed == pytest.approx(4.0, rel=1e-12)
    assert r.status == "WRONG"
    assert not math.isclose(math.exp(-(0.5 + 0.25 + 0.125) / 3), 4.0)


def test_edit_distance_errata_003_3_1():
    # 003 §3.1 prints cat 3, car 1 ("replace second r with t"), cart 2 and "car" as the unique
    # closest word; by hand: cat 2 (r->t, delete r), car 1 (delete r), cart 1 (r->t), care 1 (r->e)
    e = run_example("edit_distance")
    assert {w: e.row(f"d(carr, {w})").computed for w in ["cat", "car", "cart", "care", "cards", "cast"]} == \
        {"cat": 2, "car": 1, "cart": 1, "care": 1, "cards": 2, "cast": 2}
    assert e.row("d(carr, car)").status == "ok"
    for q in ("d(carr, cat)", "d(carr, cart)", "closest word(s)", "  script carr -> car"):
        assert e.row(q).status == "WRONG", q
    assert e.row("closest word(s)").computed == "car, cart, care"
    assert e.row("  script carr -> car").computed == "delete r"
    assert e.row("  script carr -> cart").computed == "replace r by t"


def test_pmi_003_3_2():
    e = run_example("pmi")
    printed = {"the": [0, 1, 1, 0, 0, 2], "cat": [0, 0, 0, 1, 0, 0], "dog": [0, 0, 0, 1, 0, 0],
               "sat": [0, 0, 0, 0, 2, 0], "on": [2, 0, 0, 0, 0, 0], "mat": [0, 0, 0, 0, 0, 0]}
    for w, row in printed.items():
        np.testing.assert_array_equal(values(e.row(f"row \"{w}\"")), row)
    # hand computed from the 10 pairs: p(the, cat) = 1/10, p(the) = 4/10, p(cat) = 1/10
    assert e.row("PMI(the, cat)").computed == pytest.approx(math.log(2.5), rel=1e-14)
    assert e.row("PMI(the, the)").computed == -math.inf


def test_pmi_erratum_003_eq_3_2():
    # eq. 3.2 prints PMI = p(x|y)/p(x) without the log; for (sat, on): p(sat|on)/p(sat) = (2/2)/(2/10) = 5
    r = run_example("pmi").row("PMI(sat, on)")
    assert r.computed == pytest.approx(math.log(5), rel=1e-14)
    assert "= 5" in r.printed and r.status == "WRONG"


def test_tfidf_003_3_3_1():
    e = run_example("tfidf")
    assert rounds_to(e.row("TF = 3 / 100").computed, "0.03")
    assert e.row("IDF = log10").computed == pytest.approx(4.0, abs=1e-12)
    assert rounds_to(e.row("TF-IDF with log10").computed, "0.12")


def test_tfidf_erratum_003_3_3_1():
    # the text says log_e, but log(10^7 / 10^3) = 4 is base 10: ln 10^4 = 9.21, TF-IDF 0.28
    e = run_example("tfidf")
    assert e.row("IDF = ln").computed == pytest.approx(4 * math.log(10), rel=1e-14)
    assert round(e.row("TF-IDF with ln").computed, 2) == 0.28
    assert e.row("IDF = ln").status == e.row("TF-IDF with ln").status == "WRONG"


# ----------------------------------------------------------------------------- the measured example

QUICK = {"contexts": (16, 32, 64), "cached_contexts": (64, 128, 256), "repeats": 1}


def test_decoding_growth_runs_and_returns_numbers():
    # a sanity check only: timings depend on the machine, so nothing about their values
    e = run_example("decoding_growth", **QUICK, single_thread=False)
    m = e.extra
    assert m["contexts"] == [16, 32, 64] and len(m["seconds"]) == 3 and len(m["cached_seconds"]) == 3
    assert all(t > 0 and math.isfinite(t) for t in m["seconds"] + m["cached_seconds"])
    assert math.isfinite(m["exponent"]) and math.isfinite(m["cached_exponent"])
    # the predictions come from the cost model: L^2 and L scores per step, exactly
    assert m["predicted_exponent"] == pytest.approx(2.0, abs=1e-12)
    assert m["predicted_cached_exponent"] == pytest.approx(1.0, abs=1e-12)
    assert 1.0 < m["flop_exponent"] < 2.0 and 0.0 < m["cached_flop_exponent"] < 1.0
    # the table's rule: a measured exponent agrees when it lies within the tolerance (0.35) of
    # the cost model's; a whole generation adds one to the exponent of its steps
    expected = {
        "growth exponent p (time ~ L^p), no cache": (m["exponent"], m["predicted_exponent"]),
        "growth exponent p, KV cache": (m["cached_exponent"], m["predicted_cached_exponent"]),
        "whole generation of n tokens: p + 1, no cache": (m["exponent"] + 1, 3.0),
        "whole generation of n tokens: p + 1, KV cache": (m["cached_exponent"] + 1, 2.0)}
    for quantity, (measured, predicted) in expected.items():
        r = e.row(quantity)
        assert r.computed == pytest.approx(measured, rel=1e-12, abs=1e-12), r
        assert r.agrees is (abs(measured - predicted) <= 0.35), r
    assert all(not r.erratum for r in e.rows)


def test_measure_decoding_growth_in_a_single_thread_process():
    m = measure_decoding_growth(contexts=(8, 16), cached_contexts=(16, 32), repeats=1)
    assert len(m["seconds"]) == 2 and all(t > 0 for t in m["seconds"] + m["cached_seconds"])


def test_measure_decoding_growth_bad_input():
    with pytest.raises(ValueError, match="^measure_decoding_growth: contexts is \\[8, 8\\]"):
        measure_decoding_growth(contexts=(8, 8), single_thread=False)
    with pytest.raises(ValueError, match="^measure_decoding_growth: d_model is 10 and n_heads is 4"):
        measure_decoding_growth(d_model=10, n_heads=4)
    with pytest.raises(TypeError, match="^measure_decoding_growth: repeats is 1.5"):
        measure_decoding_growth(repeats=1.5)


# ----------------------------------------------------------------------------- the command

@pytest.fixture
def quick_growth(monkeypatch):
    """Make the timed example quick inside the command (its full run is a few seconds)."""
    section, title, fn = ex._REGISTRY["decoding_growth"]
    monkeypatch.setitem(ex._REGISTRY, "decoding_growth",
                        (section, title, functools.partial(fn, **QUICK, single_thread=False)))


def test_cli_examples_runs_all(quick_growth, capsys):
    assert main(["examples"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert re.search(rf"^{name} -- ", out, re.M), name
    assert "WRONG [1]" in out and "15 example(s)" in out


def test_cli_examples_list(capsys):
    assert main(["examples", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split()[0] for l in lines] == NAMES
    assert "003 §3.1" in next(l for l in lines if l.startswith("edit_distance"))


def test_cli_examples_selected_and_unknown(capsys):
    assert main(["examples", "tfidf", "edit-distance"]) == 0
    out = capsys.readouterr().out
    assert "tfidf -- " in out and "edit_distance -- " in out and "kv_cache -- " not in out
    assert main(["examples", "tfidf", "no_such_example"]) == 2
    err = capsys.readouterr().err
    assert "unknown example 'no_such_example'" in err and "valid names: attention_context" in err
