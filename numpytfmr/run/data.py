"""Built-in data: small synthetic tasks, generated on the spot (no download); their
tokenizers (``CharTokenizer``, ``WordTokenizer``) are in tokenizers.py.

The tasks are small enough for a 2-layer model with d_model = 64 to learn in minutes of
NumPy training, and each has an exactly checkable answer, so a model is scored by
greedy generation and exact match on held-out prompts.

Character tasks (decoder-only, 004 "Types of Transformers": a decoder "predicts the next
token to continue the input text"). Every example is one sequence

    <bos> prompt <sep> target <eos> <pad> ...

and the loss is taken on the target tokens and the final ``<eos>`` only:

    ``"reverse"``      ``"3142"`` -> ``"2413"``
    ``"sort"``         ``"3142"`` -> ``"1234"``          (ascending)
    ``"sort_desc"``    ``"3142"`` -> ``"4321"``          (descending)
    ``"sort_either"``  ascending or descending with probability 1/2 each, same prompt
                       format, so the model cannot tell which is wanted (the preference
                       data of DPO, 003 §9.2, then prefers one of the two)
    ``"rotate"``       ``"3142"`` -> ``"1423"``          (rotate left by one)
    ``"dyck"``         ``"([()"`` -> ``"])"``           (close the open brackets, innermost first)

Related pairs for adaptation (LoRA, 000 §2.7): sort -> sort_desc, reverse -> rotate.

Translation (encoder-decoder, 004 "Transformer Encoder-Decoder" and its "Je suis
étudiant" example; 003 §5.1 "I am learning"; the Bahdanau setting of 002): a tiny
word-level English -> French generated from a grammar, with French gender agreement
(``le``/``la``, ``noir``/``noire``), adjectives after the noun, verb conjugation and the
dropped article before a profession::

    "the black cat sees a red car"   -> "le chat noir voit une voiture rouge"
    "i am a student"                 -> "je suis étudiant"

Held-out split: whether a prompt (or source sentence) belongs to ``"train"`` or
``"test"`` is a fixed function of its text (a hash), so the splits are disjoint, the
same for every seed, and the same across tasks -- a model pre-trained on ``"sort"`` has
never seen the test prompts of ``"sort_desc"`` either.
"""
import hashlib
import numbers

import numpy as np

from ..contract import count, one_of, real
# the tokenizers of the tasks live in tokenizers.py; their names stay importable from here
from .tokenizers import (BOS_ID, BRACKETS, DEFAULT_SYMBOLS, DIGITS, EOS_ID, PAD_ID,  # noqa: F401
                         SEP_ID, SPECIAL_TOKENS, CharTokenizer, WordTokenizer,
                         tokenizer_from_dict)

__all__ = [
    "SPECIAL_TOKENS", "PAD_ID", "BOS_ID", "EOS_ID", "SEP_ID", "DEFAULT_SYMBOLS",
    "CharTokenizer", "WordTokenizer", "tokenizer_from_dict",
    "TASKS", "task_target", "split_of", "make_task", "make_preference_pairs",
    "EN_FR_LEXICON", "translation_tokenizers", "translation_split", "make_translation",
    "next_token_arrays", "iterate_batches", "prompt_batches", "decode_completion",
    "exact_match", "evaluate_generation",
]

