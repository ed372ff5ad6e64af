"""numpytfmr/classical.py, classical NLP (003 ch. 2-3): worked examples of the notes, published
values, properties; and the smoothed n-gram language models (003 §2.1 extended to n - 1 ids
of context, interpolated Kneser-Ney) and bits per byte, the baselines of ``numpytfmr pretrain``."""
from functools import lru_cache
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from numpytfmr import (
    bigram_counts, bigram_log_likelihood, bigram_mle, bigram_sequence_probs, bm25_scores,
    confusion_counts, cooccurrence_matrix, cross_entropy, document_frequency, edit_distance,
    edit_distance_table, edit_operations, entropy, f1_score, idf, kl_divergence,
    label_smoothing_targets, pagerank, perplexity, pmi, pmi_matrix, precision,
    precision_recall_f1, recall, reciprocal_rank_fusion, sentence_tokenize, term_document_counts,
    term_frequency, textrank, textrank_similarity, tf_idf, word_tokenize,
)
from numpytfmr.classical import (bits_per_byte, ngram_bits_per_byte, ngram_log_probs, ngram_model,
                                 ngram_probs, text_bytes)

short_words = st.text(alphabet="abc", max_size=7)


def _dirichlet(rng, shape):
    g = rng.gamma(1.0, size=shape)
    return g / g.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------- tokenizing

def test_tokenizers():
    assert word_tokenize("The cat sat.") == ["the", "cat", "sat"]
    assert word_tokenize("The Cat", lower=False) == ["The", "Cat"]
    assert sentence_tokenize("The cat sat on the mat. The dog sat!") == [
        ["the", "cat", "sat", "on", "the", "mat"], ["the", "dog", "sat"]]
    with pytest.raises(TypeError, match="^word_tokenize: text"):
        word_tokenize(["a"])


# ----------------------------------------------------------------------------- bigram MLE (003 §2.1)

SAM = [["I", "am", "Sam"], ["Sam", "I", "am"], ["I", "do", "not", "like", "green", "eggs", "and", "ham"]]


def test_bigram_mle_published_i_am_sam():
    # Jurafsky & Martin, SLP3 §3.1: P(I|<s>) = .67, P(Sam|<s>) = .33, P(am|I) = .67,
    # P(</s>|Sam) = 0.5, P(Sam|am) = .5, P(do|I) = .33
    vocab, P = bigram_mle(SAM)
    ix = {w: i for i, w in enumerate(vocab)}
    p = lambda w, prev: P[ix[prev], ix[w]]  # noqa: E731
    assert round(p("I", "<s>"), 2) == 0.67
    assert round(p("Sam", "<s>"), 2) == 0.33
    assert round(p("am", "I"), 2) == 0.67
    assert p("</s>", "Sam") == 0.5
    assert p("Sam", "am") == 0.5
    assert round(p("do", "I"), 2) == 0.33
    assert vocab[0] == "<s>" and vocab[-1] == "</s>"
    rows = P.sum(axis=1)
    np.testing.assert_allclose(rows[:-1], 1.0)  # every history row is a distribution
    assert rows[-1] == 0 and np.all(P[:, 0] == 0)  # nothing follows </s>; <s> is never predicted


def test_bigram_counts_and_mle_is_count_ratio():
    vocab, C = bigram_counts(SAM)
    _, P = bigram_mle(SAM)
    ix = {w: i for i, w in enumerate(vocab)}
    assert C[ix["I"], ix["am"]] == 2 and C.sum() == (3 + 1) + (3 + 1) + (8 + 1)  # n + 1 bigrams per sentence
    hist = C.sum(axis=1)
    np.testing.assert_allclose(P[hist > 0], C[hist > 0] / hist[hist > 0, None])


def test_bigram_add_k_smoothing():
    vocab, C = bigram_counts(SAM)
    _, P1 = bigram_mle(SAM, k=1)
    ix = {w: i for i, w in enumerate(vocab)}
    V = len(vocab) - 1  # every type but <s> can be predicted
    # Laplace: (Count(I, am) + 1) / (Count(I) + V) = 3 / (3 + 11)
    assert P1[ix["I"], ix["am"]] == pytest.approx(3 / (3 + V))
    assert P1[ix["ham"], ix["Sam"]] == pytest.approx(1 / (1 + V))  # unseen bigram gets mass
    np.testing.assert_allclose(P1[:-1].sum(axis=1), 1.0)
    _, Pk = bigram_mle(SAM, k=0.5)
    assert Pk[ix["I"], ix["am"]] == pytest.approx(2.5 / (3 + 0.5 * V))


def test_bigram_log_likelihood_and_perplexity():
    vocab, P = bigram_mle(SAM)
    # <s> I am Sam </s>: 2/3 * 2/3 * 1/2 * 1/2 = 1/9
    assert bigram_log_likelihood(["I", "am", "Sam"], vocab, P) == pytest.approx(math.log(1 / 9))
    assert bigram_log_likelihood(["I", "am", "Sam"], vocab, P, base=2) == pytest.approx(math.log2(1 / 9))
    probs = bigram_sequence_probs(["I", "am", "Sam"], vocab, P)
    np.testing.assert_allclose(probs, [2 / 3, 2 / 3, 1 / 2, 1 / 2])
    assert perplexity(probs) == pytest.approx((1 / 9) ** (-1 / 4))
    # an unseen bigram has MLE probability 0: log-likelihood -inf, perplexity inf; add-one fixes it
    assert bigram_log_likelihood(["ham", "I"], vocab, P) == -math.inf
    assert perplexity(bigram_sequence_probs(["ham", "I"], vocab, P)) == math.inf
    v1, P1 = bigram_mle(SAM, k=1)
    assert np.isfinite(bigram_log_likelihood(["ham", "I"], v1, P1))


