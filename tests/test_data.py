"""Tests of numpytfmr.run.data: tokenizers, the synthetic tasks, splits, batching, evaluation."""
from collections import Counter, deque
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from numpytfmr.run.data import (BOS_ID, EOS_ID, PAD_ID, SEP_ID, TASKS, CharTokenizer, WordTokenizer,
                            decode_completion, evaluate_generation, exact_match, iterate_batches,
                            make_preference_pairs, make_task, make_translation, next_token_arrays,
                            prompt_batches, split_of, task_target, tokenizer_from_dict,
                            translation_split, translation_tokenizers)

TOK = CharTokenizer()


# ---------------------------------------------------------------------------
# independent reference answers (written differently from the library on purpose)
# ---------------------------------------------------------------------------

def _reverse(p):
    out = list(p)
    out.reverse()
    return "".join(out)


def _sort(p, descending=False):
    digits = np.array([int(c) for c in p])
    digits = np.sort(digits)[::-1] if descending else np.sort(digits)
    return "".join(str(d) for d in digits)


def _rotate(p):
    d = deque(p)
    d.rotate(-1)
    return "".join(d)


def _reduce_brackets(s):
    """Delete adjacent matched pairs until none is left."""
    while True:
        t = s.replace("()", "").replace("[]", "").replace("{}", "")
        if t == s:
            return s
        s = t


REFERENCE = {"reverse": _reverse, "sort": _sort, "sort_desc": lambda p: _sort(p, True),
             "rotate": _rotate}


# ---------------------------------------------------------------------------
# CharTokenizer
# ---------------------------------------------------------------------------

def test_char_tokenizer_layout():
    assert TOK.tokens[:4] == ("<pad>", "<bos>", "<eos>", "<sep>")
    assert (PAD_ID, BOS_ID, EOS_ID, SEP_ID) == (0, 1, 2, 3)
    assert TOK.vocab_size == len(TOK.tokens) == 4 + len(TOK.symbols)
    ids = TOK.encode("<bos>09<sep>()")
    assert ids.dtype == np.int64
    assert ids.tolist() == [1, 4, 13, 3, TOK.tokens.index("("), TOK.tokens.index(")")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(TOK.tokens)), max_size=30))
def test_char_tokenizer_round_trip(tokens):
    text = "".join(tokens)
    ids = TOK.encode(text)
    assert [TOK.tokens[i] for i in ids] == tokens
    assert TOK.decode(ids) == text
    np.testing.assert_array_equal(TOK.encode(TOK.decode(ids)), ids)
    assert TOK.decode(ids, skip_special=True) == "".join(t for t in tokens if not t.startswith("<"))


def test_char_tokenizer_errors_and_serialisation():
    with pytest.raises(ValueError, match=r"CharTokenizer.encode: text has the unknown character "
                                         r"'A' at position 2"):
        TOK.encode("12A")
    with pytest.raises(ValueError, match=r"CharTokenizer.encode: text has '<foo>' at position 1"):
        TOK.encode("1<foo>")
    with pytest.raises(TypeError, match="CharTokenizer.encode: text is a list"):
        TOK.encode(["1"])
    with pytest.raises(ValueError, match=r"CharTokenizer.decode: ids has values in \[0, 99\]"):
        TOK.decode(np.array([0, 99]))
    with pytest.raises(TypeError, match="CharTokenizer.decode: ids has dtype float64"):
        TOK.decode(np.array([1.0]))
    with pytest.raises(ValueError, match="CharTokenizer: symbols repeats"):
        CharTokenizer("abca")
    with pytest.raises(ValueError, match="CharTokenizer: symbols contains '<'"):
        CharTokenizer("ab<")
    small = CharTokenizer("xyz")
    restored = tokenizer_from_dict(json.loads(json.dumps(small.to_dict())))
    assert restored == small and restored.encode("zyx").tolist() == [6, 5, 4]
    with pytest.raises(ValueError, match="tokenizer_from_dict: .* of type 'unigram'; expected"):
        tokenizer_from_dict({"type": "unigram"})
    with pytest.raises(ValueError, match="BPETokenizer.from_dict"):     # a bpe dict without its tables
        tokenizer_from_dict({"type": "bpe"})


