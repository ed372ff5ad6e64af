#!/usr/bin/env python3
"""Reading figures: how long the reference ops are, and how much of them is plumbing.

    python .ci/reading_figures.py                     # this checkout
    python .ci/reading_figures.py --json              # the same figures as JSON
    python .ci/reading_figures.py --ops               # plus one row per op (and more detail)
    python .ci/reading_figures.py --root /tmp/before  # another checkout (or its package dir)
    python .ci/reading_figures.py --root /tmp/before --compare . --labels before,after

What is measured
----------------
ops
    Every public function named ``*_forward`` or ``*_backward`` defined at the top level
    of a module directly in the package directory (``numpytfmr/*.py``; subpackages such
    as ``fast/``, ``run/``, ``grading/`` and ``registry/`` are not the reference).
body lines
    The physical lines of the function body that hold code: the decorator and ``def``
    lines, the docstring, comment-only lines and blank lines are not counted; a statement
    spread over three lines counts three.
plumbing lines
    Body lines that are not the math: a ``raise``, a ``where = ...`` message prefix,
    a validation or conversion call (``_validate``, ``_check...``, ``check_...``,
    ``float_array``, ``int_array``, ``positive_int``, ``number(``, ``..._arg(``,
    ``v.<name>(``), or dtype handling (``astype(``, ``dtype``, ``dtypes``,
    ``result_dtype``).
medians
    The upper median (the middle value, or the larger of the two middle values).
private cross-module imports
    Import statements of another module's private names (``from .x import _y``, also
    written ``from numpytfmr.x import _y``), anywhere in the package, subpackages
    included, wherever the statement sits (a function body too); and, counted apart,
    imports of a private module (``from . import _validate``, ``from ._validate import
    f``, ``import numpytfmr._validate``).

The functions below are also used by ``tests/test_layout.py``.
"""
import argparse
import ast
import io
import json
import os
import re
import sys
import tokenize

PACKAGE = "numpytfmr"

# What makes a body line plumbing, by kind (a line counts once however many kinds it matches).
PLUMBING_PATTERNS = {
    "raise": r"\braise\b",
    "message prefix": r"^\s*where\s*=",
    "validation": r"_validate|_check|check_|float_array|int_array|positive_int|number\(|_arg\(|\bv\.\w+\(",
    "dtype": r"astype\(|\bdtype|dtypes|result_dtype",
}
PLUMBING = re.compile("|".join(f"(?:{p})" for p in PLUMBING_PATTERNS.values()))

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
             tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}


# ---------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------

def code_line_numbers(source):
    """The set of line numbers (1-based) of ``source`` on which some code token sits.

    A token spanning several lines (a triple-quoted string) marks all of them; comments
    and blank lines mark none.
    """
    rows = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            rows.update(range(tok.start[0], tok.end[0] + 1))
    return rows


def _docstring_rows(func):
    first = func.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return set(range(first.lineno, first.end_lineno + 1))
    return set()


def body_lines(source, func, code_rows=None):
    """The code lines (text) of ``func``'s body: no docstring, comments or blank lines."""
    if code_rows is None:
        code_rows = code_line_numbers(source)
    text = source.splitlines()
    skip = _docstring_rows(func)
    return [text[row - 1] for row in range(func.body[0].lineno, func.end_lineno + 1)
            if row in code_rows and row not in skip]


def is_plumbing(line):
    """True for a body line that checks, converts or raises rather than computes."""
    return PLUMBING.search(line) is not None


def is_op_name(name):
    return not name.startswith("_") and (name.endswith("_forward") or name.endswith("_backward"))


def package_dir(root):
    """The package directory for ``root``: a checkout (holding ``numpytfmr/``) or the package itself."""
    inner = os.path.join(root, PACKAGE)
    if os.path.isfile(os.path.join(inner, "__init__.py")):
        return inner
    if os.path.isfile(os.path.join(root, "__init__.py")):
        return root
    raise SystemExit(f"reading_figures: no {PACKAGE} package in {root!r} "
                     f"(expected {inner}/__init__.py)")