def test_bigram_flat_token_list():
    vocab, P = bigram_mle("a b a b a c".split())
    ix = {w: i for i, w in enumerate(vocab)}
    assert P[ix["a"], ix["b"]] == pytest.approx(2 / 3) and P[ix["a"], ix["c"]] == pytest.approx(1 / 3)
    assert P[ix["b"], ix["a"]] == 1.0
    assert np.all(P[ix["c"]] == 0)  # c is never a history
    # without markers the first token is given: P(b|a) P(a|b)
    assert bigram_log_likelihood(["a", "b", "a"], vocab, P, markers=False) == pytest.approx(math.log(2 / 3))


def test_bigram_bad_input():
    vocab, P = bigram_mle(SAM)
    with pytest.raises(ValueError, match="^bigram_sequence_probs: sequence holds 'Bob'"):
        bigram_log_likelihood(["Bob"], vocab, P)
    with pytest.raises(TypeError, match="^bigram_mle: corpus is a str"):
        bigram_mle("I am Sam")
    with pytest.raises(ValueError, match="^bigram_mle: k is -1.0"):
        bigram_mle(SAM, k=-1)
    with pytest.raises(ValueError, match="^bigram_mle: corpus is empty"):
        bigram_mle([])
    v2, P2 = bigram_mle("a b a".split())
    with pytest.raises(ValueError, match="markers=False"):
        bigram_log_likelihood(["a", "b"], v2, P2)


# ----------------------------------------------------------------------------- perplexity, entropy (003 §2.1.1-2)

def test_notes_perplexity_three_bits_is_eight():
    # 003 §2.1.1: a model with an entropy of three bits chooses among 2^3 = 8 options: perplexity 8
    uniform8 = np.full(8, 1 / 8)
    assert entropy(uniform8, base=2) == pytest.approx(3.0)
    assert 2 ** entropy(uniform8, base=2) == pytest.approx(8.0)
    assert math.exp(entropy(uniform8)) == pytest.approx(8.0)  # same in nats


@pytest.mark.parametrize("V", [1, 2, 7, 50])
def test_perplexity_of_uniform_model_is_V(V):
    rng = np.random.default_rng(V)
    probs = np.full((3, 11, V), 1.0 / V)
    targets = rng.integers(0, V, size=(3, 11))
    assert perplexity(probs, targets) == pytest.approx(V)
    assert perplexity(np.full(5, 1.0 / V)) == pytest.approx(V)


def test_perplexity_is_exp_cross_entropy_and_nth_root():
    rng = np.random.default_rng(0)
    Pm = _dirichlet(rng, (13, 9))
    t = rng.integers(0, 9, size=13)
    p = Pm[np.arange(13), t]
    L_ce = -np.mean(np.log(p))  # 003 eq. 2.2
    assert perplexity(Pm, t) == pytest.approx(math.exp(L_ce))
    assert perplexity(p) == pytest.approx(np.prod(p) ** (-1 / 13))  # the N-th root form


def test_errata_cross_entropy_eq_2_1_needs_log():
    # 003 eq. 2.1 prints L_CE = -E_{w~P}[P_theta(w_i|w_<i)], without the log; the following lines
    # (2.2-2.5) and PPL = exp(L_CE) only hold with -E[log P_theta]
    rng = np.random.default_rng(1)
    p = rng.uniform(0.05, 0.9, size=20)
    assert perplexity(p) == pytest.approx(math.exp(-np.mean(np.log(p))))
    assert not np.isclose(perplexity(p), math.exp(-np.mean(p)))


def test_cross_entropy_equals_entropy_plus_kl():
    rng = np.random.default_rng(2)
    P, Q = _dirichlet(rng, (6, 4, 10)), _dirichlet(rng, (6, 4, 10))
    H, CE, KL = entropy(P), cross_entropy(P, Q), kl_divergence(P, Q)
    assert H.shape == (6, 4)
    np.testing.assert_allclose(CE, H + KL, rtol=1e-12)
    assert np.all(KL > 0)
    np.testing.assert_allclose(kl_divergence(P, P), 0.0, atol=1e-15)
    np.testing.assert_allclose(CE, -np.sum(P * np.log(Q), axis=-1), rtol=1e-12)
    np.testing.assert_allclose(entropy(P, base=2), H / math.log(2), rtol=1e-12)
    # along another axis
    np.testing.assert_allclose(entropy(np.moveaxis(P, -1, 0), axis=0), H, rtol=1e-12)


def test_entropy_conventions():
    assert entropy([1, 0, 0]) == 0.0  # 0 log 0 = 0, integer one-hot accepted
    assert cross_entropy([0.5, 0.5, 0.0], [0.5, 0.5, 0.0]) == pytest.approx(math.log(2))
    assert cross_entropy([0.5, 0.5], [1.0, 0.0]) == math.inf
    assert kl_divergence([0.5, 0.5], [1.0, 0.0]) == math.inf
    x32 = np.array([0.25, 0.75], dtype=np.float32)
    assert entropy(np.stack([x32, x32])).dtype == np.float32