def _rng(rng, where):
    """A ``np.random.Generator``; an int is taken as a seed (as in the op registry)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)):
        return np.random.default_rng(int(rng))
    raise TypeError(f"{where}: rng is {rng!r}; expected a numpy.random.Generator or an int seed")


# -------------------------------------------------------- the held-out split

def split_of(text, *, test_fraction=0.2):
    """``"test"`` or ``"train"``: a fixed function of ``text`` (BLAKE2b hash), not of a seed.

    About ``test_fraction`` of all possible prompts are test prompts.
    """
    test_fraction = real(test_fraction, "test_fraction", "split_of", low=0.0, high=1.0,
                           low_open=True, high_open=True)
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return "test" if h / 2.0 ** 64 < test_fraction else "train"


def _draw_split(draw, n, split, test_fraction, unique, where, split_fn=split_of):
    """Call ``draw()`` until ``n`` items whose text (first element) is in ``split``
    (``split_fn``: ``split_of``, or ``translation_split`` for ``make_translation``)."""
    out, seen = [], set()
    budget = 200 * n + 10_000   # generous: a split holds ~20 % or ~80 % of all texts
    for _ in range(budget):
        if len(out) == n:
            break
        item = draw()
        text = item[0]
        if split_fn(text, test_fraction=test_fraction) != split or (unique and text in seen):
            continue
        seen.add(text)
        out.append(item)
    if len(out) < n:
        raise ValueError(f"{where}: could only draw {len(out)} of n={n} {'distinct ' if unique else ''}"
                         f"{split} examples; expected fewer examples or longer sequences")
    return out


# ----------------------------------------------------------- character tasks

TASKS = ("reverse", "sort", "sort_desc", "sort_either", "rotate", "dyck")
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def task_target(name, prompt):
    """The answer of a deterministic task: ``task_target("sort", "3141") == "1134"``.

    ``"dyck"``: the closing brackets that complete ``prompt`` (which must be a valid
    unfinished bracket string). ``"sort_either"`` has no single answer and is refused.
    """
    where = "task_target"
    one_of(*(t for t in TASKS if t != "sort_either"))(name, "name", where)
    if not isinstance(prompt, str):
        raise TypeError(f"{where}: prompt is a {type(prompt).__name__}; expected a str")
    if name == "dyck":
        stack = []
        for i, c in enumerate(prompt):
            if c in _CLOSE:
                stack.append(c)
            elif c in _CLOSE.values() and stack and _CLOSE[stack[-1]] == c:
                stack.pop()
            else:
                raise ValueError(f"{where}: prompt {prompt!r} has {c!r} at position {i}, which "
                                 "does not continue a balanced bracket string")
        return "".join(_CLOSE[c] for c in reversed(stack))
    bad = [c for c in prompt if c not in DIGITS]
    if bad:
        raise ValueError(f"{where}: prompt {prompt!r} has non-digit characters {bad}; task "
                         f"{name!r} expects a digit string")
    if name == "reverse":
        return prompt[::-1]
    if name == "sort":
        return "".join(sorted(prompt))
    if name == "sort_desc":
        return "".join(sorted(prompt, reverse=True))
    return prompt[1:] + prompt[:1]  # rotate left by one


def _draw_digits(rng, min_len, max_len):
    length = int(rng.integers(min_len, max_len + 1))
    return "".join(DIGITS[d] for d in rng.integers(0, 10, size=length))


def _draw_dyck(rng, min_len, max_len):
    """A random unfinished bracket string: at each step open (always when nothing is
    open) or close the innermost open bracket, with probability 1/2; at least one
    bracket is left open at the end so the target is not empty."""
    length = int(rng.integers(min_len, max_len + 1))
    while True:
        stack, chars = [], []
        for _ in range(length):
            if not stack or rng.random() < 0.5:
                c = "([{"[int(rng.integers(0, 3))]
                stack.append(c)
                chars.append(c)
            else:
                chars.append(_CLOSE[stack.pop()])
        if stack:
            return "".join(chars)


def _sequence_arrays(tok, prompts, targets, width):
    """``<bos> prompt <sep> target <eos>`` padded to ``width``, its loss mask, prompt lengths."""
    n = len(prompts)
    ids = np.full((n, width), PAD_ID, dtype=np.int64)
    mask = np.zeros((n, width), dtype=bool)
    prompt_lengths = np.zeros(n, dtype=np.int64)
    for i, (p, t) in enumerate(zip(prompts, targets)):
        row = np.concatenate([[BOS_ID], tok.encode(p), [SEP_ID], tok.encode(t), [EOS_ID]])
        if row.size > width:
            raise ValueError(f"make_task: example {i} needs {row.size} tokens but width is {width}")
        ids[i, :row.size] = row
        start = len(p) + 2                      # first target position (after <bos> p <sep>)
        mask[i, start:row.size] = True          # target tokens and the final <eos>
        prompt_lengths[i] = start
    return ids, mask, prompt_lengths


def _task_args(n, rng, split, min_len, max_len, where):
    """The checked ``n``, ``rng`` (a Generator), ``min_len`` and ``max_len`` of a task's data."""
    n = count(n, "n", where)
    rng = _rng(rng, where)
    one_of("train", "test")(split, "split", where)
    min_len = count(min_len, "min_len", where)
    max_len = count(max_len, "max_len", where)
    if max_len < min_len:
        raise ValueError(f"{where}: max_len is {max_len} but min_len is {min_len}; expected "
                         "max_len >= min_len")
    return n, rng, min_len, max_len