def topic_modules(pkg):
    """Paths of the modules directly in the package directory, sorted (subpackages excluded)."""
    return sorted(os.path.join(pkg, f) for f in os.listdir(pkg)
                  if f.endswith(".py") and os.path.isfile(os.path.join(pkg, f)))


def measure_ops(pkg):
    """One record per public top-level ``*_forward``/``*_backward`` of ``pkg/*.py``:
    ``{"op": "module.py:name", "kind": "forward"|"backward", "lines": n, "plumbing": m}``."""
    ops = []
    for path in topic_modules(pkg):
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
        rows = code_line_numbers(source)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_op_name(node.name):
                lines = body_lines(source, node, rows)
                ops.append({"op": f"{os.path.basename(path)}:{node.name}",
                            "kind": "forward" if node.name.endswith("_forward") else "backward",
                            "lines": len(lines),
                            "plumbing": sum(map(is_plumbing, lines))})
    return ops


# ---------------------------------------------------------------------------------------
# Private imports
# ---------------------------------------------------------------------------------------

def module_name(pkg, path):
    """The dotted name of the module at ``path`` (``numpytfmr.run.cli``)."""
    rel = os.path.relpath(path, pkg)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join([PACKAGE] + rel)


def source_module(importer, is_package, node):
    """The absolute module an ``ImportFrom`` node reads from, or None if outside the package."""
    if node.level == 0:
        mod = node.module or ""
        return mod if mod == PACKAGE or mod.startswith(PACKAGE + ".") else None
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def is_private(name):
    """``_x`` is private; ``__x__`` (``__all__``, ``__version__``) is not."""
    return name.startswith("_") and not name.startswith("__")


