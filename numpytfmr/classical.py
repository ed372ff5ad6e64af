"""Classical NLP, each formula one function (003 ch. 2-3).

- 003 §2.1      bigram maximum likelihood, sequence log-likelihood, precision / recall / F1
- 003 §2.1.1-2  perplexity = exp(cross-entropy); entropy, cross-entropy, KL divergence
- 003 §2.1      n-gram language models with interpolated Kneser-Ney smoothing, scored in
                bits per byte (the baselines of ``numpytfmr pretrain``)
- 003 §3.1      edit distance (Levenshtein), its table and an optimal list of operations
- 003 §3.2      co-occurrence counts and point-wise mutual information (PMI, PPMI)
- 003 §3.3      term frequency variants, inverse document frequency, TF-IDF
- 003 §3.4      BM25;  §3.5 reciprocal rank fusion;  §3.6 PageRank and TextRank
- 003 §3.7      label-smoothed targets

Token sequences are Python lists of tokens (usually strings); a corpus is a list of such
lists. These are counting algorithms, not differentiable ops: no forward/backward pairs.
Logarithms are natural unless a ``base``/``log_base`` argument says otherwise.
"""
from collections import Counter
from dataclasses import dataclass
import math
import numbers
import re

import numpy as np

from .contract import count, int_array, one_of, real

__all__ = [
    "word_tokenize", "sentence_tokenize",
    "bigram_counts", "bigram_mle", "bigram_sequence_probs", "bigram_log_likelihood",
    "perplexity", "entropy", "cross_entropy", "kl_divergence",
    "NGramModel", "NGramLevel", "ngram_model", "ngram_probs", "ngram_log_probs", "text_bytes",
    "bits_per_byte", "ngram_bits_per_byte",
    "confusion_counts", "precision", "recall", "f1_score", "precision_recall_f1",
    "edit_distance", "edit_distance_table", "edit_operations",
    "cooccurrence_matrix", "pmi", "pmi_matrix",
    "term_document_counts", "term_frequency", "document_frequency", "idf", "tf_idf",
    "bm25_scores", "reciprocal_rank_fusion", "pagerank", "textrank", "textrank_similarity",
    "label_smoothing_targets",
]


# ----------------------------------------------------------------------------- input checks

def _token_list(x, name, where):
    """A list (or tuple) of hashable tokens; a bare string is refused (it would be read as characters)."""
    if isinstance(x, str):
        raise TypeError(f"{where}: {name} is a str ({x[:30]!r}); expected a list of tokens, "
                        "e.g. text.split() or word_tokenize(text)")
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{where}: {name} has type {type(x).__name__}; expected a list of tokens")
    for t in x:
        try:
            hash(t)
        except TypeError:
            raise TypeError(f"{where}: {name} holds a {type(t).__name__}; expected hashable tokens "
                            "(strings)") from None
    return list(x)


def _refuse_str(x, name, where, expected, hint=" (split text with word_tokenize / sentence_tokenize)"):
    if isinstance(x, str):
        raise TypeError(f"{where}: {name} is a str ({x[:30]!r}); expected {expected}{hint}")


def _corpus(x, name, where):
    """A non-empty list of token lists."""
    _refuse_str(x, name, where, "a list of documents, each a list of tokens")
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{where}: {name} has type {type(x).__name__}; expected a list of documents, "
                        "each a list of tokens")
    if len(x) == 0:
        raise ValueError(f"{where}: {name} is empty; expected at least one document")
    return [_token_list(d, f"{name}[{i}]", where) for i, d in enumerate(x)]


def _tokens_or_sentences(x, name, where):
    """Return ``("tokens", list)`` for a flat token list, ``("sentences", list of lists)`` for a corpus."""
    _refuse_str(x, name, where, "a list of tokens or a list of sentences (lists of tokens)")
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{where}: {name} has type {type(x).__name__}; expected a list of tokens or a "
                        "list of sentences (lists of tokens)")
    if len(x) == 0:
        raise ValueError(f"{where}: {name} is empty; expected at least one token")
    if all(isinstance(s, (list, tuple)) for s in x):
        return "sentences", _corpus(x, name, where)
    if any(isinstance(s, (list, tuple)) for s in x):
        raise TypeError(f"{where}: {name} mixes tokens and lists; expected a list of tokens or a "
                        "list of sentences (lists of tokens)")
    return "tokens", _token_list(x, name, where)


def _log_base(base, where, name="base"):
    if base is None:
        return None
    b = real(base, name, where, low=0.0, low_open=True)
    if b == 1.0:
        raise ValueError(f"{where}: {name} is 1; expected a logarithm base > 0 other than 1 "
                         "(None for the natural log)")
    return b


def _log(x, base):
    """`log_base(x)`; natural log for ``base=None``. `log(0) = -inf` without a warning."""
    with np.errstate(divide="ignore"):
        out = np.log(x)
    return out if base is None else out / math.log(base)  # a Python float keeps float32 float32


def _count(v, name, where):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{where}: {name} is {v!r}; expected a non-negative integer count")
    if v < 0:
        raise ValueError(f"{where}: {name} is {v}; expected a non-negative integer count")
    return int(v)


def _prob_array(P, name, where, axis=-1, *, distribution=True):
    """``P`` as a float array of probabilities; with ``distribution``, summing to 1 along ``axis``."""
    if isinstance(P, np.matrix):
        P = np.asarray(P).view(np.ndarray)
    if isinstance(P, (bool, np.bool_)) or P is None:
        raise TypeError(f"{where}: {name} is {P!r}; expected an array of probabilities")
    try:
        P = np.asarray(P)
    except Exception as exc:
        raise TypeError(f"{where}: {name} could not be read as an array ({exc})") from None
    if P.dtype.kind in "iu":  # [1, 0] is a fine (one-hot) distribution
        P = P.astype(np.float64)
    if P.dtype.kind != "f":
        raise TypeError(f"{where}: {name} has dtype {P.dtype}; expected an array of probabilities")
    if P.dtype not in (np.float32, np.float64):
        P = P.astype(np.float64)
    if P.size == 0 or (distribution and P.ndim == 0):
        raise ValueError(f"{where}: {name} has shape {P.shape}; expected a non-empty array of "
                         "probabilities" + (" (at least one axis)" if distribution else ""))
    if not np.all(np.isfinite(P)) or P.min() < 0 or P.max() > 1:
        raise ValueError(f"{where}: {name} has values in [{P.min()}, {P.max()}]; expected "
                         "probabilities in [0, 1]")
    if distribution:
        s = P.sum(axis=axis)
        tol = 1e-6 if P.dtype == np.float64 else 1e-4
        if not np.allclose(s, 1.0, rtol=0.0, atol=tol):
            worst = np.ravel(s)[np.argmax(np.abs(np.ravel(s) - 1.0))]
            raise ValueError(f"{where}: {name} sums to {worst:.6g} along axis {axis}; expected a "
                             "probability distribution (non-negative, summing to 1)")
    return P


# ----------------------------------------------------------------------------- tokenizing

