"""Byte-level BPE (numpytfmr.run.bpe): training, encoding, special tokens, GPT-2 files."""
from collections import Counter
import json
import random
import re
import unicodedata

from hypothesis import given, settings, strategies as st
import pytest

from numpytfmr.run import bpe
from numpytfmr.run.bpe import (BPETokenizer, WHITE_SPACE, bytes_to_unicode, pretokenize,
                               pretokenizer, train_bpe)
from numpytfmr.run.tokenizers import load_tokenizer

EOT = "<|endoftext|>"

try:
    import regex  # noqa: F401
    HAVE_REGEX = True
except ImportError:
    HAVE_REGEX = False

needs_regex = pytest.mark.skipif(not HAVE_REGEX,
                                 reason="the optional 'regex' package is not installed")

CORPUS = (
    "The cat sat on the mat. The cats sat on the mats!\n"
    "It's 2024; they're here, we've won, I'm sure, we'll see, he'd go.\n"
    "Ünïcödé: naïve café, 東京 and ½ of Ⅻ apples — 3.14159\n\n"
    "\tdef forward(x):\n        return x @ W + b  # 004 eq. 27\n"
) * 8


@pytest.fixture(scope="module")
def tokenizer():
    vocab, merges = train_bpe(CORPUS + EOT + CORPUS, 256 + 1 + 120, special_tokens=[EOT])
    return BPETokenizer(vocab, merges, special_tokens=[EOT])


@pytest.fixture(scope="module")
def spaced_specials():
    """Special tokens with whitespace inside, which a stream may cut."""
    specials = ["<end of text>", "a\nb", "\t\t"]
    vocab, merges = train_bpe(CORPUS, 3 + 256 + 40, special_tokens=specials)
    return BPETokenizer(vocab, merges, special_tokens=specials)


# ---------------------------------------------------------------------------------------
# pre-tokenization
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_regex", [pytest.param(True, marks=needs_regex), False])
def test_pretokenize_gpt2_pattern(use_regex):
    pieces = pretokenize("I'll go!  Now it's 42 cats\n\n x½", use_regex=use_regex)
    assert pieces == ["I", "'ll", " go", "!", " ", " Now", " it", "'s", " 42", " cats", "\n\n",
                      " x", "½"]
    # every character lands in exactly one pre-token
    text = "a\x1c b\u3000\u3000c ' ''d\r\n\t Ⅻ²"
    assert "".join(pretokenize(text, use_regex=use_regex)) == text


def test_stdlib_pattern_numbers_and_whitespace():
    """The written-out classes, where the shortcuts would differ from \\p{L}/\\p{N} and \\s:
    '½' '²' 'Ⅻ' are numbers (``[^\\W\\d_]`` would call them letters), U+001C is not
    whitespace (``re``'s ``\\s`` would say it is)."""
    assert pretokenize("ab½²Ⅻ", use_regex=False) == ["ab", "½²Ⅻ"]
    assert pretokenize("a\x1cb", use_regex=False) == ["a", "\x1c", "b"]
    assert pretokenize("1\u3000\u30002", use_regex=False) == ["1", "\u3000", "\u3000", "2"]


@needs_regex
def test_stdlib_pattern_agrees_with_regex_except_on_characters_python_does_not_know():
    """Both pre-tokenizers put every character in the same class (letter, number, other)
    except characters unassigned in Python's ``unicodedata`` (category Cn), which the newer
    database of ``regex`` may know. Every BMP code point and a fixed sample of the others."""
    import regex
    assert set(regex.findall(r"\s", "".join(map(chr, range(0x3001))))) == set(WHITE_SPACE)
    sample = list(range(0x10000)) + random.Random(0).sample(range(0x10000, 0x110000), 20000)
    chars = [chr(i) for i in sample if not 0xD800 <= i < 0xE000 and chr(i) not in WHITE_SPACE
             and chr(i) not in "\x1c\x1d\x1e\x1f"]

    def glued(use_regex, lead):  # the characters that one pre-token joins to ``lead``
        text = "\n".join(lead + c for c in chars)
        return {t[1] for t in pretokenizer(use_regex).findall(text) if len(t) == 2 and t[0] == lead}

    for lead in ("a", "1", "!"):  # letters, numbers, other symbols
        exact, stdlib = glued(True, lead), glued(False, lead)
        assert len(stdlib) > 100
        differ = exact ^ stdlib
        assert all(unicodedata.category(c) == "Cn" for c in differ), \
            sorted((hex(ord(c)), unicodedata.category(c)) for c in differ)[:10]


