"""The smoothed n-gram language models of classical.py (003 §2.1 extended to n - 1 ids of
context, interpolated Kneser-Ney) and bits per byte: the baselines of ``numpytfmr pretrain``."""
import math

import numpy as np
import pytest

from numpytfmr.classical import (bigram_mle, bits_per_byte, ngram_bits_per_byte, ngram_log_probs,
                                 ngram_model, ngram_probs, text_bytes)

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
