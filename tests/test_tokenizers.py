"""run/tokenizers.py: every tokenizer saved, loaded and rebuilt from its dict; the digest
that tells two tokenizers apart; the bytes each token spells."""
import json

import numpy as np
import pytest

from numpytfmr.run import tokenizers as tk

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé ½ 🙂\n" * 20


def _all():
    bpe = tk.make_tokenizer("bpe", TEXT, 300)
    return {"bpe": bpe, "byte": tk.make_tokenizer("byte", TEXT),
            "char": tk.make_tokenizer("char", TEXT[:40]), "task": tk.CharTokenizer(),
            "word": tk.WordTokenizer(("the", "fox"))}


@pytest.mark.parametrize("name", ["bpe", "byte", "char", "task", "word"])
def test_save_and_load_every_kind(name, tmp_path):
    tok = _all()[name]
    path = tmp_path / "tok.json"
    tk.save_tokenizer(tok, path)
    back = tk.load_tokenizer(str(path))
    assert type(back) is type(tok) and tk.tokenizer_digest(back) == tk.tokenizer_digest(tok)
    sample = {"task": "12ab", "word": "the fox"}.get(name, TEXT[:200])
    assert list(back.encode(sample)) == list(tok.encode(sample))
    again = tk.tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert tk.tokenizer_digest(again) == tk.tokenizer_digest(tok)


def test_kinds_and_digests():
    toks = _all()
    assert {n: tk.tokenizer_kind(t) for n, t in toks.items()} == {
        "bpe": "bpe", "byte": "byte", "char": "char", "task": "task-char", "word": "word"}
    digests = {tk.tokenizer_digest(t) for t in toks.values()}
    assert len(digests) == len(toks)
    assert tk.tokenizer_digest(tk.make_tokenizer("bpe", TEXT, 300)) == \
        tk.tokenizer_digest(toks["bpe"])
    assert tk.tokenizer_digest(tk.make_tokenizer("bpe", TEXT, 290)) != \
        tk.tokenizer_digest(toks["bpe"])


def test_load_tokenizer_refuses_what_is_no_tokenizer(tmp_path):
    assert tk.load_tokenizer("byte").encode("aé") == [97, 0xC3, 0xA9]
    with pytest.raises(ValueError, match="neither 'byte' nor a tokenizer JSON"):
        tk.load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_text("{oops")
    with pytest.raises(ValueError, match="not a tokenizer JSON"):
        tk.load_tokenizer(str(tmp_path / "x.json"))
    (tmp_path / "y.json").write_text('{"type": "unigram"}')
    with pytest.raises(ValueError, match="of type 'unigram'"):
        tk.load_tokenizer(str(tmp_path / "y.json"))


def test_make_tokenizer_checks_its_arguments():
    with pytest.raises(ValueError, match="expected one of"):
        tk.make_tokenizer("wordpiece", TEXT)
    with pytest.raises(ValueError, match="vocab_size applies to 'bpe'"):
        tk.make_tokenizer("byte", TEXT, 300)


@pytest.mark.parametrize("name", ["bpe", "byte", "char"])
def test_byte_lengths_count_the_utf8_bytes(name):
    tok = _all()[name]
    ids = np.array(tok.encode(TEXT[:300]))
    assert tk.token_byte_lengths(tok)[ids].sum() == len(TEXT[:300].encode("utf-8"))


def test_text_chars_fall_back_to_bytes_and_stream():
    tok = tk.TextCharTokenizer.from_text("abc")
    ids = tok.encode("abé")
    assert ids[:2] == [0, 1] and len(ids) == 4 and tok.decode(ids) == "abé"
    assert list(tok.encode_iterable(["ab", "é"])) == ids
    with pytest.raises(ValueError, match="not an id"):
        tok.decode([3 + 256])


def test_a_tokenizer_difference_says_what_differs():
    """Two BPEs of the same kind and size are told apart by their first differing merge;
    equal tokenizers have no difference; other kinds by their symbols."""
    from numpytfmr.run.tokenizers import make_tokenizer, tokenizer_difference
    text = "the cat sat on the mat. " * 40 + "a dog ran far away"
    a, b = make_tokenizer("bpe", text, 280), make_tokenizer("bpe", text.upper(), 280)
    assert a.vocab_size == b.vocab_size
    said = tokenizer_difference(a, b)
    assert said.startswith(f"bpe, {a.vocab_size} tokens against bpe, {b.vocab_size} tokens: ")
    assert "the merges differ from merge 1" in said and "0 merges shared" in said
    assert tokenizer_difference(a, make_tokenizer("bpe", text, 280)) is None
    fewer = make_tokenizer("bpe", text, 270)                 # the same merges, fewer of them
    assert f"one has {len(a.merges)} merges, the other {len(fewer.merges)}" in \
        tokenizer_difference(a, fewer)
    assert "against byte, 256 tokens" in tokenizer_difference(a, make_tokenizer("byte", ""))
    chars = tokenizer_difference(make_tokenizer("char", "abc"), make_tokenizer("char", "abd"))
    assert "only in the first ['c'], only in the second ['d']" in chars
