"""Byte-level BPE: training the merges, encoding and decoding text, GPT-2's file format.

A language model (000 §1.2-1.3, 003 §1.3) reads text as a sequence of tokens. Byte-level
byte-pair encoding (Sennrich et al. 2016; GPT-2, Radford et al. 2019 §2.2) starts from the
256 bytes of UTF-8, so every string has a spelling, and learns merges from a corpus:

    V = special tokens + the 256 bytes
    repeat until |V| = vocab_size:
        (a, b) = the most frequent adjacent pair of tokens inside the pre-tokens
                 (a tie goes to the greater pair, comparing (a, b) as byte strings)
        V <- V + [ab];   every "a b" in the pre-tokens becomes the one token "ab"

Pre-tokens are the pieces of GPT-2's pattern (``GPT2_PATTERN``): contractions, a run of
letters, of numbers or of other symbols (each with an optional leading space), and runs
of whitespace. Merges never cross a pre-token, so " the" and "the" are learnt as words and
no token glues a word to the punctuation after it. Special tokens (``"<|endoftext|>"``) are
cut out of the text first: they are never split and never take part in a merge.

Encoding applies the learnt merges to each pre-token in the order they were learnt (lowest
rank first), which reproduces the segmentation training made; decoding concatenates the
tokens' bytes. ``decode(encode(s)) == s`` for every string ``s``.

The pattern needs the Unicode classes ``\\p{L}`` (letters) and ``\\p{N}`` (numbers), which
Python's ``re`` does not have. With the ``regex`` package installed (``pip install
numpytfmr[bpe]``) the pattern is used exactly as GPT-2 wrote it. Without it, the classes are
written out, range by range, from Python's ``unicodedata`` (see ``pretokenizer``); the two
agree on every character except those the two Unicode databases disagree on (characters
assigned in a newer Unicode version than Python's, or recategorised in one).
"""
from collections import Counter, defaultdict
import functools
import heapq
import json
import numbers
import os
import re
import unicodedata

import numpy as np

from ..contract import count
from ..shared.fileio import atomic_write_text

try:  # the optional extra ``numpytfmr[bpe]``: GPT-2's pattern exactly as written
    import regex as _regex_module
except ImportError:  # pragma: no cover - depends on the environment
    _regex_module = None

# the user API; GPT2_PATTERN, WHITE_SPACE and pretokenizer are public too, for the curious
__all__ = ["train_bpe", "BPETokenizer", "pretokenize", "bytes_to_unicode"]

# GPT-2's pre-tokenization pattern, for the ``regex`` package.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The Unicode White_Space characters: what ``\s`` matches in the ``regex`` package. Python's
# ``re`` also counts U+001C..U+001F (the information separators) as ``\s``, so the stdlib
# pattern spells this class out instead of writing ``\s``.
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
               "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def _unicode_class(major):
    """A ``re`` character class of every code point whose category starts with ``major``
    ("L" = letters Lu Ll Lt Lm Lo, "N" = numbers Nd Nl No), written as ranges."""
    ranges, start = [], None
    for cp in range(0x110000):
        inside = unicodedata.category(chr(cp))[0] == major
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append((start, cp - 1))
            start = None
    if start is not None:
        ranges.append((start, 0x10FFFF))
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


@functools.lru_cache(maxsize=None)
def pretokenizer(use_regex=None):
    """The compiled pre-tokenization pattern.

    ``use_regex``: True = the ``regex`` package with ``GPT2_PATTERN`` as written; False =
    Python's ``re`` with the classes written out; None (default) = ``regex`` if installed.

    The stdlib version replaces ``\\p{L}`` and ``\\p{N}`` by explicit ranges taken from
    ``unicodedata`` (letters Lu Ll Lt Lm Lo; numbers Nd Nl No) and ``\\s`` by
    ``WHITE_SPACE``. The shortcuts one might try instead are wrong: ``[^\\W\\d_]`` also takes
    numbers that are not decimal digits ('½', '²', 'Ⅻ') as letters, ``\\d`` misses them as
    numbers, and ``re``'s ``\\s`` adds U+001C..U+001F. Only the Unicode databases differ
    (module docstring). Building the ranges takes ~0.3 s, once.
    """
    if use_regex is None:
        use_regex = _regex_module is not None
    if use_regex:
        if _regex_module is None:
            raise ImportError("pretokenizer: use_regex=True needs the 'regex' package "
                              "(pip install numpytfmr[bpe])")
        return _regex_module.compile(GPT2_PATTERN)
    L, N, S = _unicode_class("L"), _unicode_class("N"), re.escape(WHITE_SPACE)  # \p{L} \p{N} \s
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+"
                      rf"|[{S}]+(?![^{S}])|[{S}]+")