def test_distribution_bad_input():
    with pytest.raises(ValueError, match="^entropy: P sums to 0.9"):
        entropy([0.5, 0.4])
    with pytest.raises(ValueError, match="^cross_entropy: P has values in"):
        cross_entropy([1.5, -0.5], [0.5, 0.5])
    with pytest.raises(ValueError, match="^kl_divergence: Q has shape"):
        kl_divergence([0.5, 0.5], [1 / 3, 1 / 3, 1 / 3])
    with pytest.raises(TypeError, match="^entropy: P has dtype"):
        entropy(["a", "b"])
    with pytest.raises(ValueError, match="^perplexity: targets has shape"):
        perplexity(np.full((4, 3), 1 / 3), np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match="^perplexity: targets has values"):
        perplexity(np.full((4, 3), 1 / 3), np.full(4, 3))


# ----------------------------------------------------------------------------- precision / recall / F1 (003 §2.1)

def test_precision_recall_f1_hand_computed():
    y_true = [1, 1, 0, 0, 1, 0]
    y_pred = [1, 0, 1, 0, 1, 0]
    assert confusion_counts(y_true, y_pred) == (2, 1, 1, 2)
    p, r, f = precision_recall_f1(y_true, y_pred)
    assert (p, r, f) == (pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert precision(3, 1) == 0.75 and recall(3, 3) == 0.5
    assert f1_score(0.75, 0.5) == pytest.approx(0.6)  # 2 * .75 * .5 / 1.25
    # string labels and another positive class
    assert precision_recall_f1(["spam", "ham"], ["spam", "spam"], positive="spam") == (0.5, 1.0, pytest.approx(2 / 3))
    assert precision(0, 0) == 0.0 and recall(0, 0) == 0.0 and f1_score(0.0, 0.0) == 0.0


def test_f1_from_counts_is_harmonic_mean():
    rng = np.random.default_rng(3)
    for _ in range(50):
        tp, fp, fn = (int(v) for v in rng.integers(1, 30, size=3))
        f = f1_score(precision(tp, fp), recall(tp, fn))
        assert f == pytest.approx(2 * tp / (2 * tp + fp + fn))
        assert min(precision(tp, fp), recall(tp, fn)) <= f <= max(precision(tp, fp), recall(tp, fn))


def test_precision_recall_bad_input():
    with pytest.raises(ValueError, match="^precision: fp is -1"):
        precision(1, -1)
    with pytest.raises(TypeError, match="^recall: tp is 1.5"):
        recall(1.5, 2)
    with pytest.raises(ValueError, match="^confusion_counts: y_true has shape"):
        confusion_counts([1, 0], [1])
    with pytest.raises(ValueError, match="^f1_score: precision is 2.0"):
        f1_score(2.0, 0.5)


# ----------------------------------------------------------------------------- edit distance (003 §3.1)

@lru_cache(maxsize=None)
def _ref_lev(a, b, sub=1, ins=1, dele=1):
    """Textbook recursion, independent of the table code."""
    if not a:
        return len(b) * ins
    if not b:
        return len(a) * dele
    return min(_ref_lev(a[:-1], b, sub, ins, dele) + dele,
               _ref_lev(a, b[:-1], sub, ins, dele) + ins,
               _ref_lev(a[:-1], b[:-1], sub, ins, dele) + (0 if a[-1] == b[-1] else sub))


def test_edit_distance_published_pairs():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("flaw", "lawn") == 2
    assert edit_distance("intention", "execution") == 5
    # Jurafsky & Martin, SLP3 §2.5: with substitution cost 2, intention -> execution is 8
    assert edit_distance("intention", "execution", sub_cost=2) == 8
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "") == 3 and edit_distance("", "") == 0
    assert isinstance(edit_distance("kitten", "sitting"), int)


def test_errata_edit_distance_carr():
    # 003 §3.1 prints cat: 3, car: 1, cart: 2 and picks "car" as the unique closest word.
    # Correct: carr -> cat is 2 (r->t, delete r), carr -> cart is 1 (last r->t), carr -> car is 1
    # (delete an r; the notes' "replace second r with t" would give "cart"), and "care" is 1 too:
    # car, cart and care tie.
    d = {w: edit_distance("carr", w) for w in ["cat", "car", "cart", "care", "cards", "cast"]}
    assert d == {"cat": 2, "car": 1, "cart": 1, "care": 1, "cards": 2, "cast": 2}
    assert sorted(w for w in d if d[w] == min(d.values())) == ["car", "care", "cart"]
    ops = [op for op in edit_operations("carr", "car") if op[0] != "match"]
    assert [(op[0], op[3]) for op in ops] == [("delete", "r")]
    ops = [op for op in edit_operations("carr", "cart") if op[0] != "match"]
    assert ops == [("substitute", 3, 3, "r", "t")]


@settings(max_examples=150, deadline=None)
@given(short_words, short_words, short_words)
def test_edit_distance_is_a_metric(a, b, c):
    d = edit_distance
    assert (d(a, b) == 0) == (a == b)
    assert d(a, b) == d(b, a)
    assert d(a, c) <= d(a, b) + d(b, c)
    assert abs(len(a) - len(b)) <= d(a, b) <= max(len(a), len(b))


@settings(max_examples=100, deadline=None)
@given(short_words, short_words,
       st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 3), (3, 1, 1), (0.7, 0.3, 0.4), (0.1, 0.2, 0.2)]))
def test_edit_distance_matches_recursion_and_ops(a, b, costs):
    sub, ins, dele = costs
    dist = edit_distance(a, b, sub_cost=sub, ins_cost=ins, del_cost=dele)
    assert dist == pytest.approx(_ref_lev(a, b, sub, ins, dele), rel=1e-12, abs=1e-12)
    ops = edit_operations(a, b, sub_cost=sub, ins_cost=ins, del_cost=dele)
    cost = {"match": 0, "substitute": sub, "insert": ins, "delete": dele}
    assert sum(cost[op[0]] for op in ops) == pytest.approx(dist, rel=1e-12, abs=1e-12)
    assert "".join(op[4] for op in ops if op[0] != "delete") == b  # the script spells b
    assert "".join(op[3] for op in ops if op[0] != "insert") == a  # and consumes a in order
    for op, i, j, src, dst in ops:
        assert src is None or a[i] == src
        assert dst is None or b[j] == dst