def word_tokenize(text, *, lower=True):
    """Split ``text`` into word tokens (runs of letters, digits, apostrophes); punctuation dropped.

    ``word_tokenize("The cat sat.") == ["the", "cat", "sat"]``
    """
    if not isinstance(text, str):
        raise TypeError(f"word_tokenize: text has type {type(text).__name__}; expected a str")
    return re.findall(r"[\w']+", text.lower() if lower else text)


def sentence_tokenize(text, *, lower=True):
    """Split ``text`` at ``.``, ``!``, ``?`` into sentences, each a list of word tokens.

    ``sentence_tokenize("The cat sat. The dog sat.") == [["the", "cat", "sat"], ["the", "dog", "sat"]]``
    """
    if not isinstance(text, str):
        raise TypeError(f"sentence_tokenize: text has type {type(text).__name__}; expected a str")
    sentences = (word_tokenize(s, lower=lower) for s in re.split(r"[.!?]+", text))
    return [s for s in sentences if s]


# ----------------------------------------------------------------------------- bigram model (003 §2.1)

def _bigram_counts(corpus, where, bos, eos):
    kind, data = _tokens_or_sentences(corpus, "corpus", where)
    if kind == "sentences":
        seqs = [[bos] + s + [eos] for s in data]
        words = [t for s in data for t in s if t not in (bos, eos)]
        vocab = [bos] + list(dict.fromkeys(words)) + [eos]
    else:
        seqs = [data]
        vocab = list(dict.fromkeys(data))
    index = {w: i for i, w in enumerate(vocab)}
    C = np.zeros((len(vocab), len(vocab)), dtype=np.int64)
    for s in seqs:
        ids = np.array([index[t] for t in s], dtype=np.int64)
        np.add.at(C, (ids[:-1], ids[1:]), 1)  # one count per consecutive pair
    return kind, vocab, C


def bigram_counts(corpus, *, bos="<s>", eos="</s>"):
    """Bigram counts ``Count(w_{i-1}, w_i)`` of a corpus (003 §2.1).

    corpus: a list of tokens (bigrams of consecutive tokens), or a list of sentences (lists
    of tokens), each padded as ``[bos] + sentence + [eos]``; no bigram crosses a sentence end.

    Returns ``(vocab, C)``: ``vocab`` a list of the `V` types (for sentences ``bos`` first and
    ``eos`` last, the words in order of first appearance between them) and ``C`` an int64
    array (V, V) with ``C[i, j] = Count(vocab[i], vocab[j])``, row = previous word.
    """
    _, vocab, C = _bigram_counts(corpus, "bigram_counts", bos, eos)
    return vocab, C


def bigram_mle(corpus, *, k=0.0, bos="<s>", eos="</s>"):
    """Bigram conditional probabilities by maximum likelihood, optionally add-k smoothed (003 §2.1).

        P(w_i | w_{i-1}) = (Count(w_{i-1}, w_i) + k) / (Count(w_{i-1}) + k V)

    ``k = 0`` is the MLE of the notes; ``k = 1`` is Laplace (add-one) smoothing.
    ``Count(w_{i-1})`` is the number of bigrams that start with ``w_{i-1}`` (its count as a
    history). With sentence markers every word is followed by something, so this equals the
    notes' "number of times the word appears"; in a flat token list the last token is not.
    ``V`` is the number of possible next words: every type, except ``bos`` for sentences
    (nothing is ever predicted to be ``<s>``, so its column stays 0).

    Returns ``(vocab, P)``, ``P`` float64 (V, V), ``P[i, j] = P(vocab[j] | vocab[i])``; each row
    sums to 1, except a row whose word never occurs as a history (``eos``; under MLE also a
    token seen only at the very end), which is all zeros (`0/0` is left undefined, not guessed).
    """
    where = "bigram_mle"
    k = real(k, "k", where, low=0.0)
    kind, vocab, C = _bigram_counts(corpus, where, bos, eos)
    sentences = kind == "sentences"
    allowed = np.ones(len(vocab), dtype=bool)  # which words may be predicted
    if sentences:
        allowed[0] = False  # <s> is never a next word
    counts = C + k * allowed  # add k to every allowed (history, next) cell
    if sentences:
        counts[-1] = 0.0  # nothing follows </s>
    totals = counts.sum(axis=1, keepdims=True)
    P = np.divide(counts, totals, out=np.zeros(C.shape), where=totals > 0)
    return vocab, P


def bigram_sequence_probs(sequence, vocab, P, *, markers=True, bos="<s>", eos="</s>"):
    """The probabilities ``P(w_i | w_{i-1})`` of each predicted token of ``sequence`` (003 §2.1).

    With ``markers`` the sequence is scored as ``[bos] + sequence + [eos]`` (so ``P(w_1)`` is
    ``P(w_1 | <s>)`` and the end is predicted too); without, the first token is given and only
    ``w_2 .. w_n`` are predicted. Returns a float64 array, one entry per predicted token.
    """
    where = "bigram_sequence_probs"
    seq = _token_list(sequence, "sequence", where)
    P = np.asarray(P, dtype=np.float64)
    if P.shape != (len(vocab), len(vocab)):
        raise ValueError(f"{where}: P has shape {P.shape}; expected ({len(vocab)}, {len(vocab)}) "
                         "to match vocab")
    index = {w: i for i, w in enumerate(vocab)}
    if markers:
        if bos not in index or eos not in index:
            raise ValueError(f"{where}: markers=True but vocab has no {bos!r}/{eos!r}; pass "
                             "markers=False for a model counted on a flat token list")
        seq = [bos] + seq + [eos]
    unknown = [t for t in seq if t not in index]
    if unknown:
        raise ValueError(f"{where}: sequence holds {unknown[0]!r}, which is not in vocab; expected "
                         "known tokens only")
    if len(seq) < 2:
        raise ValueError(f"{where}: sequence has {len(seq)} token; expected at least 2 (or markers=True)")
    ids = np.array([index[t] for t in seq], dtype=np.int64)
    return P[ids[:-1], ids[1:]]


def bigram_log_likelihood(sequence, vocab, P, *, markers=True, base=None, bos="<s>", eos="</s>"):
    """Log-likelihood of a sequence under a bigram model (003 §2.1).

        log L(theta | W) = log P(w_1) + sum_{i=2}^n log P(w_i | w_{i-1})

    (``P(w_1) = P(w_1 | <s>)`` with ``markers``; see :func:`bigram_sequence_probs`.)
    Returns a float; ``-inf`` when the sequence holds a bigram of probability 0, the classic
    failure of the unsmoothed MLE (use ``bigram_mle(..., k=1)``).
    """
    probs = bigram_sequence_probs(sequence, vocab, P, markers=markers, bos=bos, eos=eos)
    return float(np.sum(_log(probs, _log_base(base, "bigram_log_likelihood"))))


# ----------------------------------------------------------------------------- information (003 §2.1.1-2.1.2)