def module_path(pkg, module):
    """The file or directory of the package module ``module`` (absolute dotted name), or None."""
    base = os.path.join(pkg, *module.split(".")[1:])
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def private_imports(pkg):
    """Every import, anywhere in the package, of something private to another module, as
    ``{"module": importer, "line": n, "source": "numpytfmr.y", "names": [...], "kind": kind}``.

    kind ``"name"``: private names of another module (``from .attention import _T``);
    kind ``"module"``: a private module (``from . import _validate``, ``from ._validate import
    x``, ``import numpytfmr._validate``).
    """
    found = []
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fname in sorted(filenames):
            if not fname.endswith(".py"):
                continue
            path = os.path.join(dirpath, fname)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=path)
            importer = module_name(pkg, path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        parts = alias.name.split(".")
                        if parts[0] == PACKAGE and any(map(is_private, parts[1:])):
                            found.append({"module": importer, "line": node.lineno, "kind": "module",
                                          "source": alias.name, "names": [alias.name]})
                    continue
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = source_module(importer, fname == "__init__.py", node)
                if source is None or source == importer:
                    continue
                if any(map(is_private, source.split(".")[1:])):
                    found.append({"module": importer, "line": node.lineno, "kind": "module",
                                  "source": source, "names": [a.name for a in node.names]})
                    continue
                names = [a.name for a in node.names if is_private(a.name)]
                submodules = [n for n in names if module_path(pkg, f"{source}.{n}")]
                others = [n for n in names if n not in submodules]
                if submodules:
                    found.append({"module": importer, "line": node.lineno, "kind": "module",
                                  "source": source, "names": submodules})
                if others:
                    found.append({"module": importer, "line": node.lineno, "kind": "name",
                                  "source": source, "names": others})
    return found


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------

def upper_median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0


def _describe(p):
    return f"{p['module']} (line {p['line']}) <- {p['source']}: {', '.join(p['names'])}"


def figures(root):
    """The reading figures of the checkout (or package directory) ``root``, as a dict."""
    pkg = package_dir(root)
    ops = measure_ops(pkg)
    fw = [o for o in ops if o["kind"] == "forward"]
    bw = [o for o in ops if o["kind"] == "backward"]
    longest = max(fw, key=lambda o: o["lines"], default=None)
    total = sum(o["lines"] for o in ops)
    plumbing = sum(o["plumbing"] for o in ops)
    private = private_imports(pkg)
    return {
        "package": os.path.abspath(pkg),
        "n_ops": len(ops),
        "n_forward": len(fw),
        "n_backward": len(bw),
        "median_forward_lines": upper_median(o["lines"] for o in fw),
        "median_backward_lines": upper_median(o["lines"] for o in bw),
        "max_forward_lines": longest["lines"] if longest else 0,
        "longest_forward": longest["op"] if longest else None,
        "body_lines": total,
        "plumbing_lines": plumbing,
        "plumbing_fraction": round(plumbing / total, 3) if total else 0.0,
        "n_private_cross_imports": sum(p["kind"] == "name" for p in private),
        "n_private_names_imported": sum(len(p["names"]) for p in private if p["kind"] == "name"),
        "n_private_module_imports": sum(p["kind"] == "module" for p in private),
        "private_cross_imports": [_describe(p) for p in private if p["kind"] == "name"],
        "private_module_imports": [_describe(p) for p in private if p["kind"] == "module"],
        "ops": ops,
    }


ROWS = [
    ("ops (public *_forward / *_backward)", lambda f: str(f["n_ops"])),
    ("median forward body, code lines", lambda f: str(f["median_forward_lines"])),
    ("median backward body, code lines", lambda f: str(f["median_backward_lines"])),
    ("longest forward, code lines", lambda f: f"{f['max_forward_lines']} ({f['longest_forward']})"),
    ("plumbing share of body lines", lambda f: f"{100 * f['plumbing_fraction']:.1f} % "
                                               f"({f['plumbing_lines']}/{f['body_lines']})"),
    ("private cross-module imports", lambda f: f"{f['n_private_cross_imports']} "
                                               f"({f['n_private_names_imported']} names)"),
    ("imports of private modules", lambda f: str(f["n_private_module_imports"])),
]


def table(columns):
    """``columns``: a list of (heading, figures). A plain-text table, one row per figure."""
    width = max(len(label) for label, _ in ROWS)
    cells = [[fmt(f) for _, fmt in ROWS] for _, f in columns]
    widths = [max(len(h), *(len(c) for c in col)) for (h, _), col in zip(columns, cells)]
    out = [" " * width + "  " + "  ".join(h.ljust(w) for (h, _), w in zip(columns, widths))]
    for i, (label, _) in enumerate(ROWS):
        out.append(label.ljust(width) + "  " + "  ".join(col[i].ljust(w) for col, w in zip(cells, widths)))
    return "\n".join(line.rstrip() for line in out)


def op_rows(f):
    out = [f"{'op':<52} {'lines':>5} {'plumbing':>8}"]
    for o in f["ops"]:
        out.append(f"{o['op']:<52} {o['lines']:>5} {o['plumbing']:>8}")
    return "\n".join(out)


def main(argv=None):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=here,
                        help="the checkout to measure (or its package directory); default: this one")
    parser.add_argument("--compare", metavar="ROOT",
                        help="a second checkout, shown in a second column (e.g. --root the old one "
                             "--compare the new one)")
    parser.add_argument("--labels", metavar="A[,B]",
                        help="column headings instead of the paths, e.g. --labels before,after")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--ops", action="store_true",
                        help="also list every op with its line counts, and the imports of private modules")
    args = parser.parse_args(argv)

    roots = [args.root] + ([args.compare] if args.compare else [])
    labels = args.labels.split(",") if args.labels else roots
    if len(labels) != len(roots):
        parser.error(f"--labels gives {len(labels)} heading(s) for {len(roots)} column(s)")
    columns = [(label, figures(root)) for label, root in zip(labels, roots)]
    if args.json:
        out = [f if args.ops else {k: v for k, v in f.items() if k != "ops"} for _, f in columns]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
        return 0
    print(table(columns))
    for heading, f in columns:
        if f["private_cross_imports"]:
            print(f"\nprivate cross-module imports in {heading}:")
            print("\n".join("  " + p for p in f["private_cross_imports"]))
        if args.ops and f["private_module_imports"]:
            print(f"\nimports of private modules in {heading}:")
            print("\n".join("  " + p for p in f["private_module_imports"]))
        if args.ops:
            print(f"\nops in {heading}:\n{op_rows(f)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
