"""Random windows of a token stream, token files, and ``numpytfmr tokenize``."""
import json
import os
import resource
import struct
import time

import numpy as np
import pytest

from numpytfmr.run.batches import (TOKEN_FILE_MAGIC, get_batch, open_tokens, read_token_header,
                                   token_dtype, write_tokens)
from numpytfmr.run.bpe import BPETokenizer, train_bpe
from numpytfmr.run.cli import main

EOT = "<|endoftext|>"


# ---------------------------------------------------------------------------------------
# get_batch
# ---------------------------------------------------------------------------------------

def test_windows_are_contiguous_slices_and_y_is_x_shifted():
    N, B, T = 500, 16, 12
    positions = np.arange(N)
    stream = np.random.default_rng(1).integers(0, 50, size=N).astype(np.uint16)
    xp, yp = get_batch(positions, B, T, rng=np.random.default_rng(7))
    x, y = get_batch(stream, B, T, rng=np.random.default_rng(7))   # same starts
    assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == np.int64
    assert np.array_equal(xp, xp[:, :1] + np.arange(T))            # contiguous positions
    assert np.array_equal(yp, xp + 1)                              # the next position
    assert np.array_equal(x, stream[xp]) and np.array_equal(y, stream[xp + 1])
    assert x.flags.c_contiguous and y.flags.c_contiguous
    x[:] = -1
    assert (y >= 0).all()                                          # x and y do not share memory


def test_starts_are_spread_over_the_whole_stream():
    """Starts uniform on 0..N-T-1: the first and the last window both occur, and the starts
    fill ten equal bins evenly (chi-square with 9 degrees of freedom, fixed seed)."""
    N, T = 1000, 10
    rng = np.random.default_rng(0)
    starts = np.concatenate([get_batch(np.arange(N), 100, T, rng=rng)[0][:, 0] for _ in range(200)])
    assert starts.min() == 0 and starts.max() == N - T - 1
    counts = np.bincount(starts * 10 // (N - T), minlength=10)
    expected = len(starts) / 10
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 27.9, counts  # p = 0.001
    x, y = get_batch(np.arange(T + 1), 3, T, rng=rng)               # only one window fits
    assert np.array_equal(x, np.tile(np.arange(T), (3, 1))) and y[0, -1] == T


def test_get_batch_argument_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="tokens has 8 ids; a window of context_length 8 "
                                         "needs at least 9"):
        get_batch(np.arange(8), 2, 8, rng=rng)
    with pytest.raises(ValueError, match="batch_size is 0; expected a positive integer"):
        get_batch(np.arange(100), 0, 8, rng=rng)
    with pytest.raises(ValueError, match="context_length is -3"):
        get_batch(np.arange(100), 2, -3, rng=rng)
    with pytest.raises(TypeError, match="context_length is 2.5"):
        get_batch(np.arange(100), 2, 2.5, rng=rng)
    with pytest.raises(TypeError, match="rng .*expected a numpy.random.Generator"):
        get_batch(np.arange(100), 2, 8, rng=0)
    with pytest.raises(TypeError, match="expected a 1-D array of integer token ids"):
        get_batch(np.zeros((10, 10), dtype=np.int64), 2, 4, rng=rng)
    with pytest.raises(TypeError, match="expected a 1-D array of integer token ids"):
        get_batch(np.linspace(0, 1, 100), 2, 4, rng=rng)
    with pytest.raises(TypeError, match="expected a 1-D array of token ids"):
        get_batch("abcdefgh", 2, 4, rng=rng)
    x, y = get_batch(list(range(20)), 2, 4, rng=rng)                # a list is fine
    assert np.array_equal(y, x + 1)


# ---------------------------------------------------------------------------------------
# token files
# ---------------------------------------------------------------------------------------

