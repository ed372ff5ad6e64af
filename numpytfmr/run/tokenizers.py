"""The tokenizers, and reading and writing them: one module for every kind.

    CharTokenizer        one token per character of a built-in task, after <pad> <bos>
                         <eos> <sep> (``numpytfmr train``, lora, dpo on the tasks)
    WordTokenizer        one token per word, after the same four (the toy translation)
    BPETokenizer         byte-level BPE learnt on a text (bpe.py), or the 256 bytes alone
    TextCharTokenizer    one token per character of a text, with a byte fallback

Every tokenizer has ``encode``, ``decode``, ``vocab_size`` and ``to_dict`` (the dict a
checkpoint stores); the functions below make, name, compare, save and load them.
"""
from dataclasses import dataclass
import hashlib
import json
import os

import numpy as np

from ..shared.fileio import atomic_write_text
from .bpe import BPETokenizer, train_bpe

__all__ = [
    "SPECIAL_TOKENS", "PAD_ID", "BOS_ID", "EOS_ID", "SEP_ID", "DEFAULT_SYMBOLS",
    "CharTokenizer", "WordTokenizer", "TextCharTokenizer", "BPETokenizer",
    "TEXT_TOKENIZERS", "DEFAULT_VOCAB_SIZE", "make_tokenizer", "tokenizer_from_dict",
    "tokenizer_difference", "tokenizer_kind", "tokenizer_digest", "save_tokenizer", "load_tokenizer",
    "token_byte_lengths",
]

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<sep>")
PAD_ID, BOS_ID, EOS_ID, SEP_ID = 0, 1, 2, 3
DIGITS = "0123456789"
BRACKETS = "()[]{}"
DEFAULT_SYMBOLS = DIGITS + "abcdefghijklmnopqrstuvwxyz" + BRACKETS + " +-=.,"