def perplexity(probs, targets=None):
    """Perplexity: the exponential of the cross-entropy (003 §2.1.1).

        PPL(W) = (prod_i P(w_i | w_<i))^(-1/N) = exp(-(1/N) sum_i log P(w_i | w_<i)) = exp(L_CE)

    probs: with ``targets=None``, the probabilities the model gave the `N` observed tokens (any
    shape); otherwise model distributions (..., N, V) over a vocabulary of `V`, and ``targets``
    the observed ids (..., N), ``probs[..., i, targets[..., i]]`` being used. The base of the log
    does not matter (``2^H`` in bits equals ``e^H`` in nats). A model distribution uniform over
    `V` words has perplexity `V`. An observed token of probability 0 gives ``inf``.
    """
    where = "perplexity"
    if targets is None:
        p = _prob_array(probs, "probs", where, distribution=False)
    else:
        Pm = _prob_array(probs, "probs", where, axis=-1)
        if Pm.ndim < 2:
            raise ValueError(f"{where}: probs has shape {Pm.shape}; with targets expected (..., N, V)")
        t = int_array(targets, "targets", where, high=Pm.shape[-1])
        if t.shape != Pm.shape[:-1]:
            raise ValueError(f"{where}: targets has shape {t.shape}; expected {Pm.shape[:-1]} "
                             f"(probs.shape[:-1] for probs of shape {Pm.shape})")
        p = np.take_along_axis(Pm, t[..., None], axis=-1)[..., 0]
    return float(np.exp(-np.mean(_log(p.astype(np.float64), None))))


def entropy(P, *, base=None, axis=-1):
    """Entropy of a distribution, ``H(P) = -sum_x P(x) log P(x)`` with ``0 log 0 = 0`` (003 §2.1.2).

    P: (..., V) probabilities summing to 1 along ``axis``; returns (...) (a float for 1-D P).
    ``base=2`` gives bits: a uniform distribution over 8 outcomes has 3 bits (003 §2.1.1).
    """
    where = "entropy"
    P = _prob_array(P, "P", where, axis)
    plogp = np.where(P > 0, P * _log(np.where(P > 0, P, 1), _log_base(base, where)), 0)
    return _scalar(-np.sum(plogp, axis=axis))


def cross_entropy(P, Q, *, base=None, axis=-1):
    """Cross-entropy of Q relative to P, ``H(P, Q) = -sum_x P(x) log Q(x)`` (003 §2.1.2).

    The notes' identity ``H(P, Q) = H(P) + D_KL(P || Q)`` holds exactly (see
    :func:`kl_divergence`); training on cross-entropy therefore minimises the KL divergence,
    ``H(P)`` being fixed by the data. P, Q: same shape, distributions along ``axis``. Terms with
    ``P(x) = 0`` contribute 0; ``Q(x) = 0`` where ``P(x) > 0`` gives ``inf``.
    (The per-logit training loss is ``cross_entropy_forward``.)
    """
    where = "cross_entropy"
    P, Q = _pair(P, Q, where, axis)
    terms = np.where(P > 0, -P * _log(np.where(P > 0, Q, 1), _log_base(base, where)), 0)
    return _scalar(np.sum(terms, axis=axis))


def kl_divergence(P, Q, *, base=None, axis=-1):
    """KL divergence ``D_KL(P || Q) = sum_x P(x) log(P(x) / Q(x))`` `>= 0` (003 §2.1.2).

    ``cross_entropy(P, Q) == entropy(P) + kl_divergence(P, Q)``. Zero iff `P == Q`; ``inf`` when
    ``Q(x) = 0`` where ``P(x) > 0``.
    """
    where = "kl_divergence"
    P, Q = _pair(P, Q, where, axis)
    b = _log_base(base, where)
    safe_P = np.where(P > 0, P, 1)
    terms = np.where(P > 0, P * (_log(safe_P, b) - _log(np.where(P > 0, Q, 1), b)), 0)
    return _scalar(np.sum(terms, axis=axis))


def _pair(P, Q, where, axis):
    P = _prob_array(P, "P", where, axis)
    Q = _prob_array(Q, "Q", where, axis)
    if P.shape != Q.shape:
        raise ValueError(f"{where}: Q has shape {Q.shape} but P has shape {P.shape}; expected the same shape")
    return P, Q


def _scalar(x):
    return float(x) if np.ndim(x) == 0 else x


# ----------------------------------------------------------------------------- n-gram language models (003 §2.1)

@dataclass(frozen=True)
class NGramLevel:
    """The counts of one order `k` of an :class:`NGramModel`.

    A k-gram ``h w`` (``h`` its `k-1` ids of context, ``w`` the next id) is stored as the
    integer ``code(h w) = h_1 V^(k-1) + ... + h_(k-1) V + w``, so ``code(h) = code // V``.

    grams, counts:           sorted codes of the k-grams seen, and their counts: the plain
                             counts ``c(h w)`` at the model's highest order, the
                             continuation counts ``N1+(. h w)`` (how many distinct ids were
                             seen just before ``h w``) at the lower orders (Kneser-Ney)
    contexts, totals, types: sorted codes of the contexts ``h`` seen, ``sum_w c(h w)`` and
                             the number of distinct ``w`` seen after ``h``
    discount:                `D`, subtracted from every count seen (absolute discounting)
    """
    grams: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    totals: np.ndarray
    types: np.ndarray
    discount: float


@dataclass(frozen=True)
class NGramModel:
    """A smoothed n-gram language model over ids ``0 .. vocab_size-1`` (:func:`ngram_model`).

    order:       `n`: the next id depends on the `n-1` ids before it (a Markov model of order
                 n-1; the bigram model of 003 §2.1 is n = 2)
    vocab_size:  `V` (256 for bytes)
    levels:      one :class:`NGramLevel` per `k = 1 .. n`
    """
    order: int
    vocab_size: int
    levels: tuple


def _ngram_codes(ids, k, V):
    """``code(ids[i:i+k])`` for every `i` (`k = 0` gives zeros: the empty context)."""
    n = ids.size - k + 1
    codes = np.zeros(max(n, 0), dtype=np.int64)
    for j in range(k):
        codes = codes * V + ids[j:j + n]
    return codes