def test_token_file_round_trip_and_memmap_batches(tmp_path):
    ids = np.random.default_rng(3).integers(0, 1000, size=5000)
    path = tmp_path / "t.bin"
    assert write_tokens(path, iter(ids.tolist()), vocab_size=1000, chunk_size=777) == 5000
    tokens = open_tokens(path)
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.dtype("<u2")
    assert np.array_equal(tokens, ids)
    info = read_token_header(path)
    assert (info.count, info.vocab_size, info.offset) == (5000, 1000, 32)
    assert os.path.getsize(path) == 32 + 2 * 5000
    x, y = get_batch(tokens, 8, 64, rng=np.random.default_rng(5))
    xr, yr = get_batch(ids, 8, 64, rng=np.random.default_rng(5))
    assert np.array_equal(x, xr) and np.array_equal(y, yr) and x.dtype == np.int64
    assert type(x) is np.ndarray
    # an array is written in one go; a large vocabulary takes 4 bytes per id
    write_tokens(path, ids + 70_000, vocab_size=71_000)
    assert open_tokens(path).dtype == np.dtype("<u4")
    assert np.array_equal(open_tokens(path), ids + 70_000)
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_memmap_of_a_large_sparse_file_is_not_read_whole(tmp_path):
    """A 1 GiB token file (sparse: no data on disk): batches come at once and the process's
    peak memory does not grow by the file's size, as it would if it were read."""
    n = 2 ** 29
    path = tmp_path / "big.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIQQ", TOKEN_FILE_MAGIC, 1, 2, n, 50_000))
        f.truncate(32 + 2 * n)
        f.seek(32 + 2 * (n - 3))
        f.write(np.array([7, 8, 9], dtype="<u2").tobytes())
    if os.stat(path).st_blocks * 512 > 2 ** 24:
        pytest.skip("this file system does not store sparse files")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.process_time()           # CPU seconds: other work on the machine does not count
    tokens = open_tokens(path)
    x, y = get_batch(tokens, 64, 256, rng=np.random.default_rng(0))
    seconds = time.process_time() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert x.shape == (64, 256) and x.dtype == np.int64
    assert seconds < 2.0 and grown < 2 ** 27, (seconds, grown)
    assert tokens.shape == (n,) and list(tokens[-3:]) == [7, 8, 9]


def test_write_tokens_is_atomic_and_checks_ids(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [1, 2, 3], vocab_size=10)

    def failing():
        yield from range(5)
        raise RuntimeError("the source broke")
    with pytest.raises(RuntimeError, match="the source broke"):
        write_tokens(path, failing(), vocab_size=10)
    assert list(open_tokens(path)) == [1, 2, 3]                    # the old file is intact
    assert sorted(os.listdir(tmp_path)) == ["t.bin"]               # no temporary left behind
    with pytest.raises(ValueError, match="id 10 is outside 0..9"):
        write_tokens(path, [1, 10], vocab_size=10)
    with pytest.raises(ValueError, match="id -1 is outside"):
        write_tokens(path, np.array([-1, 2]), vocab_size=10)
    assert sorted(os.listdir(tmp_path)) == ["t.bin"]
    assert write_tokens(tmp_path / "empty.bin", [], vocab_size=10) == 0
    assert len(open_tokens(tmp_path / "empty.bin")) == 0


def test_open_tokens_refuses_other_and_damaged_files(tmp_path):
    other = tmp_path / "other.bin"
    other.write_bytes(b"just some bytes, not tokens at all")
    with pytest.raises(ValueError, match="is not a token file"):
        open_tokens(other)
    path = tmp_path / "t.bin"
    write_tokens(path, range(100), vocab_size=100)
    with open(path, "r+b") as f:
        f.truncate(32 + 150)
    with pytest.raises(ValueError, match="its header announces 100 ids"):
        open_tokens(path)


# ---------------------------------------------------------------------------------------
# numpytfmr tokenize
# ---------------------------------------------------------------------------------------

TEXT = ("First line of the text.\r\n\n\n  indented, with 'quotes' and it's\tTABS  \n"
        "Ünïcödé: naïve café 東京 ½ 🙂\n" + EOT + "after the special token\n") * 30


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenize")
    text = folder / "corpus.txt"
    text.write_bytes(TEXT.encode("utf-8"))
    vocab, merges = train_bpe(TEXT, 1 + 256 + 60, special_tokens=[EOT])
    tok = BPETokenizer(vocab, merges, special_tokens=[EOT])
    tok.save(folder / "tok.json")
    return folder, text, tok