def test_word_tokenizer():
    tok = WordTokenizer(("je", "suis", "étudiant"))
    ids = tok.encode("<bos> je suis étudiant <eos>")
    assert ids.tolist() == [1, 4, 5, 6, 2]
    assert tok.decode(ids) == "<bos> je suis étudiant <eos>"
    assert tok.decode(ids, skip_special=True) == "je suis étudiant"
    assert tok.encode(["suis"]).tolist() == [5]
    with pytest.raises(ValueError, match=r"WordTokenizer.encode: text has the unknown word "
                                         r"'es' at position 1"):
        tok.encode("je es")
    with pytest.raises(ValueError, match="WordTokenizer: words has repeated"):
        WordTokenizer(("a", "a"))
    with pytest.raises(ValueError, match="WordTokenizer: words is"):
        WordTokenizer(("a b",))
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))) == tok


# ---------------------------------------------------------------------------
# character tasks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["reverse", "sort", "sort_desc", "rotate"])
def test_digit_task_targets_are_correct(name):
    data = make_task(name, 300, rng=0, max_len=8)
    for p, t in zip(data["prompts"], data["targets"]):
        assert 1 <= len(p) <= 8 and set(p) <= set("0123456789")
        assert t == REFERENCE[name](p)
    assert task_target(name, "3142") == {"reverse": "2413", "sort": "1234", "sort_desc": "4321",
                                         "rotate": "1423"}[name]


def test_dyck_targets_close_the_prompt_minimally():
    data = make_task("dyck", 300, rng=0, max_len=9)
    for p, t in zip(data["prompts"], data["targets"]):
        assert 1 <= len(p) <= 9 and set(p) <= set("()[]{}")
        assert t and set(t) <= set(")]}")
        assert _reduce_brackets(p + t) == ""                  # balanced once completed
        open_left = _reduce_brackets(p)
        assert set(open_left) <= set("([{") and len(t) == len(open_left)   # nothing extra
    assert task_target("dyck", "([()") == "])"
    assert task_target("dyck", "{") == "}"
    with pytest.raises(ValueError, match=r"task_target: prompt '\(\]' has '\]' at position 1"):
        task_target("dyck", "(]")


@pytest.mark.parametrize("name", TASKS)
def test_arrays_and_loss_mask_select_exactly_the_target(name):
    data = make_task(name, 200, rng=3, max_len=6)
    ids, mask, plen = data["ids"], data["loss_mask"], data["prompt_lengths"]
    assert ids.dtype == np.int64 and mask.dtype == bool and ids.shape == mask.shape == (200, 15)
    for i, (p, t) in enumerate(zip(data["prompts"], data["targets"])):
        assert TOK.decode(ids[i, :plen[i]]) == "<bos>" + p + "<sep>"
        assert TOK.decode(ids[i][mask[i]]) == t + "<eos>"     # the target and eos, nothing else
        n_used = len(p) + len(t) + 3
        assert TOK.decode(ids[i, :n_used]) == f"<bos>{p}<sep>{t}<eos>"
        assert np.all(ids[i, n_used:] == PAD_ID)
        assert np.flatnonzero(mask[i]).tolist() == list(range(plen[i], n_used))


@pytest.mark.parametrize("name", TASKS)
def test_same_seed_same_data(name):
    a = make_task(name, 50, rng=7)
    b = make_task(name, 50, rng=np.random.default_rng(7))
    c = make_task(name, 50, rng=8)
    assert a["prompts"] == b["prompts"] and a["targets"] == b["targets"]
    np.testing.assert_array_equal(a["ids"], b["ids"])
    np.testing.assert_array_equal(a["loss_mask"], b["loss_mask"])
    assert a["prompts"] != c["prompts"]


@pytest.mark.parametrize("name", ["reverse", "dyck"])
def test_train_and_test_prompts_are_disjoint(name):
    train = make_task(name, 2000, rng=0, max_len=5)
    test = make_task(name, 500, rng=0, split="test", max_len=5)
    assert not set(train["prompts"]) & set(test["prompts"])
    assert all(split_of(p) == "test" for p in test["prompts"])
    test_u = make_task(name, 100, rng=1, split="test", max_len=5, unique=True)
    assert len(set(test_u["prompts"])) == 100


def test_split_fraction_is_close_to_test_fraction():
    rng = np.random.default_rng(0)
    prompts = {"".join(map(str, rng.integers(0, 10, 8))) for _ in range(5000)}
    frac = np.mean([split_of(p) == "test" for p in prompts])
    assert 0.18 < frac < 0.22            # binomial sd ~0.006 around 0.2
    frac_half = np.mean([split_of(p, test_fraction=0.5) == "test" for p in prompts])
    assert 0.47 < frac_half < 0.53