def make_task(name, n, *, rng, split="train", min_len=1, max_len=8, test_fraction=0.2,
              unique=False, tokenizer=None):
    """``n`` examples of a character task, as strings and as arrays ready for training.

    name:   one of ``TASKS``; n: the number of examples
    rng:    ``np.random.Generator`` or int seed (same seed -> same data)
    split:  ``"train"`` or ``"test"`` (disjoint sets of prompts, see ``split_of``)
    min_len, max_len: prompt lengths, drawn uniformly (digits uniform too)
    unique: no repeated prompt (use for a test set)

    Returns a dict:
        ``"prompts"``, ``"targets"``: lists of ``n`` strings
        ``"ids"``: ``(n, T)`` int64, ``<bos> prompt <sep> target <eos>`` then ``<pad>``,
            ``T = 2 * max_len + 3`` for every split, so train and test arrays stack
        ``"loss_mask"``: ``(n, T)`` bool, True exactly at the target tokens and the final
            ``<eos>`` -- the tokens the model must predict
        ``"prompt_lengths"``: ``(n,)`` int64, the length of ``<bos> prompt <sep>``: feed
            ``ids[i, :prompt_lengths[i]]`` to ``generate`` and compare what follows
        ``"task"``, ``"tokenizer"``, ``"max_target_len"`` (= max_len)

    For next-token training use ``next_token_arrays(ids, loss_mask)``.
    """
    where = "make_task"
    one_of(*TASKS)(name, "name", where)
    n, rng, min_len, max_len = _task_args(n, rng, split, min_len, max_len, where)
    tok = CharTokenizer() if tokenizer is None else tokenizer
    if not isinstance(tok, CharTokenizer):
        raise TypeError(f"{where}: tokenizer is a {type(tok).__name__}; expected a CharTokenizer")

    draw = ((lambda: (_draw_dyck(rng, min_len, max_len),)) if name == "dyck"
            else (lambda: (_draw_digits(rng, min_len, max_len),)))
    prompts = [item[0] for item in _draw_split(draw, n, split, test_fraction, unique, where)]
    if name == "sort_either":
        ascending = rng.random(n) < 0.5
        targets = [task_target("sort" if a else "sort_desc", p) for p, a in zip(prompts, ascending)]
    else:
        targets = [task_target(name, p) for p in prompts]
    ids, mask, prompt_lengths = _sequence_arrays(tok, prompts, targets, 2 * max_len + 3)
    return {"task": name, "prompts": prompts, "targets": targets, "ids": ids, "loss_mask": mask,
            "prompt_lengths": prompt_lengths, "tokenizer": tok, "max_target_len": max_len}