def _decode_specials(tokenizer, ids, where, sep, skip_special):
    """The tokens of ``ids`` joined by ``sep``; the four special tokens dropped with
    ``skip_special``."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{where}: ids has dtype {ids.dtype}; expected integer token ids")
    if ids.ndim != 1:
        raise ValueError(f"{where}: ids has shape {ids.shape}; expected a 1-D sequence of ids")
    if ids.size and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
        raise ValueError(f"{where}: ids has values in [{ids.min()}, {ids.max()}]; expected values "
                         f"in [0, {tokenizer.vocab_size})")
    toks = tokenizer.tokens
    return sep.join(toks[i] for i in ids.tolist() if not (skip_special and i < len(SPECIAL_TOKENS)))


def _checked_dict(cls, d, kind, field, shape):
    """``d`` if it is ``to_dict()`` of a ``cls`` (type ``kind`` with ``field``), else a
    ValueError."""
    if not isinstance(d, dict) or d.get("type") != kind or field not in d:
        raise ValueError(f"{cls.__name__}.from_dict: got {d!r}; expected "
                         f"{{'type': {kind!r}, {field!r}: {shape}}}")
    return d


# ---------------------------------------------------------------- tokenizers

@dataclass(frozen=True)
class CharTokenizer:
    """One token per character, after the four special tokens.

    ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<sep>`` = 3, then ``symbols`` in
    order. ``encode`` also reads the special tokens written out (``"<bos>12<sep>"``), so
    ``encode(decode(ids))`` gives ``ids`` back; ``<`` and ``>`` are therefore not allowed
    as symbols. The default symbols cover every built-in task (digits, brackets) plus
    lowercase letters and a little punctuation for free-form prompts.
    """
    symbols: str = DEFAULT_SYMBOLS

    def __post_init__(self):
        where = "CharTokenizer"
        if not isinstance(self.symbols, str) or not self.symbols:
            raise TypeError(f"{where}: symbols is {self.symbols!r}; expected a non-empty string")
        if len(set(self.symbols)) != len(self.symbols):
            dup = sorted({c for c in self.symbols if self.symbols.count(c) > 1})
            raise ValueError(f"{where}: symbols repeats {dup}; expected each character once")
        if "<" in self.symbols or ">" in self.symbols:
            raise ValueError(f"{where}: symbols contains '<' or '>'; these spell the special "
                             "tokens (<pad>, <bos>, <eos>, <sep>) and cannot be symbols")

    @property
    def tokens(self):
        """All tokens, index = id."""
        return SPECIAL_TOKENS + tuple(self.symbols)

    @property
    def vocab_size(self):
        return len(SPECIAL_TOKENS) + len(self.symbols)

    pad_id, bos_id, eos_id, sep_id = PAD_ID, BOS_ID, EOS_ID, SEP_ID

    def encode(self, text):
        """``str -> (len,) int64`` ids; special tokens may be written out as ``<bos>`` etc."""
        where = "CharTokenizer.encode"
        if not isinstance(text, str):
            raise TypeError(f"{where}: text is a {type(text).__name__}; expected a str")
        index = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(self.symbols)}
        ids, i = [], 0
        while i < len(text):
            if text[i] == "<":
                end = text.find(">", i)
                name = text[i:end + 1] if end >= 0 else text[i:]
                if name not in SPECIAL_TOKENS:
                    raise ValueError(f"{where}: text has {name!r} at position {i}; expected one "
                                     f"of the special tokens {', '.join(SPECIAL_TOKENS)}")
                ids.append(SPECIAL_TOKENS.index(name))
                i = end + 1
                continue
            if text[i] not in index:
                raise ValueError(f"{where}: text has the unknown character {text[i]!r} at "
                                 f"position {i}; expected one of {self.symbols!r} or a special "
                                 "token")
            ids.append(index[text[i]])
            i += 1
        return np.array(ids, dtype=np.int64)

    def decode(self, ids, *, skip_special=False):
        """``ids -> str``; special tokens are written out, or dropped with ``skip_special``."""
        return _decode_specials(self, ids, "CharTokenizer.decode", "", skip_special)

    def to_dict(self):
        """A JSON-ready description (for checkpoints); ``tokenizer_from_dict`` reads it back."""
        return {"type": "char", "symbols": self.symbols}

    @staticmethod
    def from_dict(d):
        return CharTokenizer(_checked_dict(CharTokenizer, d, "char", "symbols", "...")["symbols"])


@dataclass(frozen=True)
class WordTokenizer:
    """One token per whitespace-separated word, after the four special tokens.

    ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<sep>`` = 3, then ``words`` in
    order. ``encode("je suis étudiant")`` splits on whitespace; a word written as a
    special token (``"<bos>"``) maps to that token.
    """
    words: tuple

    def __post_init__(self):
        where = "WordTokenizer"
        words = () if isinstance(self.words, str) else tuple(self.words)
        if not words or not all(isinstance(w, str) and len(w.split()) == 1 and w == w.strip()
                                for w in words):
            raise ValueError(f"{where}: words is {self.words!r}; expected a non-empty sequence of "
                             "words without whitespace")
        if len(set(words)) != len(words) or set(words) & set(SPECIAL_TOKENS):
            raise ValueError(f"{where}: words has repeated entries or special tokens; expected "
                             "each word once")
        object.__setattr__(self, "words", words)

    @property
    def tokens(self):
        return SPECIAL_TOKENS + self.words

    @property
    def vocab_size(self):
        return len(SPECIAL_TOKENS) + len(self.words)

    pad_id, bos_id, eos_id, sep_id = PAD_ID, BOS_ID, EOS_ID, SEP_ID

    def encode(self, text):
        """``str`` (or a list of words) ``-> (n_words,) int64`` ids."""
        where = "WordTokenizer.encode"
        words = text.split() if isinstance(text, str) else text
        if not isinstance(words, (list, tuple)):
            raise TypeError(f"{where}: text is a {type(text).__name__}; expected a str or a list "
                            "of words")
        index = {w: i for i, w in enumerate(self.tokens)}
        for pos, w in enumerate(words):
            if w not in index:
                raise ValueError(f"{where}: text has the unknown word {w!r} at position {pos}; "
                                 f"the vocabulary has {len(self.words)} words")
        return np.array([index[w] for w in words], dtype=np.int64)

    def decode(self, ids, *, skip_special=False):
        """``ids -> str`` of space-separated words."""
        return _decode_specials(self, ids, "WordTokenizer.decode", " ", skip_special)

    def to_dict(self):
        return {"type": "word", "words": list(self.words)}

    @staticmethod
    def from_dict(d):
        d = _checked_dict(WordTokenizer, d, "word", "words", "[...]")
        return WordTokenizer(tuple(d["words"]))


@dataclass(frozen=True)
class TextCharTokenizer:
    """One token per character of the training text, with a byte fallback.

    ids ``0 .. C-1`` are the distinct characters of the text it was made from (sorted by
    code point); ids ``C .. C+255`` are the 256 bytes, which spell in UTF-8 any character
    not among them. Every string therefore has an encoding, and ``decode(encode(s)) == s``.
    """
    chars: str

    def __post_init__(self):
        if not isinstance(self.chars, str) or len(set(self.chars)) != len(self.chars):
            raise ValueError(f"TextCharTokenizer: chars is {self.chars[:40]!r}...; expected a "
                             "string of distinct characters")

    @classmethod
    def from_text(cls, text):
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self):
        return len(self.chars) + 256

    def encode(self, text):
        """``str -> list[int]``: a character's id, or the ids of its UTF-8 bytes."""
        index = {c: i for i, c in enumerate(self.chars)}
        first_byte = len(self.chars)
        ids = []
        for c in text:
            i = index.get(c)
            if i is None:
                ids.extend(first_byte + b for b in c.encode("utf-8"))
            else:
                ids.append(i)
        return ids

    def encode_iterable(self, chunks):
        """The ids of ``"".join(chunks)``, one chunk (a line) at a time."""
        for chunk in chunks:
            yield from self.encode(chunk)

    def decode(self, ids):
        """``ids -> str``, invalid UTF-8 (a character cut after some of its bytes) as U+FFFD."""
        C = len(self.chars)
        pieces = []
        for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if not 0 <= i < C + 256:
                raise ValueError(f"TextCharTokenizer.decode: {i} is not an id of the vocabulary "
                                 f"(0..{C + 255})")
            pieces.append(self.chars[i].encode("utf-8") if i < C else bytes([i - C]))
        return b"".join(pieces).decode("utf-8", errors="replace")

    def byte_lengths(self):
        """``(vocab_size,)``: the UTF-8 bytes each token spells."""
        return np.array([len(c.encode("utf-8")) for c in self.chars] + [1] * 256, dtype=np.int64)

    def to_dict(self):
        return {"type": "text-char", "chars": self.chars}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or d.get("type") != "text-char" or \
                not isinstance(d.get("chars"), str):
            raise ValueError(f"TextCharTokenizer.from_dict: got {str(d)[:80]!r}; expected "
                             "{'type': 'text-char', 'chars': '...'}")
        return cls(d["chars"])