def test_sort_either_mixes_both_orders_on_the_same_prompts():
    either = make_task("sort_either", 1000, rng=5)
    asc = make_task("sort", 1000, rng=5)
    assert either["prompts"] == asc["prompts"]
    is_asc = [t == _sort(p) for p, t in zip(either["prompts"], either["targets"])]
    is_desc = [t == _sort(p, True) for p, t in zip(either["prompts"], either["targets"])]
    assert all(a or d for a, d in zip(is_asc, is_desc))
    distinct = [i for i, p in enumerate(either["prompts"]) if len(set(p)) > 1]
    share = np.mean([is_asc[i] for i in distinct])
    assert 0.44 < share < 0.56           # probability 1/2 each, sd ~0.017


def test_preference_pairs():
    pairs = make_preference_pairs(300, rng=0, max_len=6)
    for k, p in enumerate(pairs["prompts"]):
        assert pairs["chosen"][k] == _sort(p) and pairs["rejected"][k] == _sort(p, True)
        assert pairs["chosen"][k] != pairs["rejected"][k]
        m_c, m_r = pairs["chosen_mask"][k], pairs["rejected_mask"][k]
        assert TOK.decode(pairs["chosen_ids"][k][m_c]) == pairs["chosen"][k] + "<eos>"
        assert TOK.decode(pairs["rejected_ids"][k][m_r]) == pairs["rejected"][k] + "<eos>"
        plen = pairs["prompt_lengths"][k]
        np.testing.assert_array_equal(pairs["chosen_ids"][k, :plen], pairs["rejected_ids"][k, :plen])
    test = make_preference_pairs(100, rng=0, split="test", chosen="reverse", rejected="rotate")
    assert not set(test["prompts"]) & set(pairs["prompts"])
    assert all(c == _reverse(p) for p, c in zip(test["prompts"], test["chosen"]))
    with pytest.raises(ValueError, match="make_preference_pairs: chosen and rejected are both"):
        make_preference_pairs(3, rng=0, chosen="sort", rejected="sort")
    with pytest.raises(ValueError, match="make_preference_pairs: 'reverse' and 'rotate' give the "
                                         "same answer to every prompt"):
        make_preference_pairs(3, rng=0, chosen="reverse", rejected="rotate", max_len=2)


def test_make_task_bad_input():
    with pytest.raises(ValueError, match=r"make_task: name is 'add'; expected one of 'reverse'"):
        make_task("add", 3, rng=0)
    with pytest.raises(ValueError, match="make_task: n is 0"):
        make_task("sort", 0, rng=0)
    with pytest.raises(ValueError, match="make_task: max_len is 2 but min_len is 3"):
        make_task("sort", 3, rng=0, min_len=3, max_len=2)
    with pytest.raises(ValueError, match="make_task: split is 'valid'"):
        make_task("sort", 3, rng=0, split="valid")
    with pytest.raises(TypeError, match="make_task: rng is 1.5"):
        make_task("sort", 3, rng=1.5)
    with pytest.raises(ValueError, match=r"make_task: could only draw \d+ of n=50 distinct test"):
        make_task("reverse", 50, rng=0, split="test", max_len=1, unique=True)  # 10 prompts exist
    with pytest.raises(TypeError, match="make_task: tokenizer is a WordTokenizer"):
        make_task("sort", 3, rng=0, tokenizer=WordTokenizer(("a",)))
    with pytest.raises(ValueError, match=r"task_target: prompt '1a' has non-digit"):
        task_target("sort", "1a")
    with pytest.raises(ValueError, match="task_target: name is 'sort_either'"):
        task_target("sort_either", "12")


# ---------------------------------------------------------------------------
# translation
# ---------------------------------------------------------------------------

# An independent statement of the grammar's French: (word, gender) and inflections.
_FR_NOUN = {"cat": "chat m", "dog": "chien m", "boat": "bateau m", "book": "livre m",
            "house": "maison f", "car": "voiture f", "flower": "fleur f", "table": "table f"}
_FR_ADJ = {"black": "noir noire", "white": "blanc blanche", "red": "rouge rouge",
           "green": "vert verte", "blue": "bleu bleue"}
_FR_VERB = {"see": "vois vois voit voyons", "take": "prends prends prend prenons",
            "find": "trouve trouves trouve trouvons", "want": "veux veux veut voulons"}
_FR_PROF = {"student": "étudiant étudiante", "teacher": "professeur professeure",
            "doctor": "médecin médecin", "singer": "chanteur chanteuse",
            "baker": "boulanger boulangère"}