def _ngram_level(grams, counts, V, discount):
    """An :class:`NGramLevel` from sorted k-gram codes and their counts."""
    contexts, first = np.unique(grams // V, return_index=True)   # grams sorted: contexts grouped
    totals = np.add.reduceat(counts, first)                      # sum_w c(h w)
    types = np.diff(np.append(first, grams.size))                # |{w : c(h w) > 0}|
    if discount is None:
        n1, n2 = np.sum(counts == 1), np.sum(counts == 2)        # counts of counts
        discount = n1 / (n1 + 2 * n2) if n1 > 0 else 0.5
    return NGramLevel(grams, counts, contexts, totals, types, float(discount))


def ngram_model(ids, order, *, vocab_size, discount=None):
    """Fit an interpolated Kneser-Ney n-gram model to a sequence of ids (003 §2.1).

    003 §2.1 estimates the bigram ``P(w_i | w_{i-1}) = Count(w_{i-1}, w_i) / Count(w_{i-1})``
    (:func:`bigram_mle`). That gives probability 0 to every pair not in the training text,
    so a held-out text gets perplexity infinity (003 §2.1.1). Here the context is the `n-1`
    previous ids and the counts are smoothed: each seen count gives up `D`, and the mass
    freed goes to the model of one order lower (interpolated absolute discounting)::

        P_k(w | h) = max(c(h w) - D_k, 0) / c(h .)  +  D_k N1+(h .) / c(h .) * P_{k-1}(w | h')
        P_0(w)     = 1 / V

    with ``h'`` the context ``h`` without its first id, ``c(h .) = sum_w c(h w)`` and
    ``N1+(h .)`` the number of distinct ids seen after ``h``; a context never seen uses
    ``P_{k-1}`` alone. At the highest order ``c`` are the counts; below it they are the
    Kneser-Ney continuation counts ``N1+(. h w)`` (in how many contexts ``h w`` was seen),
    and ``D_k = n1 / (n1 + 2 n2)`` from the numbers of k-grams seen once and twice (0.5 if
    none was seen once). Every distribution sums to 1 and, since the uniform ``P_0`` is
    always mixed in, no id ever gets probability 0.

    ids:        1-D ints in `[0, vocab_size)`, at least ``order`` of them (bytes of a text:
                :func:`text_bytes`)
    order:      `n` (1 unigram, 2 bigram, 3 trigram)
    discount:   a fixed `D` in `(0, 1]` for every order instead of the estimate
    Returns an :class:`NGramModel`; score it with :func:`ngram_log_probs`, read its
    distributions with :func:`ngram_probs`.
    """
    where = "ngram_model"
    order = count(order, "order", where)
    V = count(vocab_size, "vocab_size", where)
    ids = int_array(ids, "ids", where, high=V)
    if ids.ndim != 1 or ids.size < order:
        raise ValueError(f"{where}: ids has shape {ids.shape}; expected a 1-D sequence of at "
                         f"least order={order} ids")
    if float(V) ** order >= 2.0 ** 62:
        raise ValueError(f"{where}: vocab_size**order = {V}**{order} is too large to code "
                         "n-grams in 64-bit integers")
    if discount is not None:
        discount = real(discount, "discount", where, low=0.0, high=1.0, low_open=True)
    ids = ids.astype(np.int64)
    levels = []
    for k in range(1, order + 1):
        if k == order:                                           # c(h w): plain counts
            grams, counts = np.unique(_ngram_codes(ids, k, V), return_counts=True)
        else:                                                    # N1+(. h w): continuation
            longer = np.unique(_ngram_codes(ids, k + 1, V))      # distinct (k+1)-grams u h w
            grams, counts = np.unique(longer % V ** k, return_counts=True)
        levels.append(_ngram_level(grams, counts.astype(np.int64), V, discount))
    return NGramModel(order, V, tuple(levels))


def _lookup(keys, values, queries):
    """``values[keys == q]`` for each query, 0 where the key is absent (keys sorted)."""
    i = np.minimum(np.searchsorted(keys, queries), keys.size - 1)
    return np.where(keys[i] == queries, values[i], 0)


def _interpolate(level, h, w, lower, V):
    """``P_k(w | h)`` of :func:`ngram_model` from the lower order's ``P_{k-1}(w | h')``."""
    c = _lookup(level.grams, level.counts, h * V + w)            # c(h w)
    total = _lookup(level.contexts, level.totals, h)             # c(h .)
    types = _lookup(level.contexts, level.types, h)              # N1+(h .)
    D = level.discount
    seen = total > 0
    safe = np.where(seen, total, 1)
    mixed = np.maximum(c - D, 0) / safe + D * types / safe * lower
    return np.where(seen, mixed, lower)


def ngram_probs(model, context=()):
    """The next-id distribution ``P(. | context)`` of an :class:`NGramModel`, shape (V,).

    Only the last ``order - 1`` ids of ``context`` are read; a shorter context (the start of
    a text) uses the orders it has enough ids for. The entries sum to 1 and are all `> 0`.
    """
    where = "ngram_probs"
    if not isinstance(model, NGramModel):
        raise TypeError(f"{where}: model is a {type(model).__name__}; expected an NGramModel "
                        "(from ngram_model)")
    V = model.vocab_size
    ctx = int_array(np.asarray(context, dtype=np.int64).reshape(-1), "context", where, high=V)
    ctx = ctx[ctx.size - (model.order - 1):] if model.order > 1 else ctx[:0]
    w = np.arange(V)
    p = np.full(V, 1.0 / V)                                      # P_0(w) = 1 / V
    for k, level in enumerate(model.levels, start=1):
        if ctx.size < k - 1:
            break
        h = _ngram_codes(ctx[ctx.size - (k - 1):], k - 1, V)[0]  # the last k-1 ids
        p = _interpolate(level, np.full(V, h), w, p, V)
    return p


def ngram_log_probs(model, ids):
    """``log P(ids[i] | ids[i-n+1 .. i-1])`` (natural log) for every position `i` of a
    sequence under an :class:`NGramModel`; the first `n-1` positions use the context they
    have. Their negative mean is the cross-entropy of 003 eq. 2.2, and its exponential the
    perplexity (003 §2.1.1)."""
    where = "ngram_log_probs"
    if not isinstance(model, NGramModel):
        raise TypeError(f"{where}: model is a {type(model).__name__}; expected an NGramModel "
                        "(from ngram_model)")
    V = model.vocab_size
    ids = int_array(ids, "ids", where, high=V)
    if ids.ndim != 1:
        raise ValueError(f"{where}: ids has shape {ids.shape}; expected a 1-D sequence")
    ids = ids.astype(np.int64)
    p = np.full(ids.size, 1.0 / V)                               # P_0(w) = 1 / V
    for k, level in enumerate(model.levels, start=1):
        if ids.size < k:
            break
        h = _ngram_codes(ids[:-1], k - 1, V) if k > 1 else np.zeros(ids.size, np.int64)
        pos = slice(k - 1, None)                                 # positions with k-1 ids before
        p[pos] = _interpolate(level, h, ids[pos], p[pos], V)
    return np.log(p)


def text_bytes(text):
    """The UTF-8 bytes of ``text`` as int64 ids in `[0, 256)`: what byte-level models read."""
    if not isinstance(text, str):
        raise TypeError(f"text_bytes: text is a {type(text).__name__}; expected a str")
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def bits_per_byte(nats, n_bytes):
    """Total negative log-likelihood ``nats`` (natural log) of a text of ``n_bytes`` UTF-8
    bytes, in bits per byte: ``nats / ln 2 / n_bytes``.

    Unlike perplexity per token, this does not depend on the tokenizer: a byte model, a
    character model and a BPE model of the same text are compared on the same scale
    (a model with cross-entropy ``L_CE`` nats per token over `N` tokens spends
    ``N L_CE / ln 2`` bits on the text; 003 §2.1.1 measures entropy in bits).
    """
    nats = real(nats, "nats", "bits_per_byte", low=0.0)
    n_bytes = count(n_bytes, "n_bytes", "bits_per_byte")
    return nats / math.log(2.0) / n_bytes


def ngram_bits_per_byte(train_text, val_text, order, *, discount=None):
    """Bits per byte of ``val_text`` under the byte-level :func:`ngram_model` of ``order``
    fitted on ``train_text``: the n-gram baselines of ``numpytfmr pretrain``."""
    model = ngram_model(text_bytes(train_text), order, vocab_size=256, discount=discount)
    val = text_bytes(val_text)
    if val.size == 0:
        raise ValueError("ngram_bits_per_byte: val_text is empty; expected some text to score")
    return bits_per_byte(-float(np.sum(ngram_log_probs(model, val))), val.size)


# ----------------------------------------------------------------------------- precision / recall (003 §2.1)

def confusion_counts(y_true, y_pred, *, positive=1):
    """Counts ``(TP, FP, FN, TN)`` of a binary decision, ``positive`` being the relevant label.

    y_true, y_pred: sequences (or arrays) of labels of the same length.
    """
    where = "confusion_counts"
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape or t.ndim != 1:
        raise ValueError(f"{where}: y_true has shape {t.shape} and y_pred has shape {p.shape}; "
                         "expected two 1-D sequences of the same length")
    t_pos, p_pos = t == positive, p == positive
    tp = int(np.sum(t_pos & p_pos))
    fp = int(np.sum(~t_pos & p_pos))
    fn = int(np.sum(t_pos & ~p_pos))
    tn = int(np.sum(~t_pos & ~p_pos))
    return tp, fp, fn, tn


def precision(tp, fp):
    """Precision ``TP / (TP + FP)`` (003 §2.1): the share of predicted positives that are relevant.
    0.0 when nothing is predicted positive."""
    tp, fp = _count(tp, "tp", "precision"), _count(fp, "fp", "precision")
    return tp / (tp + fp) if tp + fp else 0.0


def recall(tp, fn):
    """Recall ``TP / (TP + FN)`` (003 §2.1): the share of relevant cases that are found.
    0.0 when there is nothing relevant."""
    tp, fn = _count(tp, "tp", "recall"), _count(fn, "fn", "recall")
    return tp / (tp + fn) if tp + fn else 0.0


def f1_score(precision, recall):
    """F1, the harmonic mean of precision and recall (003 §2.1): ``2 P R / (P + R)``.

    From counts this is ``2 TP / (2 TP + FP + FN)``. 0.0 when both are 0.
    """
    p = real(precision, "precision", "f1_score", low=0.0, high=1.0)
    r = real(recall, "recall", "f1_score", low=0.0, high=1.0)
    return 2 * p * r / (p + r) if p + r else 0.0


def precision_recall_f1(y_true, y_pred, *, positive=1):
    """``(precision, recall, F1)`` of predicted labels against true labels (003 §2.1)."""
    tp, fp, fn, _ = confusion_counts(y_true, y_pred, positive=positive)
    p, r = precision(tp, fp), recall(tp, fn)
    return p, r, f1_score(p, r)


# ----------------------------------------------------------------------------- edit distance (003 §3.1)

def _edit_costs(sub_cost, ins_cost, del_cost, where):
    raw = {"sub_cost": sub_cost, "ins_cost": ins_cost, "del_cost": del_cost}
    vals = [real(v, k, where, low=0.0, low_open=True) for k, v in raw.items()]
    integral = all(isinstance(v, numbers.Integral) for v in raw.values())
    return (tuple(int(v) for v in vals), np.int64) if integral else (tuple(vals), np.float64)


def _sequence(x, name, where):
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)):
        return _token_list(x, name, where)
    raise TypeError(f"{where}: {name} has type {type(x).__name__}; expected a str or a list of tokens")