def test_bytes_to_unicode_is_gpt2s():
    m = bytes_to_unicode()
    assert len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord("~")] == "~" and m[0xE9] == "é"
    assert m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[0] == "Ā" and m[0xAD] == "Ń"
    assert not any(c.isspace() for c in m.values())


# ---------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------

def test_merges_on_a_hand_computed_corpus_with_ties():
    """Pre-tokens low x3, lower, lowest, newer x2, wider (newlines are single bytes).

    Pair counts: lo 5, ow 5, we 4, er 4, ne 2, ew 2, then 1s.
      1. lo and ow tie at 5: (b"o", b"w") > (b"l", b"o")      -> ow
      2. (l, ow) 5                                              -> low
      3. (e, r) 4 (lower, newer x2, wider)                      -> er
      4. ne, ew and (w, er) tie at 2: b"w" is the greatest      -> wer
      5. ne and (e, wer) tie at 2: b"n" > b"e"                  -> ne
      6. (ne, wer) 2                                            -> newer
      7. seven pairs tie at 1: (low, e) (low, er) (e, s) (s, t) (w, i) (i, d) (d, er);
         b"w" is the greatest first element                     -> wi
    """
    text = "low\nlow\nlow\nlower\nlowest\nnewer\nnewer\nwider"
    vocab, merges = train_bpe(text, 256 + 7)
    assert merges == [(b"o", b"w"), (b"l", b"ow"), (b"e", b"r"), (b"w", b"er"), (b"n", b"e"),
                      (b"ne", b"wer"), (b"w", b"i")]
    assert [vocab[i] for i in range(256, 263)] == [b"ow", b"low", b"er", b"wer", b"ne", b"newer",
                                                   b"wi"]
    assert all(vocab[b] == bytes([b]) for b in range(256))
    tok = BPETokenizer(vocab, merges)
    assert [tok.id_to_token(i) for i in tok.encode("lowest newer")] == \
        [b"low", b"e", b"s", b"t", b" ", b"newer"]


def test_training_stops_when_nothing_is_left_to_merge():
    vocab, merges = train_bpe("ab ab", 1000)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert len(vocab) == 258


def naive_train_bpe(text, vocab_size, special_tokens=()):
    """The definition, slowly: recount every pair of every pre-token before each merge."""
    vocab = {i: s.encode() for i, s in enumerate(special_tokens)}
    vocab.update({len(special_tokens) + b: bytes([b]) for b in range(256)})
    pieces = re.split("|".join(re.escape(s) for s in sorted(special_tokens, key=len, reverse=True)),
                      text) if special_tokens else [text]
    words = Counter(tuple(bytes([b]) for b in w.encode()) for p in pieces for w in pretokenize(p))
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for w, f in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += f
        if not pairs:
            break
        a, b = max(pairs, key=lambda p: (pairs[p], p))
        merges.append((a, b))
        if a + b not in list(vocab.values())[len(special_tokens):]:
            vocab[len(vocab)] = a + b
        merged = Counter()
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += f
        words = merged
    return vocab, merges