_PERSON = {"i": (0, "je"), "you": (1, "tu"), "he": (2, "il"), "she": (2, "elle"), "we": (3, "nous")}


def _translate(sentence):
    """Word-by-word reading of the grammar, written separately from the generator."""
    w = sentence.split()

    def noun_phrase(i):
        det = w[i]
        if w[i + 1] in _FR_ADJ:
            adj, noun, j = w[i + 1], w[i + 2], i + 3
        else:
            adj, noun, j = None, w[i + 1], i + 2
        fr_noun, gender = _FR_NOUN[noun].split()
        g = gender == "f"
        out = [{"the": "le la", "a": "un une"}[det].split()[g], fr_noun]
        if adj:
            out.append(_FR_ADJ[adj].split()[g])     # adjective after the noun
        return out, j, g

    if len(w) == 4 and w[2] == "a" and w[3] in _FR_PROF:
        person, pron = _PERSON[w[0]]
        assert w[1] == ["am", "are", "is"][person]
        return " ".join([pron, ["suis", "es", "est"][person], _FR_PROF[w[3]].split()[w[0] == "she"]])
    if w[0] in _PERSON:
        person, pron = _PERSON[w[0]]
        subj, j = [pron], 1
    else:
        subj, j, g = noun_phrase(0)
        person = 2
        if w[j] == "is":
            assert j + 2 == len(w)
            return " ".join(subj + ["est", _FR_ADJ[w[j + 1]].split()[g]])
    verb = w[j][:-1] if person == 2 else w[j]          # "sees" -> "see"
    obj, end, _ = noun_phrase(j + 1)
    assert end == len(w)
    return " ".join(subj + [_FR_VERB[verb].split()[person]] + obj)


def test_translation_pairs_follow_the_grammar():
    data = make_translation(1500, rng=0)
    for en, fr in zip(data["sources"], data["targets"]):
        assert fr == _translate(en), en
    pairs = dict(zip(data["sources"], data["targets"]))
    # the example of 004 ("Encoder-Decoder Example"), English to French
    assert _translate("i am a student") == "je suis étudiant"
    assert _translate("she is a student") == "elle est étudiante"
    assert _translate("the black cat sees a red car") == "le chat noir voit une voiture rouge"
    assert _translate("the house is white") == "la maison est blanche"
    assert pairs.get("i am a student", "je suis étudiant") == "je suis étudiant"
    kinds = Counter("profession" if len(en.split()) == 4 and en.split()[3] in _FR_PROF else
                    "is" if " is " in en else "svo" for en in data["sources"])
    assert kinds["svo"] > kinds["is"] > 0 and kinds["profession"] > 0


def test_translation_arrays():
    data = make_translation(400, rng=2)
    src_tok, tgt_tok = data["src_tokenizer"], data["tgt_tokenizer"]
    assert (src_tok, tgt_tok) == translation_tokenizers()
    src, tgt, mask = data["src_ids"], data["tgt_ids"], data["loss_mask"]
    assert src.shape == (400, 7) and tgt.shape == (400, 9) and src.dtype == tgt.dtype == np.int64
    np.testing.assert_array_equal(data["src_mask"], src != PAD_ID)
    for i, (en, fr) in enumerate(zip(data["sources"], data["targets"])):
        assert src_tok.decode(src[i], skip_special=True) == en
        assert src_tok.decode(src[i][data["src_mask"][i]]) == en
        n = len(fr.split()) + 2
        assert tgt_tok.decode(tgt[i, :n]) == f"<bos> {fr} <eos>"
        assert np.all(tgt[i, n:] == PAD_ID)
        assert tgt_tok.decode(tgt[i][mask[i]]) == fr + " <eos>"
    # every French word the grammar can produce is in the target vocabulary, and the
    # two vocabularies are separate
    assert "étudiante" in tgt_tok.words and "étudiante" not in src_tok.words
    assert "student" in src_tok.words and "student" not in tgt_tok.words


def test_translation_split_and_determinism():
    a = make_translation(2000, rng=4)
    b = make_translation(2000, rng=4)
    assert a["sources"] == b["sources"]
    np.testing.assert_array_equal(a["tgt_ids"], b["tgt_ids"])
    test = make_translation(500, rng=4, split="test", unique=True)
    assert len(set(test["sources"])) == 500
    assert not set(a["sources"]) & set(test["sources"])
    # the profession sentences (each the only carrier of its feminine word) stay in train
    assert translation_split("she is a singer") == "train"
    assert not any(s.split()[-1] in _FR_PROF for s in test["sources"])