@settings(max_examples=60, deadline=None)
@given(short_words, short_words)
def test_edit_distance_sub2_is_indel_distance(a, b):
    # with substitution at least ins + del, only insertions and deletions are used:
    # d = len(a) + len(b) - 2 LCS(a, b)
    @lru_cache(maxsize=None)
    def lcs(i, j):
        if i == 0 or j == 0:
            return 0
        return lcs(i - 1, j - 1) + 1 if a[i - 1] == b[j - 1] else max(lcs(i - 1, j), lcs(i, j - 1))
    assert edit_distance(a, b, sub_cost=2) == len(a) + len(b) - 2 * lcs(len(a), len(b))


def test_edit_distance_weights_words_and_table():
    assert edit_distance("ab", "ac", sub_cost=0.5) == 0.5
    assert isinstance(edit_distance("ab", "ac", sub_cost=0.5), float)
    assert isinstance(edit_distance("ab", "ac", sub_cost=2.0), float)
    assert edit_distance("abc", "", del_cost=2) == 6 and edit_distance("", "abc", ins_cost=2) == 6
    # word level: tokens instead of characters
    assert edit_distance("the cat sat".split(), "the cat sat down".split()) == 1
    assert edit_distance("the cat sat".split(), "a cat sat".split()) == 1
    D = edit_distance_table("ab", "b")
    np.testing.assert_array_equal(D, [[0, 1], [1, 1], [2, 1]])
    assert D.dtype == np.int64


def test_edit_distance_bad_input():
    with pytest.raises(ValueError, match="^edit_distance: sub_cost is 0.0"):
        edit_distance("a", "b", sub_cost=0)
    with pytest.raises(TypeError, match="^edit_distance: ins_cost is True"):
        edit_distance("a", "b", ins_cost=True)
    with pytest.raises(TypeError, match="^edit_distance: a has type int"):
        edit_distance(3, "b")
    with pytest.raises(ValueError, match="^edit_operations: del_cost is -1.0"):
        edit_operations("a", "b", del_cost=-1)


# ----------------------------------------------------------------------------- PMI (003 §3.2)

NOTES_PMI_TEXT = "The cat sat on the mat. The dog sat on the mat."
NOTES_PMI_VOCAB = ["the", "cat", "dog", "sat", "on", "mat"]
NOTES_PMI_MATRIX = [[0, 1, 1, 0, 0, 2],
                    [0, 0, 0, 1, 0, 0],
                    [0, 0, 0, 1, 0, 0],
                    [0, 0, 0, 0, 2, 0],
                    [2, 0, 0, 0, 0, 0],
                    [0, 0, 0, 0, 0, 0]]


def test_notes_pmi_forward_cooccurrence_matrix():
    vocab, C = cooccurrence_matrix(sentence_tokenize(NOTES_PMI_TEXT), window=1,
                                   direction="forward", vocab=NOTES_PMI_VOCAB)
    assert vocab == NOTES_PMI_VOCAB
    np.testing.assert_array_equal(C, NOTES_PMI_MATRIX)
    # the notes count within sentences: one token stream would add mat -> the across the "."
    _, C_stream = cooccurrence_matrix(word_tokenize(NOTES_PMI_TEXT), vocab=NOTES_PMI_VOCAB)
    assert C_stream[5, 0] == 1 and (C_stream - C).sum() == 1