def _edit_table(a, b, sub_cost, ins_cost, del_cost, where):
    a, b = _sequence(a, "a", where), _sequence(b, "b", where)
    (sub, ins, dele), dtype = _edit_costs(sub_cost, ins_cost, del_cost, where)
    symbols = {s: i for i, s in enumerate(dict.fromkeys(list(a) + list(b)))}
    a_ids = np.array([symbols[s] for s in a], dtype=np.int64)
    b_ids = np.array([symbols[s] for s in b], dtype=np.int64)
    m, n = len(a), len(b)
    j = np.arange(n + 1)
    D = np.empty((m + 1, n + 1), dtype=dtype)
    D[0] = j * ins
    D[:, 0] = np.arange(m + 1) * dele
    for i in range(1, m + 1):
        # best cost of D[i, j] without an insertion as last step: from above (delete) or the diagonal
        t = np.empty(n + 1, dtype=dtype)
        t[0] = D[i, 0]
        t[1:] = np.minimum(D[i - 1, 1:] + dele, D[i - 1, :-1] + sub * (b_ids != a_ids[i - 1]))
        # then insertions run left to right: D[i, j] = min_{l <= j} t[l] + (j - l) ins,
        # which is a running minimum of t[l] - l ins, shifted back by j ins
        D[i] = np.minimum.accumulate(t - j * ins) + j * ins
    return a, b, D


def edit_distance_table(a, b, *, sub_cost=1, ins_cost=1, del_cost=1):
    """The dynamic-programming table of the weighted Levenshtein distance (003 §3.1).

    ``D[i, j]`` is the cheapest way to turn ``a[:i]`` into ``b[:j]``:

        D[i, 0] = i del_cost,   D[0, j] = j ins_cost
        D[i, j] = min( D[i-1, j]   + del_cost,                      delete a[i-1]
                       D[i, j-1]   + ins_cost,                      insert b[j-1]
                       D[i-1, j-1] + sub_cost * [a[i-1] != b[j-1]] )  substitute or match

    a, b: strings (edits of characters) or lists of tokens (edits of words). Returns an array
    (len(a)+1, len(b)+1), int64 when all costs are integers, float64 otherwise.
    """
    return _edit_table(a, b, sub_cost, ins_cost, del_cost, "edit_distance_table")[2]


def edit_distance(a, b, *, sub_cost=1, ins_cost=1, del_cost=1):
    """Minimum total cost of insertions, deletions and substitutions turning ``a`` into ``b``
    (Levenshtein distance, 003 §3.1); ``D[len(a), len(b)]`` of :func:`edit_distance_table`.

    Returns an int when all costs are integers (the default unit costs), a float otherwise.
    With ``ins_cost == del_cost`` it is a metric. ``edit_distance("kitten", "sitting") == 3``.
    """
    return _edit_table(a, b, sub_cost, ins_cost, del_cost, "edit_distance")[2][-1, -1].item()


def edit_operations(a, b, *, sub_cost=1, ins_cost=1, del_cost=1):
    """One cheapest edit script turning ``a`` into ``b`` (003 §3.1), read back through the table.

    Returns a list of tuples ``(op, i, j, src, dst)`` in left-to-right order:

        ("match",      i, j, a[i], b[j])   cost 0
        ("substitute", i, j, a[i], b[j])   cost sub_cost
        ("delete",     i, j, a[i], None)   cost del_cost  (j: symbols of b produced so far)
        ("insert",     i, j, None, b[j])   cost ins_cost  (i: symbols of a consumed so far)

    The costs add up to :func:`edit_distance`, and the ``dst`` entries (skipping deletions)
    spell ``b``. Ties prefer match/substitute, then delete, then insert.
    """
    a, b, D = _edit_table(a, b, sub_cost, ins_cost, del_cost, "edit_operations")
    sub, dele = float(sub_cost), float(del_cost)

    def same(x, y):  # D was built from these sums; with float costs allow for the last bit
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)

    ops, i, j = [], len(a), len(b)
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            equal = a[i - 1] == b[j - 1]
            if same(D[i, j], D[i - 1, j - 1] + (0.0 if equal else sub)):
                ops.append(("match" if equal else "substitute", i - 1, j - 1, a[i - 1], b[j - 1]))
                i, j = i - 1, j - 1
                continue
        if i > 0 and same(D[i, j], D[i - 1, j] + dele):
            ops.append(("delete", i - 1, j, a[i - 1], None))
            i -= 1
        else:  # the remaining option: D[i, j] = D[i, j-1] + ins_cost
            ops.append(("insert", i, j - 1, None, b[j - 1]))
            j -= 1
    return ops[::-1]