# ---------------------------------------- Tokenizers of text: made, named, saved, loaded

TEXT_TOKENIZERS = ("bpe", "byte", "char")
DEFAULT_VOCAB_SIZE = 4096


def make_tokenizer(kind, text, vocab_size=None):
    """The tokenizer of a pretraining run, made from its training text.

    ``"bpe"``: byte-level BPE with ``vocab_size`` tokens learnt on ``text`` (bpe.py);
    ``"byte"``: the 256 bytes of UTF-8; ``"char"``: :class:`TextCharTokenizer`.
    ``vocab_size`` applies to BPE only (None: ``DEFAULT_VOCAB_SIZE``).
    """
    where = "make_tokenizer"
    if kind not in TEXT_TOKENIZERS:
        raise ValueError(f"{where}: tokenizer is {kind!r}; expected one of {TEXT_TOKENIZERS}")
    if kind != "bpe" and vocab_size is not None:
        raise ValueError(f"{where}: vocab_size is {vocab_size} but the {kind!r} tokenizer has a "
                         "fixed vocabulary; vocab_size applies to 'bpe'")
    if kind == "byte":
        return BPETokenizer.byte_level()
    if kind == "char":
        return TextCharTokenizer.from_text(text)
    vocab, merges = train_bpe(text, DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size)
    return BPETokenizer(vocab, merges)


def tokenizer_kind(tokenizer):
    """``"byte"``, ``"bpe"``, ``"char"`` (a TextCharTokenizer), ``"task-char"`` or
    ``"word"``: the kind a summary reports."""
    if isinstance(tokenizer, BPETokenizer):
        return "byte" if not tokenizer.merges and tokenizer.vocab_size == 256 else "bpe"
    if isinstance(tokenizer, TextCharTokenizer):
        return "char"
    return {CharTokenizer: "task-char", WordTokenizer: "word"}.get(type(tokenizer), "other")


