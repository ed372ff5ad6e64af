"""Random windows of a token stream, and token files on disk.

Pre-training (003 §1.3) turns a corpus into one long stream of token ids t_0 .. t_{N-1}
and trains next-token prediction (000 §1.2) on random windows of it:

    s_b ~ Uniform{0, ..., N - T - 1}            b = 1..B
    x_b = t_{s_b} .. t_{s_b + T - 1}            y_b = t_{s_b + 1} .. t_{s_b + T}

so y is x shifted by one token: y_{b,i} is the token that follows x_{b,i}.

A corpus larger than memory lives in a token file (``write_tokens``, ``open_tokens``): a
32-byte header, then the ids as little-endian ``uint16`` (vocabularies up to 65,536) or
``uint32``. ``open_tokens`` maps it with ``np.memmap``, and ``get_batch`` reads only the
B (T + 1) tokens of its windows.

Header (little-endian): ``b"NPTFTOK1"`` | uint32 version | uint32 bytes per id (2 or 4)
| uint64 number of ids | uint64 vocabulary size; version 1 ends there (32 bytes). Version 2
names its tokenizer: | uint64 n | n bytes of the tokenizer's JSON (UTF-8, its ``to_dict()``),
so that the file can be read without being told what made it (``pretrain --tokens``).
"""
import itertools
import json
import os
import struct
from typing import NamedTuple

import numpy as np

from ..contract import count, describe, generator
from ..shared.fileio import atomic_file

__all__ = ["get_batch", "write_tokens", "open_tokens", "read_token_header", "TokenFileInfo",
           "token_dtype"]

TOKEN_FILE_MAGIC = b"NPTFTOK1"
_HEADER = struct.Struct("<8sIIQQ")  # magic, version, bytes per id, number of ids, vocab size
_TOKENIZER_LENGTH = struct.Struct("<Q")   # version 2: bytes of the tokenizer JSON that follow
_VERSIONS = (1, 2)


def get_batch(tokens, batch_size, context_length, *, rng):
    """B random windows of a token stream: ``x, y`` of shape (B, T), int64, ``y`` = ``x``
    shifted by one (000 §1.2, next-token prediction).

    tokens: (N,) integers, a NumPy array or an ``np.memmap`` of a token file (only the
    windows are read); batch_size B, context_length T: positive integers with N >= T + 1;
    rng: a ``numpy.random.Generator``. Starts s_b are uniform on 0 .. N - T - 1, so every
    token of the stream can appear in x and every one but the first in y.
    """
    where = "get_batch"
    B = count(batch_size, "batch_size", where)
    T = count(context_length, "context_length", where)
    rng = generator(rng, "rng", where)
    if not isinstance(tokens, np.ndarray):
        if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
            raise TypeError(f"{where}: tokens is {describe(tokens)}; expected a 1-D array of "
                            "token ids (or the np.memmap of open_tokens)")
        tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not (np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0):
        raise TypeError(f"{where}: tokens is {describe(tokens)}; expected a 1-D array of "
                        "integer token ids")
    N = tokens.shape[0]
    if N < T + 1:
        raise ValueError(f"{where}: tokens has {N} ids; a window of context_length {T} needs "
                         f"at least {T + 1} (T inputs and the one target after them)")
    starts = rng.integers(0, N - T, size=B)                 # s_b ~ U{0..N-T-1}
    window = np.asarray(tokens[starts[:, None] + np.arange(T + 1)], dtype=np.int64)  # (B, T+1)
    x = np.ascontiguousarray(window[:, :-1])                # t_{s_b} .. t_{s_b+T-1}
    y = np.ascontiguousarray(window[:, 1:])                 # t_{s_b+1} .. t_{s_b+T}
    return x, y


# ---------------------------------------------------------------------------
# token files
# ---------------------------------------------------------------------------

class TokenFileInfo(NamedTuple):
    """What a token file's header says."""
    count: int          # number of ids
    vocab_size: int     # every id is below it
    dtype: np.dtype     # uint16 or uint32, little-endian
    offset: int         # bytes before the first id
    tokenizer: dict = None   # the tokenizer's to_dict() (version 2), or None


def token_dtype(vocab_size):
    """``uint16`` for vocabularies up to 65,536 ids, else ``uint32`` (little-endian)."""
    vocab_size = count(vocab_size, "vocab_size", "token_dtype")
    if vocab_size > 2 ** 32:
        raise ValueError(f"token_dtype: vocab_size is {vocab_size}; at most 2**32 ids fit a "
                         "token file")
    return np.dtype("<u2") if vocab_size <= 2 ** 16 else np.dtype("<u4")