# ----------------------------------------------------------------------------- co-occurrence and PMI (003 §3.2)

def cooccurrence_matrix(corpus, *, window=1, direction="forward", vocab=None):
    """Co-occurrence counts of word pairs within ``window`` positions (003 §3.2).

    ``direction="forward"``: ``C[x, y]`` counts ``y`` occurring 1..``window`` positions after
    ``x`` (the notes' "forward" matrix with ``window=1``: adjacent pairs in reading order);
    ``"both"``: either order, so ``C`` is symmetric (``C_forward + C_forward^T``).

    corpus: a list of tokens, or a list of sentences (no pair crosses a sentence end).
    vocab: the order of the rows/columns; default order of first appearance. Tokens outside a
    given vocab are removed before counting (this is how to drop stopwords, 003 §3.2.1).
    Returns ``(vocab, C)``, ``C`` int64 (V, V).
    """
    where = "cooccurrence_matrix"
    window = count(window, "window", where)
    one_of("forward", "both")(direction, "direction", where)
    kind, data = _tokens_or_sentences(corpus, "corpus", where)
    seqs = data if kind == "sentences" else [data]
    if vocab is None:
        vocab = list(dict.fromkeys(t for s in seqs for t in s))
    else:
        vocab = _token_list(vocab, "vocab", where)
        if len(set(vocab)) != len(vocab):
            raise ValueError(f"{where}: vocab holds repeated tokens; expected each type once")
    index = {w: i for i, w in enumerate(vocab)}
    C = np.zeros((len(vocab), len(vocab)), dtype=np.int64)
    for s in seqs:
        ids = np.array([index[t] for t in s if t in index], dtype=np.int64)
        for offset in range(1, window + 1):  # pairs (ids[p], ids[p + offset])
            np.add.at(C, (ids[:-offset], ids[offset:]), 1)
    if direction == "both":
        C = C + C.T
    return vocab, C


def pmi(p_joint, *p_marginals, base=None):
    """Point-wise mutual information of events (003 §3.2, eq. 3.1):

        PMI[x, y] = log( p(x, y) / (p(x) p(y)) ) = log( p(x|y) / p(x) ) = log( p(y|x) / p(y) )

    With three marginals it is the notes' three-word form ``log p(x,y,z) / (p(x) p(y) p(z))``.
    Arguments are probabilities (floats or broadcastable arrays); ``p_joint = 0`` gives ``-inf``.
    Returns a float, or an array for array input.
    """
    where = "pmi"
    if len(p_marginals) < 2:
        raise TypeError(f"{where}: got {len(p_marginals)} marginal probabilities; expected at least "
                        "2, as in pmi(p_xy, p_x, p_y)")
    pj = _prob_array(p_joint, "p_joint", where, distribution=False)
    margs = [_prob_array(m, f"p_marginals[{i}]", where, distribution=False) for i, m in enumerate(p_marginals)]
    for i, m in enumerate(margs):
        if np.any(m == 0):
            raise ValueError(f"{where}: p_marginals[{i}] holds 0; expected marginal probabilities > 0 "
                             "(PMI of an event that never happens is undefined)")
    b = _log_base(base, where)
    return _scalar(_log(pj, b) - sum(_log(m, b) for m in margs))


def pmi_matrix(C, *, ppmi=False, base=None):
    """PMI of every (row word, column word) pair of a co-occurrence count matrix (003 §3.2).

        p(x, y) = C[x, y] / sum(C),  p(x) = sum_y C[x, y] / sum(C),  p(y) = sum_x C[x, y] / sum(C)
        PMI[x, y] = log p(x, y) / (p(x) p(y)),   PPMI[x, y] = max(PMI[x, y], 0)

    (marginals from the matrix itself, the usual choice for word-context matrices). Cells with
    ``C[x, y] = 0`` are ``-inf`` (log 0), or 0 with ``ppmi=True``. C: (V, V') non-negative counts.
    """
    where = "pmi_matrix"
    C = np.asarray(C)
    if C.dtype.kind not in "iuf" or C.ndim != 2:
        raise TypeError(f"{where}: C is an array of dtype {C.dtype} and shape {C.shape}; expected a "
                        "2-D array of non-negative counts")
    C = C.astype(np.float64)
    if not np.all(np.isfinite(C)) or np.any(C < 0) or C.sum() == 0:
        raise ValueError(f"{where}: C has values in [{C.min()}, {C.max()}] summing to {C.sum()}; "
                         "expected finite non-negative counts with a positive total")
    b = _log_base(base, where)
    total = C.sum()
    p_x = C.sum(axis=1, keepdims=True) / total  # (V, 1) row marginals
    p_y = C.sum(axis=0, keepdims=True) / total  # (1, V') column marginals
    seen = C > 0  # a seen cell has p(x) > 0 and p(y) > 0, so the division is safe there
    ratio = np.where(seen, C / total / np.where(seen, p_x * p_y, 1.0), 1.0)
    out = np.where(seen, _log(ratio, b), -np.inf)
    return np.maximum(out, 0.0) if ppmi else out


# ----------------------------------------------------------------------------- TF-IDF (003 §3.3)

def term_document_counts(docs, *, vocab=None):
    """Raw counts ``f_{t,d}``: ``(vocab, F)`` with ``F[d, t]`` the number of times term ``vocab[t]``
    occurs in document ``d`` (003 §3.3). F: int64 (N_docs, V). Tokens outside a given vocab are
    ignored; the default vocab lists the terms in order of first appearance."""
    where = "term_document_counts"
    docs = _corpus(docs, "docs", where)
    if vocab is None:
        vocab = list(dict.fromkeys(t for d in docs for t in d))
    else:
        vocab = _token_list(vocab, "vocab", where)
        if len(set(vocab)) != len(vocab):
            raise ValueError(f"{where}: vocab holds repeated tokens; expected each term once")
    index = {w: i for i, w in enumerate(vocab)}
    F = np.zeros((len(docs), len(vocab)), dtype=np.int64)
    for d, doc in enumerate(docs):
        for t, c in Counter(doc).items():
            if t in index:
                F[d, index[t]] = c
    return vocab, F


_TF_SCHEMES = ("relative", "raw", "boolean", "log", "sublinear", "augmented")


