"""``numpytfmr tokenize``: turn a text file into a token file for pre-training.

    numpytfmr tokenize --text corpus.txt --tokenizer byte -o corpus.bin
    numpytfmr tokenize --text corpus.txt --tokenizer bpe --vocab-size 4096 \
        --tokenizer-out corpus-bpe.json -o corpus.bin     # learn the BPE, then tokenize
    numpytfmr tokenize --text more.txt --tokenizer corpus-bpe.json -o more.bin --force

The text is read line by line and streamed through the tokenizer into the token file
(``numpytfmr.run.batches``: a header naming the tokenizer, then the ids as uint16 or
uint32), so a corpus larger than memory can be tokenized; ``open_tokens`` maps the result
for ``get_batch``, and ``numpytfmr pretrain --tokens`` trains on it. The file
is written under a temporary name and renamed when complete; an existing file is replaced
only with ``--force``.
"""
import argparse
import os
import time

from numpytfmr.run.cli import UsageError, output_file, positive_int
from numpytfmr.run.options import add_force, add_quiet, command_parser
from numpytfmr.run.outputs import refuse_overwrite


def text_file(text):
    """An existing, readable file (``--text``)."""
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        if not os.path.exists(path):
            what = "does not exist"
        elif os.path.isdir(path):
            what = "is a directory"
        else:
            what = "is not a regular file"
        raise argparse.ArgumentTypeError(f"is {text!r}, which {what}; expected a UTF-8 text file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is not readable")
    return path


def tokenizer_spec(text):
    """``byte``, ``bpe`` (learnt here) or an existing tokenizer JSON file (``--tokenizer``)."""
    if text in ("byte", "bpe"):
        return text
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is neither 'byte', 'bpe' nor a "
                                         "file; expected one of them or a tokenizer JSON "
                                         "(pretrain --tokenizer-out, a run's tokenizer.json)")
    return path


def add_command(sub):
    p = command_parser(sub, "tokenize")
    p.add_argument("--text", required=True, type=text_file, metavar="FILE",
                   help="the UTF-8 text file to tokenize")
    p.add_argument("--tokenizer", required=True, type=tokenizer_spec, metavar="T",
                   help="'byte' (the UTF-8 bytes as ids 0..255), 'bpe' (byte-level BPE learnt "
                        "on --text, written to --tokenizer-out) or a tokenizer JSON (written by "
                        "--tokenizer-out, a run's tokenizer.json, or BPETokenizer.save); the "
                        "token file's header names it")
    p.add_argument("--vocab-size", type=positive_int, metavar="N",
                   help="with --tokenizer bpe: the vocabulary size (default 4096)")
    p.add_argument("--tokenizer-out", type=output_file, metavar="FILE",
                   help="with --tokenizer bpe: where to write the tokenizer learnt (for pretrain "
                        "--tokenizer and later tokenize runs)")
    p.add_argument("-o", "--output", required=True, type=output_file, metavar="FILE",
                   help="the token file to write")
    add_force(p, "replace --output if it exists")
    add_quiet(p)
    p.set_defaults(func=cmd_tokenize)


def _lines(f, path, bar):
    """The lines of the binary file ``f`` decoded as UTF-8 (line ends kept as written)."""
    done = 0
    for number, raw in enumerate(f, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"--text {path}: line {number} is not UTF-8 (byte 0x"
                             f"{raw[exc.start]:02x} at byte {exc.start + 1} of the line)") from None
        done += len(raw)
        if done >= 1 << 20:
            bar.update(done)
            done = 0
        yield line
    bar.update(done)


def _learn(args):
    """Byte-level BPE learnt on the whole --text, written to --tokenizer-out."""
    from numpytfmr.run.tokenizers import DEFAULT_VOCAB_SIZE, make_tokenizer, save_tokenizer
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {args.text}: cannot be read as UTF-8 text ({exc})") from None
    start = time.perf_counter()
    size = args.vocab_size or DEFAULT_VOCAB_SIZE
    if size < 256:
        raise UsageError(f"--vocab-size is {size}; a byte-level BPE has at least the 256 bytes")
    tokenizer = make_tokenizer("bpe", text, size)
    save_tokenizer(tokenizer, args.tokenizer_out)
    print(f"{args.tokenizer_out}: byte-level BPE, {tokenizer.vocab_size:,} tokens learnt on "
          f"{len(text.encode('utf-8')):,} bytes, {time.perf_counter() - start:.1f} s")
    return tokenizer


def cmd_tokenize(args):
    from numpytfmr.run.batches import write_tokens
    from numpytfmr.run.tokenizers import load_tokenizer
    from numpytfmr.run.progress import Progress

    refuse_overwrite("--output", args.output, args.force, instead="")
    learn = args.tokenizer == "bpe"
    if learn and not args.tokenizer_out:
        raise UsageError("--tokenizer bpe learns a tokenizer on --text; name its file with "
                         "--tokenizer-out FILE (the token file needs it to be read back)")
    if not learn and (args.tokenizer_out or args.vocab_size):
        flag = "--tokenizer-out" if args.tokenizer_out else "--vocab-size"
        raise UsageError(f"{flag} goes with --tokenizer bpe (a tokenizer learnt here); "
                         f"--tokenizer {args.tokenizer} is given as it is")
    if learn:
        refuse_overwrite("--tokenizer-out", args.tokenizer_out, args.force, instead="")
        tokenizer = _learn(args)
    else:
        try:
            tokenizer = load_tokenizer(args.tokenizer)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--tokenizer {args.tokenizer}: {exc}") from None
    size = os.path.getsize(args.text)
    start = time.perf_counter()
    with open(args.text, "rb") as f, Progress(size, "tokenize", enabled=not args.quiet) as bar:
        n = write_tokens(args.output, tokenizer.encode_iterable(_lines(f, args.text, bar)),
                         vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.to_dict())
    seconds = time.perf_counter() - start
    per_token = f", {size / n:.3f} bytes/token" if n else ""
    print(f"{args.output}: {n:,} tokens (vocabulary {tokenizer.vocab_size:,}) from {size:,} bytes "
          f"of text{per_token}, {seconds:.1f} s")
    return 0