def test_incremental_counts_equal_a_naive_recount():
    rng = random.Random(0)
    alphabets = ["ab", "abc ", "abc de'\n", "xy 12.!", "aé東 "]
    for trial in range(40):
        alphabet = alphabets[trial % len(alphabets)]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        specials = ["<s>", "<s><s>"] if trial % 3 == 0 else []
        if specials:
            text = "<s>".join([text[:50], text[50:120], text[120:]]) + "<s><s>"
        size = len(specials) + 256 + rng.randint(1, 40)
        fast = train_bpe(text, size, special_tokens=specials)
        assert fast == naive_train_bpe(text, size, specials), (text, size, specials)


def test_incremental_counts_equal_a_naive_recount_on_real_text():
    assert train_bpe(CORPUS[:1500], 256 + 60) == naive_train_bpe(CORPUS[:1500], 256 + 60)


def test_special_tokens_lead_the_vocabulary_and_never_merge():
    text = ("ab<|endoftext|>" * 40) + "cd<|pad|>" * 30
    vocab, merges = train_bpe(text, 2 + 256 + 10, special_tokens=[EOT, "<|pad|>"])
    assert vocab[0] == EOT.encode() and vocab[1] == b"<|pad|>" and vocab[2] == b"\x00"
    assert merges == [(b"a", b"b"), (b"c", b"d")]  # nothing joins a token across a special
    assert all(not set(a + b) & set(b"<|>") for a, b in merges)


def test_train_bpe_argument_errors():
    with pytest.raises(ValueError, match="vocab_size is 200; expected at least 257"):
        train_bpe("abc", 200, special_tokens=[EOT])
    with pytest.raises(TypeError, match="text is a bytes"):
        train_bpe(b"abc", 300)
    with pytest.raises(TypeError, match="special_tokens is the string"):
        train_bpe("abc", 300, special_tokens=EOT)
    with pytest.raises(ValueError, match="repeats"):
        train_bpe("abc", 300, special_tokens=[EOT, EOT])


def test_training_speed_is_reasonable():
    """Incremental counts: 50 kB to 600 tokens takes well under a second (a recount per
    merge would take tens of seconds). Timed in this process's CPU seconds, which other work
    on the machine does not stretch."""
    import time
    text = CORPUS * 25
    start = time.process_time()
    vocab, merges = train_bpe(text, 600)
    assert time.process_time() - start < 5
    assert len(vocab) <= 600 and len(merges) > 100


# ---------------------------------------------------------------------------------------
# the tokenizer
# ---------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_of_any_unicode(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from([EOT, "<|", "|>", "endoftext"]))))
def test_special_tokens_are_never_split(tokenizer, parts):
    text = "".join(parts)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.token_to_id(EOT)) == text.count(EOT)


def test_overlapping_special_tokens_match_longest_first():
    specials = ["<a>", "<a><b>", "<b>"]
    tok = BPETokenizer.byte_level(special_tokens=specials)
    long_, a, b_ = (tok.token_to_id(s) for s in ("<a><b>", "<a>", "<b>"))
    assert {long_, a, b_} == {256, 257, 258}
    assert tok.encode("<a><b><a><a><b>x") == [long_, a, long_, ord("x")]
    assert tok.encode("<a><b") == [a] + list(b"<b")
    assert tok.decode(tok.encode("<a><b>!")) == "<a><b>!"


def test_encode_applies_merges_by_rank(tokenizer):
    for word in ["The", " cat", " mats", "'s", " 2024", " café", "東京"]:
        ids = tokenizer.encode(word)
        parts = [bytes([b]) for b in word.encode()]
        while True:  # the lowest-rank learnt pair, one at a time
            ranks = [(tokenizer.merges.index(p), k) for k, p in enumerate(zip(parts, parts[1:]))
                     if p in tokenizer.merges]
            if not ranks:
                break
            k = min(ranks)[1]
            parts[k:k + 2] = [parts[k] + parts[k + 1]]
        assert [tokenizer.id_to_token(i) for i in ids] == parts