def test_cooccurrence_window_both_and_stopwords():
    s = [["a", "b", "c"]]
    _, C = cooccurrence_matrix(s, window=2)
    np.testing.assert_array_equal(C, [[0, 1, 1], [0, 0, 1], [0, 0, 0]])
    _, Cb = cooccurrence_matrix(s, window=2, direction="both")
    np.testing.assert_array_equal(Cb, C + C.T)
    # 003 §3.2.1: drop the stopwords first (a vocab without them): sat is then next to mat
    vocab, Cs = cooccurrence_matrix(sentence_tokenize(NOTES_PMI_TEXT), vocab=["cat", "dog", "sat", "mat"])
    np.testing.assert_array_equal(Cs, [[0, 0, 1, 0], [0, 0, 1, 0], [0, 0, 0, 2], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="^cooccurrence_matrix: window is 0"):
        cooccurrence_matrix(s, window=0)
    with pytest.raises(ValueError, match="^cooccurrence_matrix: direction is 'backward'"):
        cooccurrence_matrix(s, direction="backward")


def test_pmi_matrix_of_notes_example():
    C = np.array(NOTES_PMI_MATRIX)
    M = pmi_matrix(C)
    # hand computed: 10 pairs; the row sums 4, column "cat" sum 1: PMI(the, cat) = log((1/10)/(4/10 * 1/10))
    assert M[0, 1] == pytest.approx(math.log(2.5))
    assert M[3, 4] == pytest.approx(math.log((2 / 10) / ((2 / 10) * (2 / 10))))  # log 5
    assert M[0, 0] == -math.inf  # never seen together
    assert M[0, 1] == pytest.approx(pmi(1 / 10, 4 / 10, 1 / 10))
    P = pmi_matrix(C, ppmi=True)
    assert np.all(P >= 0) and P[0, 0] == 0 and P[0, 1] == M[0, 1]
    np.testing.assert_allclose(pmi_matrix(C, base=2)[C > 0], M[C > 0] / math.log(2))


def test_pmi_independence_and_three_words():
    rng = np.random.default_rng(4)
    px, py = _dirichlet(rng, 5), _dirichlet(rng, 4)
    joint = np.outer(px, py) * 1000  # independent words: PMI 0 everywhere
    np.testing.assert_allclose(pmi_matrix(joint), 0.0, atol=1e-12)
    assert pmi(0.2, 0.5, 0.4) == pytest.approx(0.0)
    assert pmi(0.1, 0.2, 0.5, 0.25) == pytest.approx(math.log(0.1 / (0.2 * 0.5 * 0.25)))
    assert pmi(0.0, 0.5, 0.4) == -math.inf
    with pytest.raises(ValueError, match="^pmi: p_marginals\\[1\\] holds 0"):
        pmi(0.1, 0.5, 0.0)
    with pytest.raises(TypeError, match="^pmi: got 1 marginal"):
        pmi(0.1, 0.5)


def test_errata_pmi_eq_3_2_missing_log():
    # 003 eq. 3.2 prints PMI = p(x|y)/p(x) = p(y|x)/p(y): the log is missing
    p_xy, p_x, p_y = 0.12, 0.3, 0.2
    value = pmi(p_xy, p_x, p_y)
    assert value == pytest.approx(math.log((p_xy / p_y) / p_x))
    assert value == pytest.approx(math.log((p_xy / p_x) / p_y))
    assert not np.isclose(value, (p_xy / p_y) / p_x)


# ----------------------------------------------------------------------------- TF-IDF (003 §3.3)

def test_notes_tfidf_cat_example_log10():
    # 003 §3.3.1: 100 words, 'cat' 3 times: TF 0.03; 10 million documents, 1,000 with 'cat':
    # IDF = log 10,000,000 / 1,000 = 4; TF-IDF = 0.03 x 4 = 0.12
    tf = term_frequency(np.array([3, 97]), scheme="relative")[0]
    w = idf(1000, 10_000_000, log_base=10)
    assert tf == pytest.approx(0.03)
    assert w == pytest.approx(4.0)
    assert round(tf * w, 2) == 0.12


def test_errata_tfidf_cat_example_natural_log():
    # the text says log_e, but its 4 is log10(10^4); with the natural log IDF = 9.21, TF-IDF = 0.28
    w = idf(1000, 10_000_000)
    assert round(w, 2) == 9.21 and round(0.03 * w, 2) == 0.28
    assert w == pytest.approx(4 * math.log(10))


def test_term_frequency_variants_hand_computed():
    F = np.array([[3, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(term_frequency(F, scheme="raw"), F)
    np.testing.assert_allclose(term_frequency(F), [[0.75, 0.25, 0], [0, 0, 0]])
    np.testing.assert_allclose(term_frequency(F, scheme="boolean"), [[1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(term_frequency(F, scheme="log"), [[math.log(4), math.log(2), 0], [0, 0, 0]])
    np.testing.assert_allclose(term_frequency(F, scheme="log", log_base=10)[0, 0], math.log10(4))
    np.testing.assert_allclose(term_frequency(F, scheme="sublinear"), [[1 + math.log(3), 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(term_frequency(F, scheme="augmented"), [[1, 0.5 + 0.5 / 3, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="^term_frequency: scheme is 'bm25'"):
        term_frequency(F, scheme="bm25")
    with pytest.raises(ValueError, match="^term_frequency: F holds negative"):
        term_frequency(-F)


def test_idf_variants():
    assert idf(2, 8) == pytest.approx(math.log(4))
    assert idf(2, 8, variant="smooth") == pytest.approx(math.log(9 / 3))
    assert idf(0, 8, variant="smooth") == pytest.approx(math.log(9))  # the notes' fix for df = 0
    assert idf(2, 8, variant="bm25") == pytest.approx(math.log(6.5 / 2.5) + 1)
    np.testing.assert_allclose(idf(np.array([1, 2, 4]), 4, log_base=2), [2, 1, 0])
    with pytest.raises(ValueError, match="^idf: df is 0 for some term"):
        idf(np.array([0, 1]), 4)
    with pytest.raises(ValueError, match="^idf: df has values"):
        idf(5, 4)
    with pytest.raises(ValueError, match="^idf: log_base is 1"):
        idf(1, 4, log_base=1)
    # 003 §3.3.1: plain and smoothed IDF are >= 0; the second printed form is not
    assert idf(10, 10, variant="bm25") < 0


def test_tf_idf_corpus():
    docs = [["the", "cat", "sat"], ["the", "dog"], ["the", "cat", "cat", "ran"]]
    vocab, W = tf_idf(docs)
    assert vocab == ["the", "cat", "sat", "dog", "ran"]
    assert np.all(W[:, 0] == 0)  # in every document: IDF log(3/3) = 0
    assert W[2, 1] == pytest.approx(0.5 * math.log(3 / 2))
    assert W[0, 2] == pytest.approx(1 / 3 * math.log(3))
    assert np.all(W >= 0)
    _, F = term_document_counts(docs)
    np.testing.assert_array_equal(document_frequency(F), [3, 2, 1, 1, 1])
    _, Fv = term_document_counts(docs, vocab=["cat", "zebra"])  # unknown tokens ignored
    np.testing.assert_array_equal(Fv, [[1, 0], [0, 0], [2, 0]])
    with pytest.raises(ValueError, match="^idf: df is 0"):
        tf_idf(docs, vocab=["cat", "zebra"])
    _, Ws = tf_idf(docs, vocab=["cat", "zebra"], idf_variant="smooth")
    assert np.all(Ws[:, 1] == 0)
    with pytest.raises(ValueError, match="^tf_idf: docs is empty"):
        tf_idf([])


# ----------------------------------------------------------------------------- BM25 (003 §3.4)

def _bm25_scalar(query, docs, k1, b):
    """Scalar loops straight from the formula, with the notes' IDF."""
    N = len(docs)
    avgdl = sum(len(d) for d in docs) / N
    out = []
    for D in docs:
        s = 0.0
        for q in query:
            n = sum(q in d for d in docs)
            w = math.log((N - n + 0.5) / (n + 0.5)) + 1
            f = D.count(q)
            s += w * f * (k1 + 1) / (f + k1 * (1 - b + b * len(D) / avgdl))
        out.append(s)
    return out


def test_bm25_matches_formula():
    rng = np.random.default_rng(5)
    words = list("abcdefgh")
    docs = [list(rng.choice(words, size=int(rng.integers(1, 15)))) for _ in range(9)]
    for query in (["a"], ["a", "c", "h"], ["b", "b", "z"]):
        for k1, b in ((1.5, 0.75), (1.2, 0.0), (2.0, 1.0)):
            np.testing.assert_allclose(bm25_scores(query, docs, k1=k1, b=b),
                                       _bm25_scalar(query, docs, k1, b), rtol=1e-12)


def test_bm25_hand_computed():
    docs = [["a", "b"], ["b", "b"], ["a", "a", "a"]]
    # N = 3, n(a) = 2: IDF = ln(1.5 / 2.5) + 1; avgdl = 7/3
    w = math.log(1.5 / 2.5) + 1
    s0 = w * 1 * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / (7 / 3)))
    s2 = w * 3 * 2.5 / (3 + 1.5 * (0.25 + 0.75 * 3 / (7 / 3)))
    np.testing.assert_allclose(bm25_scores(["a"], docs), [s0, 0.0, s2])


def test_bm25_grows_with_tf_and_saturates():
    k1, L = 1.5, 40
    others = [["x"] * L for _ in range(5)]
    scores = []
    for f in range(1, L + 1):
        doc = ["q"] * f + ["y"] * (L - f)  # fixed length: only f(q, D) changes
        scores.append(bm25_scores(["q"], [doc] + others, k1=k1)[0])
    w = math.log((6 - 1 + 0.5) / (1 + 0.5)) + 1
    assert np.all(np.diff(scores) > 0)
    assert np.all(np.array(scores) < w * (k1 + 1))
    steps = np.diff(scores)
    assert np.all(np.diff(steps) < 0)  # diminishing returns
    big = bm25_scores(["q"], [["q"] * 10_000] + others, k1=k1, b=0.0)[0]
    assert big == pytest.approx(w * (k1 + 1), rel=1e-3)


def test_bm25_options():
    docs = [["a", "b"], ["b"], ["a", "a", "c", "d"]]
    # k1 = 0: binary term presence times IDF; b = 0: no length normalisation
    w = math.log(1.5 / 2.5) + 1
    np.testing.assert_allclose(bm25_scores(["a"], docs, k1=0.0), [w, 0, w])
    s = bm25_scores(["a"], [["a", "x"], ["a", "x", "y", "z"], ["u"]], b=0.0)
    assert s[0] == pytest.approx(s[1])
    np.testing.assert_allclose(bm25_scores(["a", "a"], docs), 2 * bm25_scores(["a"], docs))
    # a word in every document: negative IDF with the notes' form, >= 0 with Lucene's
    everywhere = [["a", "b"], ["a"], ["a", "c"], ["a", "d"], ["a"]]
    assert np.all(bm25_scores(["a"], everywhere) < 0)
    assert np.all(bm25_scores(["a"], everywhere, idf_variant="lucene") > 0)
    assert np.all(bm25_scores(["a"], everywhere, idf_variant="robertson") < 0)
    np.testing.assert_array_equal(bm25_scores(["a"], [[], []]), [0.0, 0.0])
    np.testing.assert_array_equal(bm25_scores([], docs), [0.0, 0.0, 0.0])


def test_bm25_bad_input():
    with pytest.raises(ValueError, match="^bm25_scores: docs is empty"):
        bm25_scores(["a"], [])
    with pytest.raises(TypeError, match="^bm25_scores: query is a str"):
        bm25_scores("a b", [["a"]])
    with pytest.raises(ValueError, match="^bm25_scores: b is 1.5"):
        bm25_scores(["a"], [["a"]], b=1.5)
    with pytest.raises(ValueError, match="^bm25_scores: k1 is -1.0"):
        bm25_scores(["a"], [["a"]], k1=-1)


# ----------------------------------------------------------------------------- RRF (003 §3.5)

def test_rrf_hand_computed():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "a", "d"]])
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62) and fused["b"] == fused["a"]
    assert fused["c"] == pytest.approx(1 / 63) and fused["d"] == pytest.approx(1 / 63)
    assert list(fused) == ["a", "b", "c", "d"]  # ties keep first appearance
    assert reciprocal_rank_fusion([["x"]], k=1) == {"x": 0.5}  # ranks start at 1


def test_rrf_first_everywhere_is_first():
    rng = np.random.default_rng(6)
    for _ in range(30):
        docs = list(range(1, 12))
        rankings = []
        for _ in range(int(rng.integers(1, 5))):
            rest = [int(d) for d in rng.permutation(docs)[: int(rng.integers(0, 10))]]
            rankings.append([0] + rest)
        fused = reciprocal_rank_fusion(rankings, k=float(rng.uniform(0.5, 100)))
        assert next(iter(fused)) == 0
        assert list(fused.values()) == sorted(fused.values(), reverse=True)


def test_rrf_bad_input():
    with pytest.raises(ValueError, match="^reciprocal_rank_fusion: k is 0.0"):
        reciprocal_rank_fusion([["a"]], k=0)
    with pytest.raises(ValueError, match="^reciprocal_rank_fusion: rankings is empty"):
        reciprocal_rank_fusion([])
    with pytest.raises(ValueError, match="lists 'a' twice"):
        reciprocal_rank_fusion([["a", "b", "a"]])


# ----------------------------------------------------------------------------- PageRank / TextRank (003 §3.6)

def _stationary_by_eig(A, d):
    N = A.shape[0]
    out = A.sum(axis=1, keepdims=True)
    M = np.where(out > 0, A / np.where(out > 0, out, 1), 1 / N)
    G = d * M + (1 - d) / N
    w, vecs = np.linalg.eig(G.T)  # left eigenvectors of G
    v = np.real(vecs[:, np.argmin(np.abs(w - 1))])
    return v / v.sum()


def test_pagerank_matches_eigenvector():
    rng = np.random.default_rng(7)
    A = (rng.uniform(size=(7, 7)) < 0.35) * rng.uniform(0.5, 2, size=(7, 7))
    A[3] = 0  # a dangling node
    for d in (0.85, 0.5, 0.99):
        r = pagerank(A, damping=d, tol=1e-13, max_iter=20_000)
        assert r.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(r, _stationary_by_eig(A, d), rtol=1e-9, atol=1e-12)


def test_pagerank_simple_graphs():
    cycle = np.roll(np.eye(5), 1, axis=1)  # i -> i+1
    np.testing.assert_allclose(pagerank(cycle), np.full(5, 0.2))
    np.testing.assert_allclose(pagerank(np.zeros((4, 4))), np.full(4, 0.25))  # all dangling
    star = np.zeros((4, 4))
    star[1:, 0] = 1  # everyone links to node 0
    r = pagerank(star)
    assert np.argmax(r) == 0 and r[1] == pytest.approx(r[2])
    np.testing.assert_allclose(pagerank(star, damping=0.0), np.full(4, 0.25))
    with pytest.raises(ValueError, match="^pagerank: adjacency is an array"):
        pagerank(np.ones((2, 3)))
    with pytest.raises(ValueError, match="^pagerank: damping is 1.5"):
        pagerank(star, damping=1.5)
    with pytest.raises(RuntimeError, match="^pagerank: no convergence"):
        pagerank(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]]), damping=1.0)  # periodic: oscillates


def test_textrank_keywords_and_sentences():
    tokens = "the cat sat on the mat the dog sat on the log".split()
    kw = textrank(tokens)
    assert set(kw) == set(tokens) and sum(kw.values()) == pytest.approx(1.0)
    assert next(iter(kw)) == "the"  # the most connected word
    assert kw["cat"] == pytest.approx(kw["dog"])  # symmetric positions in the graph
    sentences = [["a", "b", "c"], ["b", "c", "d"], ["c", "d", "a"], ["x", "y"]]
    sr = textrank(sentences)
    assert set(sr) == {0, 1, 2, 3} and sum(sr.values()) == pytest.approx(1.0)
    assert min(sr, key=sr.get) == 3  # shares no word with the others
    assert textrank_similarity(["a", "b", "c"], ["b", "c", "d", "e"]) == pytest.approx(2 / (math.log(3) + math.log(4)))
    assert textrank_similarity(["a"], ["a"]) == 1.0


# ----------------------------------------------------------------------------- label smoothing (003 §3.7)

def test_label_smoothing_targets_hand_computed():
    q = label_smoothing_targets([0, 2], 3, 0.3)
    np.testing.assert_allclose(q, [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]])
    y = np.random.default_rng(8).integers(0, 5, size=(2, 3))
    q = label_smoothing_targets(y, 5, 0.1)
    assert q.shape == (2, 3, 5)
    np.testing.assert_allclose(q.sum(-1), 1.0)
    np.testing.assert_array_equal(label_smoothing_targets(y, 5, 0.0), np.eye(5)[y])
    np.testing.assert_allclose(label_smoothing_targets(y, 5, 1.0), 0.2)
    assert label_smoothing_targets(y, 5, 0.1, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="^label_smoothing_targets: targets has values"):
        label_smoothing_targets([3], 3, 0.1)
    with pytest.raises(ValueError, match="^label_smoothing_targets: eps is 1.5"):
        label_smoothing_targets([0], 3, 1.5)


@pytest.mark.torch
def test_label_smoothing_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(6, 7))
    y = rng.integers(0, 7, size=6)
    q = label_smoothing_targets(y, 7, 0.2)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ours = -(q * logp).sum(-1).mean()
    ref = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(y), label_smoothing=0.2)
    assert ours == pytest.approx(ref.item(), rel=1e-10)