def make_preference_pairs(n, *, rng, split="train", chosen="sort", rejected="sort_desc",
                          min_len=2, max_len=8, test_fraction=0.2, unique=False, tokenizer=None):
    """Preference pairs for DPO (003 §9.2): the same prompt with a chosen and a rejected answer.

    The answers are the targets of two deterministic tasks (default: ascending preferred
    over descending sort -- the two answers of ``"sort_either"``). Prompts whose two
    answers coincide (e.g. ``"333"``) carry no preference and are not drawn.

    Returns a dict with ``"prompts"``, ``"chosen"``, ``"rejected"`` (strings), and
    ``"chosen_ids"``, ``"chosen_mask"``, ``"rejected_ids"``, ``"rejected_mask"``,
    ``"prompt_lengths"`` laid out as in ``make_task`` (same width ``2 * max_len + 3``).
    """
    where = "make_preference_pairs"
    n, rng, min_len, max_len = _task_args(n, rng, split, min_len, max_len, where)
    deterministic = tuple(t for t in TASKS if t not in ("sort_either", "dyck"))
    one_of(*deterministic)(chosen, "chosen", where)
    one_of(*deterministic)(rejected, "rejected", where)
    if chosen == rejected:
        raise ValueError(f"{where}: chosen and rejected are both {chosen!r}; expected two tasks")
    tok = CharTokenizer() if tokenizer is None else tokenizer

    def draw():
        for _ in range(10_000):
            p = _draw_digits(rng, min_len, max_len)
            c, r = task_target(chosen, p), task_target(rejected, p)
            if c != r:
                return p, c, r
        raise ValueError(f"{where}: {chosen!r} and {rejected!r} give the same answer to every "
                         f"prompt drawn with min_len={min_len}, max_len={max_len}; expected "
                         "longer prompts")

    items = _draw_split(draw, n, split, test_fraction, unique, where)
    prompts = [p for p, _, _ in items]
    good = [c for _, c, _ in items]
    bad = [r for _, _, r in items]
    width = 2 * max_len + 3
    chosen_ids, chosen_mask, prompt_lengths = _sequence_arrays(tok, prompts, good, width)
    rejected_ids, rejected_mask, _ = _sequence_arrays(tok, prompts, bad, width)
    return {"prompts": prompts, "chosen": good, "rejected": bad,
            "chosen_ids": chosen_ids, "chosen_mask": chosen_mask,
            "rejected_ids": rejected_ids, "rejected_mask": rejected_mask,
            "prompt_lengths": prompt_lengths, "tokenizer": tok, "max_target_len": max_len}


# ---------------------------------------- toy translation, English -> French

# English word -> French forms. Nouns carry their gender; adjectives (all placed after
# the noun in French) give (masculine, feminine); verbs give the present tense by
# person: 1st singular, 2nd singular, 3rd singular, 1st plural.
EN_FR_LEXICON = {
    "nouns": {"cat": ("chat", "m"), "dog": ("chien", "m"), "boat": ("bateau", "m"),
              "book": ("livre", "m"), "house": ("maison", "f"), "car": ("voiture", "f"),
              "flower": ("fleur", "f"), "table": ("table", "f")},
    "adjectives": {"black": ("noir", "noire"), "white": ("blanc", "blanche"),
                   "red": ("rouge", "rouge"), "green": ("vert", "verte"),
                   "blue": ("bleu", "bleue")},
    "determiners": {"the": ("le", "la"), "a": ("un", "une")},
    "pronouns": {"i": ("je", 0), "you": ("tu", 1), "he": ("il", 2), "she": ("elle", 2),
                 "we": ("nous", 3)},
    # English base form, English 3rd singular -> French by person
    "verbs": {"see": ("sees", ("vois", "vois", "voit", "voyons")),
              "take": ("takes", ("prends", "prends", "prend", "prenons")),
              "find": ("finds", ("trouve", "trouves", "trouve", "trouvons")),
              "want": ("wants", ("veux", "veux", "veut", "voulons"))},
    # "to be" by person (1st, 2nd, 3rd singular): (english, french)
    "be": (("am", "suis"), ("are", "es"), ("is", "est")),
    # professions take no article in French: "i am a student" -> "je suis étudiant";
    # (masculine, feminine); "she" takes the feminine, "i", "you", "he" the masculine
    "professions": {"student": ("étudiant", "étudiante"), "teacher": ("professeur", "professeure"),
                    "doctor": ("médecin", "médecin"), "singer": ("chanteur", "chanteuse"),
                    "baker": ("boulanger", "boulangère")},
}
MAX_SOURCE_WORDS = 7   # "the black cat sees the white house"
MAX_TARGET_WORDS = 7   # "le chat noir voit la maison blanche"