def one_line_error(capsys, *needles):
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("numpytfmr tokenize: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_tokenize_writes_the_encoding_of_the_text(files, capsys):
    folder, text, tok = files
    out = folder / "bpe.bin"
    assert main(["tokenize", "--text", str(text), "--tokenizer", str(folder / "tok.json"),
                 "-o", str(out), "--quiet"]) == 0
    expected = tok.encode(TEXT)
    assert expected.count(0) == 30                                   # the special token's id
    assert np.array_equal(open_tokens(out), expected)
    assert read_token_header(out).vocab_size == tok.vocab_size
    assert "tokens" in capsys.readouterr().out

    out = folder / "bytes.bin"
    assert main(["tokenize", "--text", str(text), "--tokenizer", "byte", "-o", str(out),
                 "--quiet"]) == 0
    assert np.array_equal(open_tokens(out), list(TEXT.encode()))
    assert read_token_header(out).vocab_size == 256


def test_tokenize_refuses_to_overwrite_without_force(files, capsys):
    folder, text, _ = files
    out = folder / "twice.bin"
    args = ["tokenize", "--text", str(text), "--tokenizer", "byte", "-o", str(out), "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    os.utime(out, (0, 0))
    assert main(args) == 2
    one_line_error(capsys, "--output", "already exists", "--force")
    assert os.stat(out).st_mtime == 0                                # untouched
    assert main(args + ["--force"]) == 0
    assert os.stat(out).st_mtime > 0


def test_tokenize_usage_errors_name_the_flag(files, tmp_path, capsys):
    folder, text, _ = files
    out = str(tmp_path / "o.bin")
    cases = [
        (["--text", str(tmp_path / "missing.txt"), "--tokenizer", "byte", "-o", out], "--text"),
        (["--text", str(tmp_path), "--tokenizer", "byte", "-o", out], "--text"),
        (["--text", str(text), "--tokenizer", "not-there.json", "-o", out], "--tokenizer"),
        (["--text", str(text), "--tokenizer", str(text), "-o", out], "--tokenizer"),
        (["--text", str(text), "--tokenizer", "byte"], "--output"),
        (["--text", str(text), "--tokenizer", "byte", "-o", str(tmp_path)], "--output"),
        (["--tokenizer", "byte", "-o", out], "--text"),
        (["--text", str(text), "--tokenizer", "bpe", "-o", out], "--tokenizer-out"),
        (["--text", str(text), "--tokenizer", "byte", "-o", out, "--vocab-size", "300"],
         "--vocab-size goes with --tokenizer bpe"),
        (["--text", str(text), "--tokenizer", "byte", "-o", out, "--tokenizer-out",
          str(tmp_path / "t.json")], "--tokenizer-out goes with --tokenizer bpe"),
        (["--text", str(text), "--tokenizer", "bpe", "--vocab-size", "100", "-o", out,
          "--tokenizer-out", str(tmp_path / "t.json")], "--vocab-size is 100"),
        (["--text", str(text), "--tokenizer", "bpe", "-o", out, "--tokenizer-out",
          str(folder / "tok.json")], "--tokenizer-out"),
    ]
    for argv, flag in cases:
        assert main(["tokenize", *argv, "--quiet"]) == 2, argv
        one_line_error(capsys, flag)
    assert not os.path.exists(out)


def test_tokenize_learns_a_bpe_and_names_it_in_the_token_file(files, tmp_path, capsys):
    """``--tokenizer bpe``: the BPE learnt on the text is written to --tokenizer-out and named
    in the token file's header; the ids are its encoding of the text."""
    from numpytfmr.run.tokenizers import load_tokenizer, tokenizer_digest, tokenizer_from_dict
    _, text, _ = files
    out, tok_file = tmp_path / "o.bin", tmp_path / "bpe.json"
    assert main(["tokenize", "--text", str(text), "--tokenizer", "bpe", "--vocab-size", "300",
                 "--tokenizer-out", str(tok_file), "-o", str(out), "--quiet"]) == 0
    tok = load_tokenizer(str(tok_file))
    assert tok.vocab_size == 300 and np.array_equal(open_tokens(out), tok.encode(TEXT))
    assert tokenizer_digest(tokenizer_from_dict(read_token_header(out).tokenizer)) == \
        tokenizer_digest(tok)
    assert "byte-level BPE, 300 tokens" in capsys.readouterr().out


def test_tokenize_reports_text_that_is_not_utf8(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\nnot \xff fine\n")
    out = tmp_path / "o.bin"
    assert main(["tokenize", "--text", str(bad), "--tokenizer", "byte", "-o", str(out),
                 "--quiet"]) == 2
    one_line_error(capsys, "--text", "line 3 is not UTF-8", "0xff")
    assert sorted(os.listdir(tmp_path)) == ["bad.txt"]                # nothing left behind


def test_a_token_file_can_name_its_tokenizer(tmp_path):
    """Version 2: the tokenizer's dict in the header; the ids after it, as in version 1."""
    from numpytfmr.run.tokenizers import make_tokenizer, tokenizer_from_dict
    tok = make_tokenizer("bpe", "hello world, hello there " * 40, 270)
    ids = np.array(tok.encode("hello there world"))
    path = tmp_path / "named.bin"
    assert write_tokens(path, ids, vocab_size=tok.vocab_size, tokenizer=tok.to_dict()) == ids.size
    info = read_token_header(path)
    assert info.tokenizer == json.loads(json.dumps(tok.to_dict()))
    assert tokenizer_from_dict(info.tokenizer).encode("hello") == tok.encode("hello")
    assert info.offset > 32 and open_tokens(path).tolist() == ids.tolist()
    assert read_token_header(tmp_path / "named.bin").count == ids.size
    plain = tmp_path / "plain.bin"
    write_tokens(plain, ids, vocab_size=tok.vocab_size)
    assert read_token_header(plain).tokenizer is None and read_token_header(plain).offset == 32
    data = path.read_bytes()
    path.write_bytes(data[:40] + b"x" + data[41:])          # the JSON broken
    with pytest.raises(ValueError, match="tokenizer is not readable JSON"):
        read_token_header(path)
    with pytest.raises(TypeError, match="tokenizer is"):
        write_tokens(tmp_path / "bad.bin", ids, vocab_size=tok.vocab_size, tokenizer="bpe")