# ----------------------------------------------------------------------------- n-gram models

TEXT = "the cat sat on the mat. the dog sat on the log. a cat and a dog.\n"


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_every_distribution_sums_to_one_and_has_no_zero(order):
    """For every context, seen or not, P(. | context) sums to 1 over the 256 bytes, and no
    byte (seen or not) gets probability 0."""
    model = ngram_model(text_bytes(TEXT), order, vocab_size=256)
    ids = text_bytes(TEXT)
    rng = np.random.default_rng(0)
    contexts = [ids[i:i + order - 1] for i in range(len(ids) - order + 2)]      # seen
    contexts += [rng.integers(0, 256, order - 1) for _ in range(20)]              # mostly unseen
    contexts += [ids[:k] for k in range(order - 1)]                               # text start
    for ctx in contexts:
        p = ngram_probs(model, ctx)
        assert p.shape == (256,)
        assert abs(p.sum() - 1.0) < 1e-12, (ctx, p.sum())
        assert p.min() > 0.0


def test_unseen_bytes_get_probability_above_zero_even_from_a_one_byte_text():
    model = ngram_model(text_bytes("aaaaaaaa"), 3, vocab_size=256)
    val = text_bytes("abc\u00e9z")                                  # bytes never seen
    lp = ngram_log_probs(model, val)
    assert np.all(np.isfinite(lp))
    assert ngram_probs(model, text_bytes("aa")).min() > 0.0