def translation_tokenizers():
    """``(source_tokenizer, target_tokenizer)``: ``WordTokenizer``s over every word of the
    lexicon, English and French, in a fixed order."""
    lex = EN_FR_LEXICON
    en = (list(lex["determiners"]) + list(lex["adjectives"]) + list(lex["nouns"])
          + list(lex["pronouns"]) + [w for base, (third, _) in lex["verbs"].items()
                                     for w in (base, third)]
          + [en for en, _ in lex["be"]] + list(lex["professions"]))
    fr = ([w for pair in lex["determiners"].values() for w in pair]
          + [f for f, _ in lex["nouns"].values()]
          + list(dict.fromkeys(w for pair in lex["adjectives"].values() for w in pair))
          + [f for f, _ in lex["pronouns"].values()]
          + [w for _, forms in lex["verbs"].values() for w in dict.fromkeys(forms)]
          + [fr for _, fr in lex["be"]]
          + list(dict.fromkeys(w for pair in lex["professions"].values() for w in pair)))
    return WordTokenizer(tuple(en)), WordTokenizer(tuple(dict.fromkeys(fr)))


def _noun_phrase(rng):
    """(english words, french words) of ``det [adj] noun``; French: det noun [adj]."""
    lex = EN_FR_LEXICON
    det = list(lex["determiners"])[int(rng.integers(0, 2))]
    noun = list(lex["nouns"])[int(rng.integers(0, len(lex["nouns"])))]
    fr_noun, gender = lex["nouns"][noun]
    g = 0 if gender == "m" else 1
    en, fr = [det], [lex["determiners"][det][g]]
    if rng.random() < 0.5:
        adj = list(lex["adjectives"])[int(rng.integers(0, len(lex["adjectives"])))]
        en += [adj, noun]
        fr += [fr_noun, lex["adjectives"][adj][g]]   # the adjective follows the noun
    else:
        en.append(noun)
        fr.append(fr_noun)
    return en, fr, g


def _draw_sentence(rng):
    """One (english, french) pair from the grammar:
    60 % ``subject verb object``, 20 % ``pronoun be a profession``, 20 % ``np is adjective``."""
    lex = EN_FR_LEXICON
    kind = rng.random()
    if kind < 0.6:
        if rng.random() < 0.5:
            pron = list(lex["pronouns"])[int(rng.integers(0, len(lex["pronouns"])))]
            fr_pron, person = lex["pronouns"][pron]
            en, fr = [pron], [fr_pron]
        else:
            en, fr, _ = _noun_phrase(rng)
            person = 2
        verb = list(lex["verbs"])[int(rng.integers(0, len(lex["verbs"])))]
        third, forms = lex["verbs"][verb]
        en.append(third if person == 2 else verb)
        fr.append(forms[person])
        obj_en, obj_fr, _ = _noun_phrase(rng)
        en += obj_en
        fr += obj_fr
    elif kind < 0.8:
        pron = ["i", "you", "he", "she"][int(rng.integers(0, 4))]
        fr_pron, person = lex["pronouns"][pron]
        prof = list(lex["professions"])[int(rng.integers(0, len(lex["professions"])))]
        be_en, be_fr = lex["be"][person]
        en = [pron, be_en, "a", prof]
        fr = [fr_pron, be_fr, lex["professions"][prof][pron == "she"]]
    else:
        en, fr, g = _noun_phrase(rng)
        adj = list(lex["adjectives"])[int(rng.integers(0, len(lex["adjectives"])))]
        en += [lex["be"][2][0], adj]
        fr += [lex["be"][2][1], lex["adjectives"][adj][g]]
    return " ".join(en), " ".join(fr)


def translation_split(sentence, *, test_fraction=0.2):
    """The split of an English source sentence: ``split_of(sentence)``, except that the
    20 sentences ``pronoun be a profession`` are always ``"train"`` -- each feminine
    profession word (``"chanteuse"``) occurs in one sentence only, so holding that
    sentence out would ask for a word never seen in training."""
    words = sentence.split()
    if len(words) == 4 and words[2] == "a" and words[3] in EN_FR_LEXICON["professions"]:
        return "train"
    return split_of(sentence, test_fraction=test_fraction)