def term_frequency(F, *, scheme="relative", log_base=None):
    """Term frequency ``tf(t, d)`` from raw counts ``f_{t,d}`` (003 §3.3). F: (..., V), one row per document.

        "relative"   f_{t,d} / sum_t' f_{t',d}          (the notes' default; an empty document gives 0)
        "raw"        f_{t,d}
        "boolean"    1 if t occurs in d else 0
        "log"        log(1 + f_{t,d})                   (the notes' logarithmically scaled frequency)
        "sublinear"  1 + log f_{t,d} if f_{t,d} > 0 else 0   (the other common log variant)
        "augmented"  0.5 + 0.5 f_{t,d} / max_t' f_{t',d} for terms in d, 0 for terms not in d

    Returns float64 (float32 for float32 F), same shape as F.
    """
    where = "term_frequency"
    one_of(*_TF_SCHEMES)(scheme, "scheme", where)
    b = _log_base(log_base, where, "log_base")
    F = np.asarray(F)
    if F.dtype.kind not in "iuf" or F.ndim < 1:
        raise TypeError(f"{where}: F has dtype {F.dtype} and shape {F.shape}; expected an array of "
                        "non-negative term counts, one row per document")
    if not np.all(np.isfinite(F)) or np.any(F < 0):
        raise ValueError(f"{where}: F holds negative or non-finite values; expected term counts >= 0")
    F = F.astype(np.float32 if F.dtype == np.float32 else np.float64)
    present = F > 0
    if scheme == "raw":
        return F
    if scheme == "boolean":
        return present.astype(F.dtype)
    if scheme == "log":
        return _log(1 + F, b)
    if scheme == "sublinear":
        return np.where(present, 1 + _log(np.where(present, F, 1), b), 0).astype(F.dtype)
    if scheme == "relative":
        total = F.sum(axis=-1, keepdims=True)
        return np.divide(F, total, out=np.zeros_like(F), where=total > 0)
    peak = F.max(axis=-1, keepdims=True)  # augmented
    return np.where(present, 0.5 + 0.5 * F / np.where(peak > 0, peak, 1), 0).astype(F.dtype)


def document_frequency(F):
    """``df_t = |{d in D : t in d}|``, the number of documents holding each term. F: (N_docs, V) -> (V,)."""
    F = np.asarray(F)
    if F.ndim != 2:
        raise ValueError(f"document_frequency: F has shape {F.shape}; expected (N_docs, V)")
    return (F > 0).sum(axis=0)


_IDF_VARIANTS = ("plain", "smooth", "bm25")


def idf(df, n_docs, *, variant="plain", log_base=None):
    """Inverse document frequency (003 §3.3). ``df``: documents holding the term (int or array),
    ``n_docs``: `N`, the number of documents.

        "plain"   log(N / df)                         (the notes' definition; df = 0 is an error)
        "smooth"  log((1 + N) / (1 + df))             (the notes' fix for terms absent from the corpus)
        "bm25"    log((N - df + 0.5) / (df + 0.5)) + 1   (the notes' second form, as printed)

    ``log_base``: None for the natural log, which the notes' text names; the notes' "cat"
    example (003 §3.3.1) computes ``log10(10^7 / 10^3) = 4``, i.e. ``log_base=10``.
    "plain" and "smooth" are `>= 0`; "bm25" is negative for a term in most documents.
    """
    where = "idf"
    one_of(*_IDF_VARIANTS)(variant, "variant", where)
    N = count(n_docs, "n_docs", where)
    b = _log_base(log_base, where, "log_base")
    df_arr = int_array(df, "df", where, low=0, high=N + 1)
    df_f = df_arr.astype(np.float64)
    if variant == "plain":
        if np.any(df_arr == 0):
            raise ValueError(f"{where}: df is 0 for some term; log(N / 0) is undefined (the notes' "
                             "division by zero); use variant='smooth'")
        out = _log(N / df_f, b)
    elif variant == "smooth":
        out = _log((1 + N) / (1 + df_f), b)
    else:
        out = _log((N - df_f + 0.5) / (df_f + 0.5), b) + 1
    return _scalar(out)


def tf_idf(docs, *, tf_scheme="relative", idf_variant="plain", log_base=None, vocab=None):
    """TF-IDF weights ``tf(t, d) * idf(t, D)`` of every document and term (003 §3.3.1).

    docs: a list of documents (lists of tokens). See :func:`term_frequency` and :func:`idf` for
    the variants; ``log_base`` applies to both logs. Returns ``(vocab, W)``, W float64 (N_docs, V).
    """
    _corpus(docs, "docs", "tf_idf")
    vocab, F = term_document_counts(docs, vocab=vocab)
    tf = term_frequency(F, scheme=tf_scheme, log_base=log_base)
    w = np.asarray(idf(document_frequency(F), F.shape[0], variant=idf_variant, log_base=log_base))
    return vocab, tf * w  # (N, V) * (V,): one idf per column


# ----------------------------------------------------------------------------- BM25 (003 §3.4)

_BM25_IDF = ("notes", "lucene", "robertson")


def bm25_scores(query, docs, *, k1=1.5, b=0.75, idf_variant="notes"):
    """BM25 score of every document for a query (003 §3.4):

        score(D, Q) = sum_{i=1}^n IDF(q_i) f(q_i, D) (k1 + 1) / (f(q_i, D) + k1 (1 - b + b |D| / avgdl))

    ``f(q_i, D)``: occurrences of ``q_i`` in `D`; ``|D|``: length of `D` in tokens; ``avgdl``: mean
    document length. The sum runs over the query's tokens as given, so a repeated query word
    counts twice. For ``f -> inf`` a term's contribution rises to at most ``IDF (k1 + 1)``.

    The BM25 section gives no IDF formula; ``idf_variant`` picks one (`n` = documents holding `q_i`):

        "notes"      ln((N - n + 0.5) / (n + 0.5)) + 1      the notes' §3.3 form (default)
        "lucene"     ln(1 + (N - n + 0.5) / (n + 0.5))      Lucene/Okapi, never negative
        "robertson"  ln((N - n + 0.5) / (n + 0.5))          the original Robertson–Spärck Jones weight

    "notes" and "robertson" go negative for a word in most documents (so a match can lower
    a score); "lucene" keeps every score `>= 0`.

    query: list of tokens; docs: non-empty list of documents (lists of tokens).
    Returns float64 (N_docs,).
    """
    where = "bm25_scores"
    query = _token_list(query, "query", where)
    docs = _corpus(docs, "docs", where)
    k1 = real(k1, "k1", where, low=0.0)
    b = real(b, "b", where, low=0.0, high=1.0)
    one_of(*_BM25_IDF)(idf_variant, "idf_variant", where)
    q_count = Counter(query)
    terms = list(q_count)
    _, F = term_document_counts(docs, vocab=terms)  # (N, T) counts of the query terms
    F = F.astype(np.float64)
    N = len(docs)
    n = (F > 0).sum(axis=0).astype(np.float64)  # (T,) documents holding each term
    rsj = (N - n + 0.5) / (n + 0.5)
    idf_q = {"notes": np.log(rsj) + 1, "lucene": np.log1p(rsj), "robertson": np.log(rsj)}[idf_variant]
    dl = np.array([len(d) for d in docs], dtype=np.float64)
    avgdl = dl.mean()
    # all documents empty: no term occurs, every score is 0; use ratio 1 to avoid 0/0
    length_ratio = dl / avgdl if avgdl > 0 else np.ones_like(dl)
    norm = k1 * (1 - b + b * length_ratio)  # (N,)
    denom = F + norm[:, None]
    sat = np.divide(F * (k1 + 1), denom, out=np.zeros_like(F), where=F > 0)  # f = 0 contributes 0
    weights = np.array([q_count[t] for t in terms], dtype=np.float64)  # repeated query words
    return (sat * idf_q) @ weights