def test_log_probs_are_the_distributions_read_at_each_position():
    ids = text_bytes(TEXT)
    for order in (1, 2, 3):
        model = ngram_model(ids[:40], order, vocab_size=256)
        lp = ngram_log_probs(model, ids)
        for i in range(len(ids)):
            ctx = ids[max(0, i - order + 1):i]
            assert lp[i] == pytest.approx(math.log(ngram_probs(model, ctx)[ids[i]]), abs=1e-12)


def test_unigram_bits_per_byte_by_hand():
    """Train "aab": c(a) = 2, c(b) = 1, one count of 1 and one of 2, so D = 1/(1 + 2) = 1/3;
    P(w) = max(c(w) - D, 0)/3 + D * 2/3 * 1/256. Held-out "ab" costs
    -(log2 P(a) + log2 P(b)) / 2 bits per byte."""
    D = 1 / 3
    p_a = (2 - D) / 3 + D * 2 / 3 / 256
    p_b = (1 - D) / 3 + D * 2 / 3 / 256
    expected = -(math.log2(p_a) + math.log2(p_b)) / 2
    assert ngram_bits_per_byte("aab", "ab", 1) == pytest.approx(expected, rel=1e-12)
    model = ngram_model(text_bytes("aab"), 1, vocab_size=256)
    assert model.levels[0].discount == pytest.approx(D)