def test_encode_reproduces_training_segmentation():
    """Encoding a training pre-token gives the tokens training ended with: the 7 merges of
    the hand-computed corpus spell 'newer' as one token and 'lowest' as low e s t."""
    vocab, merges = train_bpe("low\nlow\nlow\nlower\nlowest\nnewer\nnewer\nwider", 256 + 7)
    tok = BPETokenizer(vocab, merges)
    assert [tok.id_to_token(i) for i in tok.encode("newer\nwider")] == \
        [b"newer", b"\n", b"wi", b"d", b"er"]


def test_decode_replaces_invalid_utf8(tokenizer):
    zhe = tokenizer.encode("ж")
    assert len(zhe) == 2  # two bytes, never seen in training
    assert tokenizer.decode(zhe[:1]) == "\ufffd" and tokenizer.decode(zhe) == "ж"
    with pytest.raises(ValueError, match="is not an id of the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])


PIECES = list("ab '\n\t\r.!1é") + ["ll", "'ll", "<|", "|>", EOT, "  \n", "<end of text>",
                                       "a\nb", "\t\t", "<end"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(st.sampled_from(PIECES), max_size=30).map("".join)),
       st.lists(st.integers(0, 400), max_size=12))
def test_encode_iterable_equals_encode_of_the_whole_text(tokenizer, spaced_specials, text, cuts):
    """The text cut into chunks anywhere, special tokens and pre-tokens included."""
    cuts = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    chunks = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    for tok in (tokenizer, spaced_specials):
        assert list(tok.encode_iterable(chunks)) == tok.encode(text)


def test_encode_iterable_across_a_special_token_with_spaces(spaced_specials):
    chunks = ["x<end", " of", " text>\n", "y a", "\n", "b\n"]
    ids = list(spaced_specials.encode_iterable(chunks))
    assert ids == spaced_specials.encode("".join(chunks))
    assert ids.count(spaced_specials.token_to_id("<end of text>")) == 1
    assert ids.count(spaced_specials.token_to_id("a\nb")) == 1


def test_encode_iterable_is_lazy(tokenizer):
    def lines():
        yield "The cat sat on the mat.\n"
        yield "It's here.\n"
        raise AssertionError("read past what was needed")
    stream = tokenizer.encode_iterable(lines())
    first = [next(stream) for _ in range(3)]
    assert first == tokenizer.encode("The cat sat on the mat.")[:3]


def test_vocab_size_lookups_and_bytes_per_token(tokenizer):
    assert tokenizer.vocab_size == 256 + 1 + 120 == len(tokenizer.vocab)
    assert tokenizer.token_to_id(EOT) == 0
    assert tokenizer.token_to_id(b"a") == 1 + ord("a") == tokenizer.token_to_id("a")
    assert tokenizer.id_to_token(0) == EOT.encode()
    with pytest.raises(KeyError):
        tokenizer.token_to_id("not one token at all")
    text = "The cat sat on the mat."
    assert tokenizer.bytes_per_token(text) == len(text.encode()) / len(tokenizer.encode(text)) > 1
    assert BPETokenizer.byte_level().bytes_per_token("é") == 1.0


def test_tokenizer_works_without_regex(tokenizer, monkeypatch):
    """Without the optional ``regex`` package the stdlib pattern is used, with the same
    tokens on text of characters both Unicode databases know."""
    text = CORPUS[:500] + EOT + "x½²Ⅻ\x1c \u3000y"
    expected = tokenizer.encode(text)
    monkeypatch.setattr(bpe, "_regex_module", None)
    pretokenizer.cache_clear()
    try:
        fresh = BPETokenizer(tokenizer.vocab, tokenizer.merges, special_tokens=[EOT])
        assert fresh.encode(text) == expected
        assert fresh.decode(fresh.encode(text)) == text
        with pytest.raises(ImportError, match="regex"):
            pretokenizer(True)
    finally:
        pretokenizer.cache_clear()