# ----------------------------------------------------------------------------- RRF (003 §3.5)

def reciprocal_rank_fusion(rankings, *, k=60):
    """Fuse ranked lists (003 §3.5): ``RRF(d) = sum_{r in R} 1 / (k + r(d))``.

    rankings: a list of rankings, each a list of document ids, best first; ranks start at 1.
    A document missing from a ranking gets nothing from it. k: a positive constant (60 as in
    the notes and Cormack et al. 2009). Returns a dict ``doc -> fused score`` ordered by
    decreasing score (ties in order of first appearance).
    """
    where = "reciprocal_rank_fusion"
    k = real(k, "k", where, low=0.0, low_open=True)
    _refuse_str(rankings, "rankings", where, "a list of rankings (lists of document ids)", hint="")
    if not isinstance(rankings, (list, tuple)):
        raise TypeError(f"{where}: rankings has type {type(rankings).__name__}; expected a list of "
                        "rankings (lists of document ids)")
    if len(rankings) == 0:
        raise ValueError(f"{where}: rankings is empty; expected at least one ranking")
    scores = {}
    for m, ranking in enumerate(rankings):
        ranking = _token_list(ranking, f"rankings[{m}]", where)
        if len(set(ranking)) != len(ranking):
            dup = next(d for d, c in Counter(ranking).items() if c > 1)
            raise ValueError(f"{where}: rankings[{m}] lists {dup!r} twice; expected each document "
                             "at most once per ranking")
        for r, d in enumerate(ranking, start=1):
            scores[d] = scores.get(d, 0.0) + 1.0 / (k + r)
    return dict(sorted(scores.items(), key=lambda item: -item[1]))  # sorted() is stable


# ----------------------------------------------------------------------------- PageRank / TextRank (003 §3.6)

def pagerank(adjacency, *, damping=0.85, tol=1e-10, max_iter=1000):
    """PageRank by power iteration (003 §3.6; Page et al. 1998). Row-vector form:

        M[i, j] = A[i, j] / sum_j' A[i, j']       (a dangling row, no out-links, links to all: 1/N)
        r <- (1 - d) / N + d r M,   r_0 = 1/N,   until sum |r_new - r| < tol

    adjacency: (N, N) non-negative weights, ``A[i, j] > 0`` a link from `i` to `j`. damping: `d` in
    `[0, 1]`. Returns float64 (N,), the stationary distribution (sums to 1): the left eigenvector
    of ``G = d M + (1 - d)/N`` for eigenvalue 1. Raises RuntimeError if not converged.
    """
    where = "pagerank"
    A = np.asarray(adjacency)
    if A.dtype.kind not in "iuf" or A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"{where}: adjacency is an array of dtype {A.dtype} and shape {A.shape}; "
                         "expected a non-empty square (N, N) array of link weights")
    A = A.astype(np.float64)
    if not np.all(np.isfinite(A)) or np.any(A < 0):
        raise ValueError(f"{where}: adjacency holds negative or non-finite weights; expected >= 0")
    d = real(damping, "damping", where, low=0.0, high=1.0)
    tol = real(tol, "tol", where, low=0.0, low_open=True)
    max_iter = count(max_iter, "max_iter", where)
    N = A.shape[0]
    out = A.sum(axis=1, keepdims=True)
    M = np.where(out > 0, A / np.where(out > 0, out, 1.0), 1.0 / N)  # row-stochastic
    r = np.full(N, 1.0 / N)
    for _ in range(max_iter):
        r_new = (1 - d) / N + d * (r @ M)
        if np.abs(r_new - r).sum() < tol:
            return r_new
        r = r_new
    raise RuntimeError(f"{where}: no convergence to tol={tol} in max_iter={max_iter} iterations; "
                       "use damping < 1 or raise max_iter")


def textrank_similarity(s1, s2):
    """TextRank sentence similarity (Mihalcea & Tarau 2004), words shared over log lengths:

        sim(S_i, S_j) = |{w : w in S_i and w in S_j}| / (log |S_i| + log |S_j|)

    (the shared-word count alone when both sentences are one word long, where the log sum is 0).
    """
    where = "textrank_similarity"
    s1, s2 = _token_list(s1, "s1", where), _token_list(s2, "s2", where)
    if not s1 or not s2:
        return 0.0
    shared = len(set(s1) & set(s2))
    denom = math.log(len(s1)) + math.log(len(s2))
    return shared / denom if denom > 0 else float(shared)


def textrank(units, *, window=2, damping=0.85, tol=1e-10, max_iter=1000):
    """TextRank (003 §3.6; Mihalcea & Tarau 2004): PageRank on a graph built from text.

    - ``units`` a list of tokens: keyword extraction. Nodes are the distinct words; an
      undirected edge joins two different words occurring within ``window`` positions of
      each other (``window=2``: neighbours). Returns ``{word: score}``.
    - ``units`` a list of sentences (lists of tokens): sentence extraction. Nodes are the
      sentences, undirected edges weighted by :func:`textrank_similarity`. Returns
      ``{sentence index: score}``.

    The dict is ordered by decreasing score; the scores sum to 1 (see :func:`pagerank`).
    """
    where = "textrank"
    window = count(window, "window", where)
    kind, data = _tokens_or_sentences(units, "units", where)
    if kind == "tokens":
        nodes = list(dict.fromkeys(data))
        index = {w: i for i, w in enumerate(nodes)}
        ids = np.array([index[t] for t in data], dtype=np.int64)
        A = np.zeros((len(nodes), len(nodes)))
        for offset in range(1, window):  # pairs inside a window of `window` tokens
            A[ids[:-offset], ids[offset:]] = 1.0
        A = np.maximum(A, A.T)  # undirected
        np.fill_diagonal(A, 0.0)  # a word next to itself is no link
    else:
        nodes = list(range(len(data)))
        A = np.array([[textrank_similarity(s, t) if i != j else 0.0 for j, t in enumerate(data)]
                      for i, s in enumerate(data)])
    r = pagerank(A, damping=damping, tol=tol, max_iter=max_iter)
    order = np.argsort(-r, kind="stable")
    return {nodes[i]: float(r[i]) for i in order}


# ----------------------------------------------------------------------------- label smoothing (003 §3.7)

def label_smoothing_targets(targets, K, eps, *, dtype=np.float64):
    """Label-smoothed target distributions (003 §3.7):

        q'(k | x) = (1 - eps) delta_{k, y} + eps / K

    targets: int array (...) of class ids `y` in `[0, K)`; `K`: number of classes; `eps` in `[0, 1]`.
    Returns (..., K) rows summing to 1 (the target ``cross_entropy_forward(...,
    label_smoothing=eps)`` uses).
    """
    where = "label_smoothing_targets"
    K = count(K, "K", where)
    eps = real(eps, "eps", where, low=0.0, high=1.0)
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise TypeError(f"{where}: dtype is {dtype!r}; expected np.float32 or np.float64")
    y = int_array(targets, "targets", where, high=K)
    one_hot = (y[..., None] == np.arange(K)).astype(dtype)  # (..., K)
    return ((1 - eps) * one_hot + eps / K).astype(dtype)