def test_bigram_bits_per_byte_by_hand():
    """Train "aaab": bigrams aa (twice) and ab, so D_2 = 1/(1 + 2*1) = 1/3 and the context
    "a" has c(a.) = 3 with 2 distinct followers. The unigram level holds continuation counts:
    "a" and "b" each follow one distinct byte, so D_1 = 1 and P_1 is uniform, 1/256.
    Held-out "aba": P(a) = P_1(a) at the start, P(b | a) = (1 - 1/3)/3 + (1/3)(2/3)/256,
    and P(a | b) = P_1(a) ("b" was never followed by anything)."""
    p_b_after_a = (1 - 1 / 3) / 3 + (1 / 3) * (2 / 3) / 256
    bits = -(math.log2(1 / 256) + math.log2(p_b_after_a) + math.log2(1 / 256))
    assert ngram_bits_per_byte("aaab", "aba", 2) == pytest.approx(bits / 3, rel=1e-12)
    model = ngram_model(text_bytes("aaab"), 2, vocab_size=256)
    p = ngram_probs(model, text_bytes("a"))
    assert p[ord("a")] == pytest.approx((2 - 1 / 3) / 3 + (1 / 3) * (2 / 3) / 256)


def test_a_vanishing_discount_gives_the_bigram_mle_of_the_notes():
    """With D -> 0 a seen context's distribution is the MLE Count(w_{i-1}, w_i) / Count(w_{i-1})
    of 003 §2.1 (``bigram_mle`` on the same flat sequence)."""
    words = "a b a c b a a b c".split()
    vocab = sorted(set(words))
    ids = np.array([vocab.index(w) for w in words])
    model = ngram_model(ids, 2, vocab_size=len(vocab), discount=1e-12)
    mle_vocab, P = bigram_mle(words)
    for h in vocab:
        if h == words[-1] and words.count(h) == 1:
            continue
        row = P[mle_vocab.index(h)]
        expected = np.array([row[mle_vocab.index(w)] for w in vocab])
        assert np.allclose(ngram_probs(model, [vocab.index(h)]), expected, atol=1e-9)


def test_higher_orders_fit_english_better():
    text = TEXT * 20
    train, val = text[:-200], text[-200:]
    bpb = [ngram_bits_per_byte(train, val, n) for n in (1, 2, 3)]
    assert bpb[0] > bpb[1] > bpb[2]


def test_bits_per_byte():
    assert bits_per_byte(10 * math.log(2), 10) == pytest.approx(1.0)
    assert bits_per_byte(0.0, 3) == 0.0
    assert list(text_bytes("é")) == [0xC3, 0xA9]
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 0)


def test_bad_inputs_are_refused_with_a_message():
    with pytest.raises(ValueError, match="order"):
        ngram_model(text_bytes("abc"), 0, vocab_size=256)
    with pytest.raises(ValueError, match=r"ids has values in \[0, 300\]"):
        ngram_model(np.array([0, 300]), 1, vocab_size=256)
    with pytest.raises(ValueError, match="at least order=3"):
        ngram_model(text_bytes("ab"), 3, vocab_size=256)
    with pytest.raises(ValueError, match="discount"):
        ngram_model(text_bytes("abc"), 2, vocab_size=256, discount=1.5)
    with pytest.raises(TypeError, match="NGramModel"):
        ngram_probs("not a model")
    with pytest.raises(ValueError, match="empty"):
        ngram_bits_per_byte("abc", "", 2)