def make_translation(n, *, rng, split="train", test_fraction=0.2, unique=False):
    """``n`` English -> French sentence pairs for an encoder-decoder (004, "Transformer
    Encoder-Decoder"), with separate source and target vocabularies.

    rng: ``np.random.Generator`` or int seed; split: ``"train"`` or ``"test"``
    (``translation_split``); unique: no repeated source sentence.

    Returns a dict:
        ``"sources"``, ``"targets"``: lists of ``n`` sentences (lowercase words)
        ``"src_ids"``: ``(n, S)`` int64 source words, then ``<pad>``; ``S = 7``
        ``"src_mask"``: ``(n, S)`` bool, True at real words (mask the padding keys of the
            encoder self-attention and of the cross-attention)
        ``"tgt_ids"``: ``(n, T)`` int64, ``<bos> words <eos>`` then ``<pad>``; ``T = 9``
        ``"loss_mask"``: ``(n, T)`` bool, True at the target words and the ``<eos>``
        ``"src_tokenizer"``, ``"tgt_tokenizer"``: ``WordTokenizer``s
    The decoder reads ``tgt_ids[:, :-1]`` and predicts ``tgt_ids[:, 1:]`` where
    ``loss_mask[:, 1:]`` (``next_token_arrays``); generation starts from ``<bos>``.
    """
    where = "make_translation"
    n = count(n, "n", where)
    rng = _rng(rng, where)
    one_of("train", "test")(split, "split", where)
    pairs = _draw_split(lambda: _draw_sentence(rng), n, split, test_fraction, unique, where,
                        translation_split)
    src_tok, tgt_tok = translation_tokenizers()
    src_ids = np.full((n, MAX_SOURCE_WORDS), PAD_ID, dtype=np.int64)
    tgt_ids = np.full((n, MAX_TARGET_WORDS + 2), PAD_ID, dtype=np.int64)
    loss_mask = np.zeros(tgt_ids.shape, dtype=bool)
    for i, (en, fr) in enumerate(pairs):
        s = src_tok.encode(en)
        t = np.concatenate([[BOS_ID], tgt_tok.encode(fr), [EOS_ID]])
        src_ids[i, :s.size] = s
        tgt_ids[i, :t.size] = t
        loss_mask[i, 1:t.size] = True
    return {"sources": [en for en, _ in pairs], "targets": [fr for _, fr in pairs],
            "src_ids": src_ids, "src_mask": src_ids != PAD_ID, "tgt_ids": tgt_ids,
            "loss_mask": loss_mask, "src_tokenizer": src_tok, "tgt_tokenizer": tgt_tok}


# ------------------------------------------- training and evaluation helpers

def next_token_arrays(ids, loss_mask):
    """Shift a batch for next-token prediction (the decoder of 004, "Transformer Decoder").

        inputs = ids[:, :-1],   labels = ids[:, 1:],   label_mask = loss_mask[:, 1:]

    The model reads ``inputs``; the loss at position t compares its prediction with
    ``labels[:, t]`` wherever ``label_mask[:, t]``.
    """
    where = "next_token_arrays"
    ids, loss_mask = np.asarray(ids), np.asarray(loss_mask)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{where}: ids has dtype {ids.dtype}; expected integer token ids")
    if loss_mask.dtype != np.bool_:
        raise TypeError(f"{where}: loss_mask has dtype {loss_mask.dtype}; expected bool")
    if ids.ndim < 1 or ids.shape[-1] < 2 or loss_mask.shape != ids.shape:
        raise ValueError(f"{where}: ids has shape {ids.shape} and loss_mask {loss_mask.shape}; "
                         "expected equal shapes (..., T) with T >= 2")
    return ids[..., :-1], ids[..., 1:], loss_mask[..., 1:]