def write_tokens(path, ids, *, vocab_size, tokenizer=None, chunk_size=1 << 20):
    """Write a stream of token ids to a token file; returns the number of ids written.

    ``tokenizer``: the ``to_dict()`` of the tokenizer that made the ids, stored in the
    header (version 2), or None (version 1: the reader has to be told the tokenizer).

    ``ids``: an array, or any iterable of integers (such as ``BPETokenizer.encode_iterable``),
    consumed ``chunk_size`` at a time, so a stream larger than memory can be written. The file
    is written under a temporary name in the same folder and renamed when complete: an
    interrupted write leaves no partial file at ``path``. Ids outside 0 .. vocab_size - 1
    raise ``ValueError``.
    """
    where = "write_tokens"
    dtype = token_dtype(vocab_size)
    chunk_size = count(chunk_size, "chunk_size", where)
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"{where}: ids is {describe(ids)}; expected a 1-D array")
        chunks = (ids[k:k + chunk_size] for k in range(0, len(ids), chunk_size))
    else:
        chunks = _int_chunks(iter(ids), chunk_size)
    if tokenizer is not None and not isinstance(tokenizer, dict):
        raise TypeError(f"{where}: tokenizer is {describe(tokenizer)}; expected the tokenizer's "
                        "to_dict() or None")
    version = 1 if tokenizer is None else 2
    named = b"" if tokenizer is None else _tokenizer_bytes(tokenizer)
    n = 0
    with atomic_file(path) as f:
        f.write(_HEADER.pack(TOKEN_FILE_MAGIC, version, dtype.itemsize, 0, vocab_size))
        if named:
            f.write(_TOKENIZER_LENGTH.pack(len(named)) + named)
        for chunk in chunks:
            if not (np.issubdtype(chunk.dtype, np.integer)):
                raise TypeError(f"{where}: ids holds {chunk.dtype} values; expected integers")
            lo, hi = int(chunk.min()), int(chunk.max())
            if lo < 0 or hi >= vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{where}: id {bad} is outside 0..{vocab_size - 1} "
                                 f"(vocab_size {vocab_size})")
            f.write(np.ascontiguousarray(chunk, dtype=dtype).data)
            n += len(chunk)
        f.seek(0)
        f.write(_HEADER.pack(TOKEN_FILE_MAGIC, version, dtype.itemsize, n, vocab_size))
    return n


def _tokenizer_bytes(tokenizer):
    return json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _int_chunks(stream, chunk_size):
    """Arrays of up to ``chunk_size`` integers from an iterator, until it is exhausted."""
    while True:
        chunk = np.fromiter(itertools.islice(stream, chunk_size), dtype=np.int64)
        if len(chunk) == 0:
            return
        yield chunk


def read_token_header(path):
    """The header of a token file as a ``TokenFileInfo``; checks the file's size."""
    where = "read_token_header"
    path = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
    if len(head) < _HEADER.size or not head.startswith(TOKEN_FILE_MAGIC):
        raise ValueError(f"{where}: {path!r} is not a token file (no {TOKEN_FILE_MAGIC!r} header; "
                         "write one with write_tokens or 'numpytfmr tokenize')")
    _, version, itemsize, n, vocab_size = _HEADER.unpack(head)
    if version not in _VERSIONS or itemsize not in (2, 4):
        raise ValueError(f"{where}: {path!r} has version {version}, {itemsize} bytes per id; "
                         f"expected version 1 or 2, 2 or 4 bytes per id")
    offset, tokenizer = _HEADER.size, None
    size = os.path.getsize(path)
    if version == 2:
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read(_TOKENIZER_LENGTH.size)
            length = _TOKENIZER_LENGTH.unpack(raw)[0] if len(raw) == _TOKENIZER_LENGTH.size \
                else size
            named = f.read(length) if length < size else b""
        try:
            tokenizer = json.loads(named.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            tokenizer = None
        if not isinstance(tokenizer, dict):
            raise ValueError(f"{where}: {path!r} has a version-2 header whose tokenizer is not "
                             "readable JSON (truncated or corrupt?)")
        offset += _TOKENIZER_LENGTH.size + length
    expected = offset + n * itemsize
    if size != expected:
        raise ValueError(f"{where}: {path!r} is {size} bytes; its header announces {n} ids, "
                         f"{expected} bytes (truncated or appended to?)")
    return TokenFileInfo(n, vocab_size, np.dtype("<u2" if itemsize == 2 else "<u4"), offset,
                         tokenizer)


def open_tokens(path):
    """A read-only ``np.memmap`` (N,) of a token file's ids: nothing is read until indexed."""
    info = read_token_header(path)
    if info.count == 0:
        return np.zeros(0, dtype=info.dtype)
    return np.memmap(path, dtype=info.dtype, mode="r", offset=info.offset, shape=(info.count,))
