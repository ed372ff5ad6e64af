"""The default corpus of ``numpytfmr pretrain``: English text found offline on every machine
that has Python, the docstrings of the installed standard library.

The ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` are parsed with ``ast`` (never
imported) at run time, test suites and third-party packages skipped; their docstrings, in
a fixed order and deduplicated, are a fixed function of the Python installation
(docs/learner.md, "Pretraining on real text").
"""
import ast
import os
import sysconfig
import warnings

__all__ = ["DEFAULT_CORPUS_BYTES", "stdlib_docstrings", "default_corpus", "split_text"]

DEFAULT_CORPUS_BYTES = 3_000_000      # about 3 MB of UTF-8 text

# Folders (any depth) whose files are not the standard library's own prose.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
              "_bundled"}
# Docstrings shorter than this (characters) are mostly "Return self." and the like.
_MIN_CHARS = 40


def _python_files(root):
    """Every ``.py`` file under ``root`` outside the skipped folders, sorted by relative path."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        found += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return sorted(found, key=lambda p: os.path.relpath(p, root).replace(os.sep, "/"))


def _docstrings(source):
    """The docstrings of a module's source: the module's, then its classes' and functions'
    (nested ones too) in source order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # invalid escape sequences in old files
        tree = ast.parse(source)
    nodes = [tree] + sorted(
        (n for n in ast.walk(tree)
         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
        key=lambda n: (n.lineno, n.col_offset))
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield doc


def stdlib_docstrings(root=None):
    """Yield the distinct docstrings of the standard library at ``root`` (default: the
    running Python's, ``sysconfig.get_paths()["stdlib"]``), in a fixed order."""
    root = sysconfig.get_paths()["stdlib"] if root is None else os.fspath(root)
    seen = set()
    for path in _python_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            docs = list(_docstrings(source))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue                               # unreadable or not this Python's syntax
        for doc in docs:
            if len(doc) >= _MIN_CHARS and doc not in seen:
                seen.add(doc)
                yield doc


def default_corpus(max_bytes=DEFAULT_CORPUS_BYTES, *, root=None):
    """The default training text: standard-library docstrings separated by blank lines,
    whole docstrings only, at most ``max_bytes`` bytes of UTF-8 (module docstring).

    Raises ``ValueError`` if no docstring is found (a Python installed without its
    ``.py`` sources), saying to pass a text file instead.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"default_corpus: max_bytes is {max_bytes!r}; expected an integer >= 1")
    parts, size = [], 0
    for doc in stdlib_docstrings(root):
        n = len(doc.encode("utf-8")) + 2           # the docstring and its blank line
        if size + n > max_bytes:
            break
        parts.append(doc)
        size += n
    if not parts:
        where = root if root is not None else sysconfig.get_paths()["stdlib"]
        raise ValueError(f"default_corpus: found no docstrings under {where!r} (the standard "
                         "library's .py sources are missing); pass a text file with --text FILE")
    return "\n\n".join(parts) + "\n"


def split_text(text, val_fraction=0.1):
    """``(train, val)``: ``val`` is the last ``val_fraction`` of ``text``, cut at a line
    start when there is one near the cut (so no word is split between the two)."""
    if not isinstance(text, str):
        raise TypeError(f"split_text: text is a {type(text).__name__}; expected a str")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"split_text: val_fraction is {val_fraction!r}; expected a number in "
                         "(0, 1)")
    cut = int(len(text) * (1.0 - val_fraction))
    line = text.find("\n", cut)
    if 0 <= line < len(text) - 1 and line - cut < 10_000:
        cut = line + 1
    train, val = text[:cut], text[cut:]
    if not train or not val:
        raise ValueError(f"split_text: the text has {len(text)} characters, too few to hold "
                         "out a part; expected a longer text or --val-text FILE")
    return train, val