# ---------------------------------------------------------------------------
# batching and evaluation helpers
# ---------------------------------------------------------------------------

def test_next_token_arrays():
    data = make_task("reverse", 10, rng=0, max_len=4)
    inputs, labels, label_mask = next_token_arrays(data["ids"], data["loss_mask"])
    np.testing.assert_array_equal(inputs, data["ids"][:, :-1])
    np.testing.assert_array_equal(labels, data["ids"][:, 1:])
    # the first labelled position predicts the first target token from the <sep>
    for i in range(10):
        t = int(np.argmax(label_mask[i]))
        assert inputs[i, t] == SEP_ID
        assert TOK.decode(labels[i][label_mask[i]]) == data["targets"][i] + "<eos>"
    with pytest.raises(TypeError, match="next_token_arrays: loss_mask has dtype int64"):
        next_token_arrays(data["ids"], data["loss_mask"].astype(np.int64))


def test_iterate_batches():
    x = np.arange(10)
    y = np.arange(10) * 10
    batches = list(iterate_batches((x, y), 4, rng=0))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    seen = np.concatenate([b[0] for b in batches])
    assert sorted(seen.tolist()) == list(range(10)) and seen.tolist() != list(range(10))
    assert all(np.array_equal(b[1], b[0] * 10) for b in batches)          # rows stay aligned
    again = [b[0] for b in iterate_batches((x, y), 4, rng=0)]
    assert all(np.array_equal(p, q) for p, q in zip(again, (b[0] for b in batches)))
    ordered = list(iterate_batches({"x": x}, 3, drop_last=True))
    assert [b["x"].tolist() for b in ordered] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError, match=r"iterate_batches: arrays\[1\] has shape \(3,\)"):
        list(iterate_batches((x, np.arange(3)), 2))
    with pytest.raises(ValueError, match="iterate_batches: batch_size is 0"):
        list(iterate_batches((x,), 0))


def _oracle(name, corrupt=None):
    """A stand-in for greedy generation that writes the true answer (and <eos>)."""
    def generate_fn(prompt_ids, max_new_tokens):
        out = np.full((prompt_ids.shape[0], prompt_ids.shape[1] + max_new_tokens), PAD_ID,
                      dtype=np.int64)
        out[:, :prompt_ids.shape[1]] = prompt_ids
        for r, row in enumerate(prompt_ids):
            prompt = TOK.decode(row, skip_special=True)
            answer = task_target(name, prompt)
            if corrupt and corrupt(prompt):
                answer = answer[::-1] + "0"
            ids = np.concatenate([TOK.encode(answer), [EOS_ID], [TOK.encode("7")[0]] * 3])
            ids = ids[:max_new_tokens]
            out[r, prompt_ids.shape[1]:prompt_ids.shape[1] + ids.size] = ids
        return out
    return generate_fn


def test_prompt_batches_and_evaluate_generation():
    data = make_task("sort", 120, rng=0, split="test", max_len=5)
    seen = []
    for idx, prompt in prompt_batches(data["ids"], data["prompt_lengths"], 16):
        assert prompt.shape == (idx.size, data["prompt_lengths"][idx[0]]) and idx.size <= 16
        assert np.all(data["prompt_lengths"][idx] == prompt.shape[1])
        assert np.all(prompt[:, -1] == SEP_ID) and np.all(prompt[:, 0] == BOS_ID)
        seen += idx.tolist()
    assert sorted(seen) == list(range(120))
    acc, preds = evaluate_generation(_oracle("sort"), data, batch_size=16)
    assert acc == 1.0 and preds == data["targets"]
    acc, preds = evaluate_generation(_oracle("sort", corrupt=lambda p: p[0] in "01234"), data)
    expected = np.mean([p[0] not in "01234" for p in data["prompts"]])
    assert 0.0 < acc < 1.0 and acc == pytest.approx(expected)


def test_decode_completion_and_exact_match():
    ids = TOK.encode("123<eos>45")
    assert decode_completion(ids, TOK) == "123"
    assert decode_completion(TOK.encode("12"), TOK) == "12"                 # no eos: all of it
    assert decode_completion(TOK.encode("<pad>1<sep>2<eos>"), TOK) == "12"
    assert exact_match(["12", "3", "45"], ["12", "4", "45"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="exact_match: got 1 predictions and 2 targets"):
        exact_match(["1"], ["1", "2"])
