"""The ``numpytfmr`` command (``python -m numpytfmr`` is the same program).

Each sub-command is one small function ``cmd_<name>(args) -> exit status``; argparse
does the parsing. Heavy modules are imported inside the commands that need them, so
``numpytfmr --help`` stays instant.

Exit status: 0 success; 1 checks or tests failed (``check``, ``grade``); 2 a usage error
(a bad flag value, a missing or unreadable file, an output that would overwrite work),
reported as one line ``numpytfmr COMMAND: error: --flag ...`` on stderr, without a
traceback; 130 interrupted (Ctrl-C).

Flag values are checked while parsing, by the argument types below (``positive_int``,
``checkpoint_path``, ``output_file``, ...); a command that finds a problem later raises
:class:`UsageError`. ``main`` turns both, and the ``ValueError`` of a library function
refusing its input, into that one line and status 2.
"""
import argparse
import importlib
import importlib.util
import math
import os
import re
import sys

__all__ = ["main", "build_parser", "UsageError", "Parser", "positive_int", "nonnegative_int",
           "positive_float", "nonnegative_float", "checkpoint_path", "output_file",
           "output_dir"]


class UsageError(ValueError):
    """A command line that cannot run as given: ``main`` prints the message as one line on
    stderr and exits with status 2. The message names the flag (``--steps is 0; expected
    an integer >= 1``). ``prog`` is the command (``numpytfmr train``) when known."""

    def __init__(self, message, prog=None):
        super().__init__(message)
        self.prog = prog


def from_flag(flag, load, *args, **kwargs):
    """``load(*args, **kwargs)``; its ValueError becomes the usage error ``FLAG: message``
    (a checkpoint or file that the flag names and that cannot be read as expected)."""
    try:
        return load(*args, **kwargs)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are a :class:`UsageError` (one line, no usage
    block), not a printout and ``sys.exit``; the sub-command parsers are of this class too.
    A flag is spelled out in full: no abbreviations (``--minute`` is not ``--minutes``)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(_flag_message(message), prog=self.prog)

    def parse_args(self, args=None, namespace=None):
        args, extras = self.parse_known_args(args, namespace)
        if extras:      # left over by a sub-command's parser: report them as its error
            command = getattr(args, "command", None)
            raise UsageError(f"unrecognized arguments: {' '.join(extras)}",
                             prog=f"{self.prog} {command}" if command else self.prog)
        return args


def _flag_message(message):
    """argparse's ``argument --steps: is 0; ...`` as ``--steps is 0; ...`` and
    ``argument -o/--output: ...`` as ``--output: ...``."""
    m = re.fullmatch(r"argument (\S+): (.*)", message, flags=re.S)
    if m is None:
        return message
    flag = max(m.group(1).split("/"), key=len)
    rest = m.group(2)
    return f"{flag} {rest}" if rest.startswith("is ") else f"{flag}: {rest}"


def one_line(text):
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


# A library function's ValueError starts with the function's name ("load_tokenizer: ...");
# on the command line the message names flags and files, so such a name is dropped.
_FUNCTION_PREFIX = re.compile(r"(?:(?<=^)|(?<=: )|(?<=\())(?:[a-z][a-z0-9]*(?:_[a-z0-9]+)+|"
                              r"[A-Z][a-z][A-Za-z0-9]*(?:\.[a-z_]+)?)(?::| (?=\())\s*")


def user_message(text):
    """``text`` as one line, without the names of internal functions that head the
    messages of library errors (``train_loop: the loss is nan`` -> ``the loss is nan``)."""
    return _FUNCTION_PREFIX.sub("", one_line(text))


# ---------------------------------------------------------------------------------------
# Argument types: each returns the parsed value or raises ArgumentTypeError("is ...; expected
# ..."), which the parser reports as "--flag is ...; expected ...".
# ---------------------------------------------------------------------------------------

def _shown(text):
    return text if re.fullmatch(r"[-+0-9.eE]+|[-+]?(inf|nan)", text.strip(), re.I) else repr(text)


def _integer(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"is {_shown(text)}; expected an integer >= {low}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _real(positive):
    bound = "> 0" if positive else ">= 0"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise argparse.ArgumentTypeError(f"is {_shown(text)}; expected a finite number "
                                             f"{bound}")
        return value
    parse.__name__ = f"number {bound}"
    return parse


positive_int = _integer(1)
nonnegative_int = _integer(0)
positive_float = _real(True)
nonnegative_float = _real(False)


def checkpoint_path(text):
    """A checkpoint directory holding a readable ``checkpoint.json``, or that file."""
    path = os.path.expanduser(text)
    record = os.path.join(path, "checkpoint.json") if os.path.isdir(path) else path
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which does not exist; expected a "
                                         "checkpoint directory (or its checkpoint.json)")
    if not os.path.isfile(record):
        raise argparse.ArgumentTypeError(f"is {text!r}, which holds no checkpoint.json; expected "
                                         "a checkpoint directory (or its checkpoint.json)")
    readable(record, f"is {text!r}, but {record} is not readable")
    return path