def tokenizer_from_dict(d):
    """Rebuild a tokenizer from its ``to_dict()``: ``CharTokenizer``, ``WordTokenizer``,
    ``BPETokenizer`` or ``TextCharTokenizer``."""
    kind = d.get("type") if isinstance(d, dict) else None
    readers = {"char": CharTokenizer.from_dict, "word": WordTokenizer.from_dict,
               "bpe": BPETokenizer.from_dict, "text-char": TextCharTokenizer.from_dict}
    if kind not in readers:
        raise ValueError(f"tokenizer_from_dict: got a {type(d).__name__} of type {kind!r}; "
                         "expected a dict with 'type' 'char', 'word', 'bpe' or 'text-char'")
    return readers[kind](d)


def tokenizer_digest(tokenizer):
    """SHA-256 of the tokenizer's ``to_dict()`` written canonically: two tokenizers that
    encode alike have the same digest. A token file and a checkpoint record it."""
    d = tokenizer if isinstance(tokenizer, dict) else tokenizer.to_dict()
    text = json.dumps(d, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_difference(first, second):
    """What tells two tokenizers apart, in a few words for a message, or None when they
    encode alike (the same :func:`tokenizer_digest`). Each side is described by kind and
    size, then what differs: the first differing BPE merge (and how many of the merges
    are shared), the special tokens, the vocabulary, the characters."""
    if tokenizer_digest(first) == tokenizer_digest(second):
        return None
    a, b = first.to_dict(), second.to_dict()
    head = " against ".join(f"{tokenizer_kind(t)}, {t.vocab_size} tokens" for t in (first, second))
    if a.get("type") != b.get("type"):
        return head
    if a["type"] == "bpe":
        ma, mb = a["merges"], b["merges"]
        shared = next((i for i, (x, y) in enumerate(zip(ma, mb)) if x != y), min(len(ma), len(mb)))
        if shared < min(len(ma), len(mb)):
            return (f"{head}: the merges differ from merge {shared + 1} on "
                    f"({' + '.join(map(repr, ma[shared]))} against "
                    f"{' + '.join(map(repr, mb[shared]))}; {shared} merges shared)")
        if len(ma) != len(mb):
            return f"{head}: one has {len(ma)} merges, the other {len(mb)} ({shared} shared)"
        if a["special_tokens"] != b["special_tokens"]:
            return f"{head}: the special tokens differ ({a['special_tokens']} against " \
                   f"{b['special_tokens']})"
        return f"{head}: the same merges, but the vocabularies number their tokens differently"
    field = {"char": "symbols", "word": "words", "text-char": "chars"}.get(a["type"])
    if field is not None:
        only_a = [c for c in a[field] if c not in b[field]][:5]
        only_b = [c for c in b[field] if c not in a[field]][:5]
        if only_a or only_b:
            return f"{head}: {field} only in the first {only_a}, only in the second {only_b}"
        return f"{head}: the same {field} in another order"
    return head


def save_tokenizer(tokenizer, path):
    """Write a tokenizer as JSON (atomically): ``BPETokenizer.save``'s one entry a line for
    BPE, its ``to_dict()`` for the others; :func:`load_tokenizer` reads either."""
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save(path)
    else:
        atomic_write_text(path, json.dumps(tokenizer.to_dict(), ensure_ascii=False, indent=1)
                          + "\n")


def load_tokenizer(spec):
    """``"byte"`` (the UTF-8 bytes as ids 0..255), or the path of a tokenizer JSON written by
    :func:`save_tokenizer`, ``BPETokenizer.save`` or ``pretrain --tokenizer-out``."""
    where = "load_tokenizer"
    if spec == "byte":
        return BPETokenizer.byte_level()
    if not isinstance(spec, (str, os.PathLike)) or not os.path.isfile(spec):
        raise ValueError(f"{where}: {spec!r} is neither 'byte' nor a tokenizer JSON file")
    try:
        with open(spec, encoding="utf-8") as f:
            d = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: {os.fspath(spec)!r} is not a tokenizer JSON ({exc})") from None
    return tokenizer_from_dict(d)


def token_byte_lengths(tokenizer):
    """``(vocab_size,)`` int64: how many UTF-8 bytes of text each token spells (0 for an
    id that is no token). ``lengths[ids].sum()`` is the length of the text ``ids`` encode."""
    if isinstance(tokenizer, TextCharTokenizer):
        return tokenizer.byte_lengths()
    out = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for i, token in tokenizer.vocab.items():
        out[i] = len(token)
    return out
