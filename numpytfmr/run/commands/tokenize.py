"""``numpytfmr tokenize``: turn a text file into a token file for pre-training.

    numpytfmr tokenize --text corpus.txt --tokenizer byte -o corpus.bin
    numpytfmr tokenize --text corpus.txt --tokenizer bpe.json -o corpus.bin --force

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

from numpytfmr.run.cli import UsageError, output_file


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
    """``byte`` or an existing tokenizer JSON file (``--tokenizer``)."""
    if text == "byte":
        return text
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is neither 'byte' nor a file; "
                                         "expected 'byte' or a tokenizer JSON (BPETokenizer.save)")
    return path


def add_command(sub):
    p = sub.add_parser(
        "tokenize", help="turn a text file into a token file for pre-training",
        description="Stream a UTF-8 text file, line by line, through a tokenizer into a token "
                    "file (a small header, then uint16 or uint32 ids) that "
                    "numpytfmr.run.batches.open_tokens maps into memory.")
    p.add_argument("--text", required=True, type=text_file, metavar="FILE",
                   help="the UTF-8 text file to tokenize")
    p.add_argument("--tokenizer", required=True, type=tokenizer_spec, metavar="T",
                   help="'byte' (the UTF-8 bytes as ids 0..255) or a tokenizer JSON (written by "
                        "pretrain --tokenizer-out, a run's tokenizer.json, or BPETokenizer.save); "
                        "the token file's header names it")
    p.add_argument("-o", "--output", required=True, type=output_file, metavar="FILE",
                   help="the token file to write")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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


def cmd_tokenize(args):
    from numpytfmr.run.batches import write_tokens
    from numpytfmr.run.tokenizers import load_tokenizer
    from numpytfmr.run.progress import Progress

    if os.path.exists(args.output) and not args.force:
        raise UsageError(f"--output {args.output} already exists; pass --force to replace it")
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