def readable(path, message):
    """``path`` when this process may read it, else the argument error ``message``."""
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(message)
    return path


def _existing_ancestor(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def output_file(text):
    """A file to write (``--summary``, ``--json``): its directory must exist and be
    writable, and the path must not be a directory."""
    path = os.path.expanduser(text)
    folder = os.path.dirname(os.path.abspath(path))
    if not text or os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is a directory; expected a file "
                                         "name")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"is {text!r}, but the directory {folder} does not "
                                         "exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and
                                                    not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is not writable")
    return path


def output_dir(text):
    """A directory to write into (``--out``), created when needed; ``none`` = write
    nothing. It must not be a file, and its nearest existing ancestor must be a writable
    directory. Whether it already holds work is the command's to check (``--force``)."""
    if text in ("", "none"):
        return "none"
    path = os.path.expanduser(text)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"is {text!r}, which is a file; expected a directory")
    base = _existing_ancestor(path)
    if not os.path.isdir(base):
        raise argparse.ArgumentTypeError(f"is {text!r}, but {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"is {text!r}, but {base} is not writable")
    return path


# Modules of numpytfmr/run/commands/, in the order ``--help`` lists them. Each defines
# ``add_command(sub)``, which adds its sub-parser and sets ``func`` (a function of the
# parsed arguments returning the exit status). They import heavy modules lazily, and no
# command imports another: what they share is in run/options.py (flags), run/outputs.py
# (the run folder, the end of a run) and run/adapters.py (lora and dpo).
COMMANDS = ("check", "train", "pretrain", "tokenize", "generate", "export", "train_seq2seq", "lora",
            "dpo", "examples", "docs", "grade", "make_assignment", "bench")


TOP_EPILOG = """\
your own text, each command feeding the next (docs/learner.md):
  numpytfmr tokenize --text own.txt --tokenizer bpe --tokenizer-out own-bpe.json -o own.bin
  numpytfmr pretrain --tokens own.bin --minutes 2 --out runs/own
  numpytfmr lora --checkpoint runs/own --text more.txt --minutes 1 --out runs/own-lora
  numpytfmr lora --checkpoint runs/own --data rows.jsonl --out runs/own-rows
      (rows.jsonl: {"prompt": ..., "completion": ...} lines; the loss is on the completions)
  numpytfmr dpo --checkpoint runs/own-lora --data prefs.jsonl --minutes 1 --out runs/own-dpo
      (prefs.jsonl: {"prompt": ..., "chosen": ..., "rejected": ...} lines)
  numpytfmr generate --checkpoint runs/own-dpo --prompt "The " --max-new-tokens 200
  numpytfmr export --checkpoint runs/own-dpo -o hf/own
the built-in tasks: train (then generate --prompt 3142), train-seq2seq, and lora and dpo
without --text/--data (sort -> sort_desc, prefer ascending answers).
'numpytfmr COMMAND --help' lists a command's flags; docs/commands.md has them all.
"""


def build_parser():
    parser = Parser(
        prog="numpytfmr", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The transformer and its training math in plain NumPy: gradient-check "
        "every op,\ntrain small models on built-in tasks, or pretrain a GPT on your own text, "
        "tune it\non your own data and take it on to Hugging Face.",
        epilog=TOP_EPILOG)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    for name in COMMANDS:
        module = f"numpytfmr.run.commands.{name}"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module).add_command(sub)
    return parser


def _version():
    from numpytfmr import __version__
    return f"numpytfmr {__version__}"


def main(argv=None):
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _usage_error(exc.prog or parser.prog, exc)
    except SystemExit as exc:                     # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.command is None:
        parser.print_help()
        return 2
    prog = f"{parser.prog} {args.command}"
    try:
        return args.func(args)
    except ValueError as exc:  # a UsageError, or a library function refusing its input
        return _usage_error(prog, exc)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:     # a file that cannot be read or written
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return _usage_error(prog, f"{exc.strerror or exc}{where}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _usage_error(prog, exc):
    message = user_message(exc)
    command = prog.split(" ", 1)[-1]
    if message.startswith(f"{command}: "):       # a library error headed by the command's name
        message = message[len(command) + 2:]
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