def pretokenize(text, *, use_regex=None):
    """The pre-tokens of ``text`` (GPT-2's pattern): ``"I'll go!"`` -> ``["I", "'ll", " go",
    "!"]``."""
    return pretokenizer(use_regex).findall(_check_text(text, "pretokenize"))


@functools.lru_cache(maxsize=None)
def bytes_to_unicode():
    """GPT-2's printable spelling of bytes: ``dict[int, str]``, one character per byte.

    The printable bytes ``!``..``~``, ``¡``..``¬`` and ``®``..``ÿ`` stand for themselves;
    the other 68 (control characters, the space, ...) take the code points 256, 257, ... in
    byte order, so the space is ``Ġ`` (U+0120) and the newline ``Ċ`` (U+010A). This is the
    spelling of tokens in GPT-2's ``vocab.json`` and ``merges.txt``.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# ------------------------------------------------------------ special tokens

def _special_list(special_tokens, where):
    if special_tokens is None:
        return []
    if isinstance(special_tokens, str):
        raise TypeError(f"{where}: special_tokens is the string {special_tokens!r}; expected a "
                        "list of strings, e.g. ['<|endoftext|>']")
    specials = list(special_tokens)
    for s in specials:
        if not isinstance(s, str) or not s:
            raise ValueError(f"{where}: special_tokens holds {s!r}; expected non-empty strings")
    if len(set(specials)) != len(specials):
        raise ValueError(f"{where}: special_tokens repeats a token: {specials!r}")
    return specials


def _special_splitter(specials):
    """A pattern matching any special token, the longest first where they overlap."""
    if not specials:
        return None
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


def _segments(text, splitter):
    """``(piece, is_special)`` for the ordinary text between special tokens and the tokens."""
    if splitter is None:
        yield text, False
        return
    start = 0
    for m in splitter.finditer(text):
        if m.start() > start:
            yield text[start:m.start()], False
        yield m.group(), True
        start = m.end()
    if start < len(text):
        yield text[start:], False


def _check_text(text, where):
    if not isinstance(text, str):
        raise TypeError(f"{where}: text is a {type(text).__name__}; expected a str")
    return text


# ------------------------------------------------------------------ training

class _GreaterFirst:
    """Heap key of a pair of byte strings: the lexicographically greater pair sorts first."""
    __slots__ = ("pair",)

    def __init__(self, pair):
        self.pair = pair

    def __lt__(self, other):
        return self.pair > other.pair


def _merge_word(word, a, b, new):
    """Replace each adjacent ``a, b`` in ``word`` (left to right) by ``new``."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train_bpe(text, vocab_size, *, special_tokens=()):
    """Learn byte-level BPE merges from ``text`` (GPT-2, Radford et al. 2019 §2.2).

    Returns ``(vocab, merges)``: ``vocab`` is ``dict[int, bytes]`` with the special tokens
    first (ids 0..S-1), then the 256 single bytes (ids S..S+255), then the merged tokens;
    ``merges`` is ``list[tuple[bytes, bytes]]`` in the order they were made (the steps of
    the module docstring). Training stops early, with a smaller vocabulary, when no
    pre-token has two tokens left. A token is its bytes: a pair whose concatenation is
    already a token (``ab + c`` after ``a + bc``) is recorded as a merge and reuses that
    token's id.

    The pair counts are kept up to date, not recounted: ``pair_count[(a, b)]`` is the number
    of occurrences weighted by the pre-token frequencies, ``holders[(a, b)]`` the distinct
    pre-tokens that contain the pair, and a merge revisits only those pre-tokens. A heap
    ordered by (count, pair) gives the best pair; entries made stale by an update are
    skipped when they reach the top.
    """
    where = "train_bpe"
    text = _check_text(text, where)
    vocab_size = count(vocab_size, "vocab_size", where)
    specials = _special_list(special_tokens, where)
    if vocab_size < len(specials) + 256:
        raise ValueError(f"{where}: vocab_size is {vocab_size}; expected at least "
                         f"{len(specials) + 256} (the {len(specials)} special tokens + 256 bytes)")
    vocab = {i: s.encode("utf-8") for i, s in enumerate(specials)}
    first_byte = len(specials)
    vocab.update({first_byte + b: bytes([b]) for b in range(256)})

    # each distinct pre-token once, as a list of token ids, with its frequency
    frequency = Counter()
    for piece, is_special in _segments(text, _special_splitter(specials)):
        if not is_special:
            frequency.update(pretokenize(piece))
    words = [[first_byte + b for b in w.encode("utf-8")] for w in frequency]
    freqs = list(frequency.values())

    pair_count, holders = defaultdict(int), defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_count[pair] += freqs[i]
            holders[pair].add(i)
    heap = [(-c, _GreaterFirst((vocab[a], vocab[b])), a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)

    token_id = {t: i for i, t in vocab.items() if i >= first_byte}  # tokens are their bytes
    merges = []
    while len(vocab) < vocab_size:
        while heap and pair_count.get((heap[0][2], heap[0][3]), 0) != -heap[0][0]:
            heapq.heappop(heap)                                   # a stale count
        if not heap:
            break                                                 # nothing left to merge
        _, _, a, b = heapq.heappop(heap)
        merges.append((vocab[a], vocab[b]))
        new = token_id.get(vocab[a] + vocab[b])                  # made before by another pair
        if new is None:
            new = token_id[vocab[a] + vocab[b]] = len(vocab)
            vocab[new] = vocab[a] + vocab[b]                      # V <- V + [ab]

        changed = set()
        for i in holders.pop((a, b)):
            old_pairs = Counter(zip(words[i], words[i][1:]))
            words[i] = _merge_word(words[i], a, b, new)
            new_pairs = Counter(zip(words[i], words[i][1:]))
            for pair in old_pairs.keys() | new_pairs.keys():
                delta = (new_pairs[pair] - old_pairs[pair]) * freqs[i]
                if delta:
                    pair_count[pair] += delta
                    changed.add(pair)
                if pair in new_pairs:
                    holders[pair].add(i)
                elif pair != (a, b):
                    holders[pair].discard(i)
        for pair in changed:
            if pair_count[pair] > 0:
                heapq.heappush(heap, (-pair_count[pair], _GreaterFirst((vocab[pair[0]],
                                                                        vocab[pair[1]])), *pair))
            else:
                del pair_count[pair]
                holders.pop(pair, None)
    return vocab, merges


# ------------------------------------------------------------- the tokenizer

def _from_latin1(s, where):
    if not isinstance(s, str):
        raise ValueError(f"{where}: a token is {s!r}; expected a string")
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: the token {s!r} has a character above U+00FF; tokens are "
                         "stored one byte per character (latin-1)") from None