def test_constructor_errors():
    with pytest.raises(ValueError, match="lacks the single bytes"):
        BPETokenizer({0: b"a"}, [])
    with pytest.raises(ValueError, match="not in vocab"):
        BPETokenizer({b: bytes([b]) for b in range(256)}, [(b"a", b"b")])


# ---------------------------------------------------------------------------------------
# saving, loading, GPT-2 files
# ---------------------------------------------------------------------------------------

def test_json_save_and_load(tokenizer, tmp_path):
    path = tmp_path / "tok.json"
    tokenizer.save(path)
    d = json.loads(path.read_text(encoding="utf-8"))
    assert d["type"] == "bpe" and d["special_tokens"] == [EOT] and d["vocab"]["0"] == EOT
    back = BPETokenizer.load(path)
    assert back.vocab == tokenizer.vocab and back.merges == tokenizer.merges
    assert back.special_tokens == [EOT]
    text = CORPUS[:300] + EOT + "ÿ\x00"
    assert back.encode(text) == tokenizer.encode(text)
    assert load_tokenizer(str(path)).encode(text) == tokenizer.encode(text)
    assert BPETokenizer.from_dict(tokenizer.to_dict()).merges == tokenizer.merges
    assert load_tokenizer("byte").encode("aé") == [97, 0xC3, 0xA9]
    with pytest.raises(ValueError, match="neither 'byte' nor a tokenizer JSON"):
        load_tokenizer(str(tmp_path / "missing.json"))


def test_gpt2_files_written_by_hand_are_read_and_applied(tmp_path):
    """A GPT-2-format vocabulary spelt by hand: 'Ġ' is the space; merges "Ġ t", "h e",
    "Ġt he", then the end-of-text token as GPT-2 places it, after everything else."""
    spell = bytes_to_unicode()
    vocab = {spell[b]: b for b in range(256)}
    vocab.update({"Ġt": 256, "he": 257, "Ġthe": 258, EOT: 259})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nh e\nĠt he\n", encoding="utf-8")
    tok = BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt",
                                       special_tokens=[EOT])
    assert tok.merges == [(b" ", b"t"), (b"h", b"e"), (b" t", b"he")]
    assert tok.encode(" the hex<|endoftext|>") == [258, ord(" "), 257, ord("x"), 259]
    assert tok.id_to_token(spell_id := vocab["Ġ"]) == b" " and spell_id == 32
    assert tok.decode([258, 259]) == " the<|endoftext|>"


def test_gpt2_files_round_trip(tokenizer, tmp_path):
    vocab_path, merges_path = tokenizer.save_gpt2_files(tmp_path)
    back = BPETokenizer.from_gpt2_files(vocab_path, merges_path, special_tokens=[EOT])
    assert back.vocab == tokenizer.vocab and back.merges == tokenizer.merges
    with open(merges_path, encoding="utf-8") as f:
        first = f.read().splitlines()[1]
    a, b = tokenizer.merges[0]
    assert first == "".join(bytes_to_unicode()[x] for x in a) + " " + \
        "".join(bytes_to_unicode()[x] for x in b)


def test_transformers_gpt2_tokenizer_encodes_like_ours(tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer.save_gpt2_files(tmp_path)
    hf = transformers.GPT2Tokenizer.from_pretrained(str(tmp_path))
    samples = [CORPUS[:400], "Hello world, it's 2024!  Ünïcödé ½ \n\n\tdef f(x):\n    return x  ",
               "x" + EOT + " The end.\n", "  leading and trailing spaces  ", "日本語のテキスト🙂"]
    for text in samples:
        assert hf(text)["input_ids"] == tokenizer.encode(text), text
        assert hf.decode(tokenizer.encode(text)) == text


def test_module_exports():
    assert set(bpe.__all__) >= {"train_bpe", "BPETokenizer", "bytes_to_unicode", "pretokenize"}