def iterate_batches(arrays, batch_size, *, rng=None, drop_last=False):
    """One epoch of minibatches: yields ``arrays`` (a tuple/list or dict of arrays with the
    same first axis) indexed by consecutive blocks of a permutation of the rows.

    rng: a ``np.random.Generator`` (or int seed) to shuffle, ``None`` to keep the order.
    drop_last: skip a final batch smaller than ``batch_size``.
    """
    where = "iterate_batches"
    batch_size = count(batch_size, "batch_size", where)
    is_dict = isinstance(arrays, dict)
    if not is_dict and not isinstance(arrays, (tuple, list)):
        raise TypeError(f"{where}: arrays is a {type(arrays).__name__}; expected a tuple, list "
                        "or dict of arrays")
    items = list(arrays.items()) if is_dict else list(enumerate(arrays))
    if not items:
        raise ValueError(f"{where}: arrays is empty; expected at least one array")
    items = [(k, np.asarray(a)) for k, a in items]
    n = items[0][1].shape[0] if items[0][1].ndim else None
    for k, a in items:
        if a.ndim == 0 or a.shape[0] != n:
            raise ValueError(f"{where}: arrays[{k!r}] has shape {a.shape} but arrays"
                             f"[{items[0][0]!r}] has {n} rows; expected the same first axis")
    order = np.arange(n) if rng is None else _rng(rng, where).permutation(n)
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start:start + batch_size]
        if is_dict:
            yield {k: a[idx] for k, a in items}
        else:
            yield type(arrays)(a[idx] for _, a in items)


def prompt_batches(ids, prompt_lengths, batch_size):
    """Group prompts of equal length for batched generation (``generate`` takes a
    ``(batch, T)`` array, so prompts in one call must have the same length).

    Yields ``(indices, prompt_ids)`` with ``prompt_ids = ids[indices, :L]`` of shape
    ``(<= batch_size, L)``; every row appears once, in order of length.
    """
    where = "prompt_batches"
    batch_size = count(batch_size, "batch_size", where)
    ids, prompt_lengths = np.asarray(ids), np.asarray(prompt_lengths)
    if ids.ndim != 2 or prompt_lengths.shape != (ids.shape[0],):
        raise ValueError(f"{where}: ids has shape {ids.shape} and prompt_lengths "
                         f"{prompt_lengths.shape}; expected (n, T) and (n,)")
    for length in np.unique(prompt_lengths):
        rows = np.flatnonzero(prompt_lengths == length)
        for start in range(0, rows.size, batch_size):
            idx = rows[start:start + batch_size]
            yield idx, ids[idx, :int(length)]


def decode_completion(ids, tokenizer):
    """The text of generated ids: everything before the first ``<eos>``, with
    ``<pad>``/``<bos>``/``<sep>`` dropped."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"decode_completion: ids has shape {ids.shape}; expected 1-D")
    stop = np.flatnonzero(ids == EOS_ID)
    if stop.size:
        ids = ids[:stop[0]]
    return tokenizer.decode(ids, skip_special=True)


def exact_match(predictions, targets):
    """Fraction of ``predictions`` equal to their ``targets`` (strings), in [0, 1]."""
    predictions, targets = list(predictions), list(targets)
    if len(predictions) != len(targets) or not targets:
        raise ValueError(f"exact_match: got {len(predictions)} predictions and {len(targets)} "
                         "targets; expected the same non-zero number")
    return sum(p == t for p, t in zip(predictions, targets)) / len(targets)


def evaluate_generation(generate_fn, data, *, batch_size=256):
    """Exact match of greedy answers on a ``make_task`` dict.

    generate_fn: ``generate_fn(prompt_ids, max_new_tokens) -> (B, L + max_new_tokens)``
        ids, e.g. ``lambda p, m: generate(params, p, config=cfg, max_new_tokens=m, top_k=1)``.
    Returns ``(accuracy, predictions)`` with predictions in the order of ``data["prompts"]``.
    """
    tok = data["tokenizer"]
    max_new = int(data["max_target_len"]) + 1                      # target + <eos>
    preds = [None] * len(data["prompts"])
    for idx, prompt in prompt_batches(data["ids"], data["prompt_lengths"], batch_size):
        out = np.asarray(generate_fn(prompt, max_new))
        for row, i in enumerate(idx):
            preds[i] = decode_completion(out[row, prompt.shape[1]:], tok)
    return exact_match(preds, data["targets"]), preds