class BPETokenizer:
    """Encode text with learnt byte-level BPE merges; decode ids back to text.

    ``vocab``: ``dict[int, bytes]`` with every single byte in it; ``merges``: the list of
    ``(a, b)`` byte-string pairs in the order they were learnt (their rank), each ``a + b``
    a token of ``vocab``; ``special_tokens``: strings never split and never merged, found
    longest first where they overlap. A special token missing from ``vocab`` gets the next
    free id. ``train_bpe`` gives ``vocab`` and ``merges`` (docs/learner.md, "Tokens");
    encoding and decoding as in the module docstring.
    """

    _CACHE_LIMIT = 500_000  # encoded pre-tokens kept; the cache is emptied when it is full

    def __init__(self, vocab, merges, *, special_tokens=None):
        where = "BPETokenizer"
        if not isinstance(vocab, dict) or not vocab:
            raise TypeError(f"{where}: vocab is {type(vocab).__name__}; expected a non-empty "
                            "dict[int, bytes]")
        for i, token in vocab.items():
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0:
                raise ValueError(f"{where}: vocab has the id {i!r}; expected integers >= 0")
            if not isinstance(token, bytes) or not token:
                raise ValueError(f"{where}: vocab[{i}] is {token!r}; expected non-empty bytes")
        self.vocab = {int(i): t for i, t in vocab.items()}
        self.special_tokens = _special_list(special_tokens, where)
        self.special_ids = {}
        for s in self.special_tokens:
            same = [i for i, t in self.vocab.items() if t == s.encode("utf-8")]
            self.special_ids[s] = min(same) if same else max(self.vocab) + 1
            self.vocab[self.special_ids[s]] = s.encode("utf-8")
        # bytes -> id of the ordinary tokens: the smallest id with those bytes that is not
        # a special token's, else the special token's (a special token that is also text)
        specials = set(self.special_ids.values())
        self._ids = {t: i for i, t in sorted(self.vocab.items(), reverse=True) if i in specials}
        self._ids.update({t: i for i, t in sorted(self.vocab.items(), reverse=True)
                          if i not in specials})
        missing = [b for b in range(256) if bytes([b]) not in self._ids]
        if missing:
            raise ValueError(f"{where}: vocab lacks the single bytes {missing[:8]}"
                             f"{' ...' if len(missing) > 8 else ''}; a byte-level vocabulary "
                             "holds all 256")
        self.merges = []
        for r, pair in enumerate(merges):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                    and all(isinstance(t, bytes) for t in pair)):
                raise ValueError(f"{where}: merges[{r}] is {pair!r}; expected a pair of bytes")
            if pair[0] + pair[1] not in self._ids:
                raise ValueError(f"{where}: merges[{r}] is {tuple(pair)!r}, but their "
                                 f"concatenation {pair[0] + pair[1]!r} is not in vocab")
            self.merges.append(tuple(pair))
        self._ranks = {pair: r for r, pair in reversed(list(enumerate(self.merges)))}
        self._byte_ids = [self._ids[bytes([b])] for b in range(256)]
        self._splitter = _special_splitter(self.special_tokens)
        self._longest_special = max(map(len, self.special_tokens), default=0)
        self._cache = {}

    @classmethod
    def byte_level(cls, *, special_tokens=None):
        """The 256 bytes as ids 0..255 and no merges (special tokens, if any, after them)."""
        return cls({b: bytes([b]) for b in range(256)}, [], special_tokens=special_tokens)

    # -- sizes and lookups ----------------------------------------------------

    @property
    def vocab_size(self):
        """Rows an embedding table needs: the largest id + 1 (= ``len(vocab)`` when the ids
        are 0..V-1, as ``train_bpe`` makes them)."""
        return max(self.vocab) + 1

    def token_to_id(self, token):
        """The id of a token given as bytes or as a string (a special token, or text whose
        UTF-8 is one token)."""
        if isinstance(token, str):
            if token in self.special_ids:
                return self.special_ids[token]
            token = token.encode("utf-8")
        if not isinstance(token, bytes) or token not in self._ids:
            raise KeyError(f"BPETokenizer.token_to_id: {token!r} is not a token")
        return self._ids[token]

    def id_to_token(self, i):
        """The bytes of token ``i``."""
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or int(i) not in self.vocab:
            raise KeyError(f"BPETokenizer.id_to_token: {i!r} is not an id of the vocabulary")
        return self.vocab[int(i)]

    # -- encoding ---------------------------------------------------------------

    def _encode_pretoken(self, word):
        """Apply the merges by rank inside one pre-token (cached per distinct pre-token)."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        data = word.encode("utf-8")
        parts = [data[k:k + 1] for k in range(len(data))]          # the bytes
        while len(parts) > 1:
            pairs = set(zip(parts, parts[1:]))
            best = min(pairs, key=lambda p: self._ranks.get(p, len(self._ranks)))
            if best not in self._ranks:
                break                                              # no learnt pair left
            parts = _merge_word(parts, *best, best[0] + best[1])   # every "a b" -> "ab"
        ids = [self._ids[p] for p in parts]
        if len(self._cache) >= self._CACHE_LIMIT:
            self._cache.clear()
        self._cache[word] = ids
        return ids

    def encode(self, text):
        """``str -> list[int]``: special tokens as their ids, the rest pre-tokenized and merged."""
        text = _check_text(text, "BPETokenizer.encode")
        ids = []
        for piece, is_special in _segments(text, self._splitter):
            if is_special:
                ids.append(self.special_ids[piece])
            elif not self._ranks:                                  # bytes only: no merges
                ids.extend(self._byte_ids[b] for b in piece.encode("utf-8"))
            else:
                for word in pretokenize(piece):
                    ids.extend(self._encode_pretoken(word))
        return ids

    def _safe_cut(self, buffer, search_from):
        """The largest position ``p >= search_from`` of ``buffer`` with encode(buffer[:p]) +
        encode(buffer[p:] + more) == encode(buffer + more) for any ``more``, or 0.

        ``p`` qualifies when ``buffer[p]`` is whitespace and ``buffer[p - 1]`` is not: the
        pre-token holding ``buffer[p - 1]`` is a contraction or a run of letters, numbers or
        symbols, which ends before whitespace, and deciding it looked no further than
        ``buffer[p]``; the pattern has no look-behind, so the pre-tokens from ``p`` on do
        not depend on the text before. Also, no special token may cover ``p``, now or once
        more text arrives (``p`` at least ``longest special - 1`` characters from the end)."""
        limit = len(buffer) - max(self._longest_special - 1, 0)
        for p in range(min(len(buffer) - 1, limit), search_from - 1, -1):
            if buffer[p] in WHITE_SPACE and buffer[p - 1] not in WHITE_SPACE:
                if self._splitter is None or not any(
                        m.start() < p < m.end() for m in self._splitter.finditer(buffer)):
                    return p
        return 0

    def encode_iterable(self, chunks):
        """Lazily encode an iterable of strings (the lines of a file): yields ids one by one,
        exactly ``encode("".join(chunks))``, holding only a few lines in memory.

        The text is cut where no pre-token or special token can cross (before whitespace
        that follows a non-space character); a stream without such a place is held whole
        until it ends.
        """
        buffer = ""
        for chunk in chunks:
            chunk = _check_text(chunk, "BPETokenizer.encode_iterable")
            search_from = max(1, len(buffer) - max(self._longest_special - 1, 0))
            buffer += chunk
            cut = self._safe_cut(buffer, search_from)
            if cut:
                yield from self.encode(buffer[:cut])
                buffer = buffer[cut:]
        yield from self.encode(buffer)

    def decode(self, ids):
        """``ids -> str``: the tokens' bytes joined and decoded as UTF-8 (invalid -> U+FFFD)."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        try:
            data = b"".join(self.vocab[i] for i in ids)
        except (KeyError, TypeError):
            bad = next(i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)
                       or i not in self.vocab)
            raise ValueError(f"BPETokenizer.decode: {bad!r} is not an id of the vocabulary "
                             f"(0..{self.vocab_size - 1})") from None
        return data.decode("utf-8", errors="replace")

    def bytes_per_token(self, text):
        """UTF-8 bytes of ``text`` per token of its encoding: turns nats per token into bits
        per byte (bits/byte = loss / ln 2 / bytes_per_token)."""
        ids = self.encode(text)
        if not ids:
            raise ValueError("BPETokenizer.bytes_per_token: text is empty")
        return len(text.encode("utf-8")) / len(ids)

    # -- saving and loading -------------------------------------------------------

    def to_dict(self):
        """A JSON-ready description; tokens are byte strings spelled in latin-1 (one
        character per byte, so ASCII reads as itself)."""
        return {"type": "bpe",
                "special_tokens": list(self.special_tokens),
                "vocab": {str(i): t.decode("latin-1") for i, t in sorted(self.vocab.items())},
                "merges": [[a.decode("latin-1"), b.decode("latin-1")] for a, b in self.merges]}

    @classmethod
    def from_dict(cls, d):
        """Rebuild a tokenizer from ``to_dict()``."""
        where = "BPETokenizer.from_dict"
        if not isinstance(d, dict) or d.get("type") != "bpe" or not {"vocab", "merges"} <= d.keys():
            raise ValueError(f"{where}: expected a dict with 'type': 'bpe', 'vocab' and "
                             f"'merges'; got {str(d)[:80]!r}")
        try:
            vocab = {int(i): _from_latin1(t, where) for i, t in d["vocab"].items()}
            merges = [(_from_latin1(a, where), _from_latin1(b, where)) for a, b in d["merges"]]
        except (AttributeError, TypeError):
            raise ValueError(f"{where}: 'vocab' must map ids to strings and 'merges' be a list "
                             "of string pairs") from None
        return cls(vocab, merges, special_tokens=d.get("special_tokens") or None)

    def save(self, path):
        """Write the tokenizer as JSON (atomically): one vocab entry and one merge a line."""
        d = self.to_dict()
        vocab = ",\n".join(f"    {json.dumps(i)}: {json.dumps(t)}" for i, t in d["vocab"].items())
        merges = ",\n".join(f"    {json.dumps(m)}" for m in d["merges"])
        atomic_write_text(path, '{\n  "type": "bpe",\n'
                                f'  "special_tokens": {json.dumps(d["special_tokens"])},\n'
                                f'  "vocab": {{\n{vocab}\n  }},\n'
                                f'  "merges": [\n{merges}\n  ]\n}}\n')

    @classmethod
    def load(cls, path):
        """Read a tokenizer written by ``save``."""
        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"BPETokenizer.load: {os.fspath(path)!r} is not JSON "
                                 f"({exc})") from None
        return cls.from_dict(d)

    @classmethod
    def from_gpt2_files(cls, vocab_path, merges_path, *, special_tokens=None):
        """Read GPT-2's ``vocab.json`` (token -> id) and ``merges.txt`` (one "a b" per line
        after a ``#version`` line), tokens spelled with ``bytes_to_unicode``. Pass
        ``special_tokens=["<|endoftext|>"]`` to treat GPT-2's end-of-text token as special."""
        where = "BPETokenizer.from_gpt2_files"
        to_byte = {c: b for b, c in bytes_to_unicode().items()}
        specials = set(_special_list(special_tokens, where))

        def as_bytes(token):
            if token in specials:
                return token.encode("utf-8")
            if any(c not in to_byte for c in token):
                raise ValueError(f"{where}: the token {token!r} has a character outside GPT-2's "
                                 "byte alphabet; pass it in special_tokens if it is one")
            return bytes(to_byte[c] for c in token)

        with open(vocab_path, encoding="utf-8") as f:
            vocab = {int(i): as_bytes(t) for t, i in json.load(f).items()}
        merges = []
        with open(merges_path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line or (n == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ValueError(f"{where}: {os.fspath(merges_path)!r} line {n} is {line!r}; "
                                     "expected two tokens separated by one space")
                merges.append((as_bytes(parts[0]), as_bytes(parts[1])))
        return cls(vocab, merges, special_tokens=special_tokens)

    def save_gpt2_files(self, directory):
        """Write ``vocab.json`` and ``merges.txt`` in GPT-2's format into ``directory``
        (readable by ``from_gpt2_files`` and by transformers' ``GPT2Tokenizer``); returns
        their paths."""
        spell = bytes_to_unicode()
        vocab = {}
        for i, token in sorted(self.vocab.items()):
            text = token.decode("utf-8") if i in self.special_ids.values() \
                else "".join(spell[b] for b in token)
            if text in vocab:
                raise ValueError(f"BPETokenizer.save_gpt2_files: ids {vocab[text]} and {i} are "
                                 f"both {text!r}; vocab.json maps each token to one id")
            vocab[text] = i
        os.makedirs(directory, exist_ok=True)
        vocab_path = os.path.join(directory, "vocab.json")
        merges_path = os.path.join(directory, "merges.txt")
        atomic_write_text(vocab_path, json.dumps(vocab, ensure_ascii=False) + "\n")
        lines = ["#version: 0.2"] + [" ".join("".join(spell[x] for x in t) for t in pair)
                                     for pair in self.merges]
        atomic_write_text(merges_path, "\n".join(lines) + "\n")
        return vocab_path, merges_path

    def __repr__(self):
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens!r})")

