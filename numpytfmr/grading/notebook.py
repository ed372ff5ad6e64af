"""Submissions as code: a .py file, or the code cells of a Jupyter notebook.

A notebook becomes one chunk per code cell (``homework.ipynb [cell 4]`` in tracebacks), with
IPython shell and magic lines (``!pip ...``, ``%timeit ...``, ``x = !ls``) replaced by ``pass``
and cell magics (``%%bash``) dropped. The submission process runs the cells in order; a cell
that raises is reported and the next cells still run, as in a notebook.
"""
import json
import os
import stat

from .selfcheck import cell_code

__all__ = ["SubmissionError", "find_submission", "choose_submission", "read_submission",
           "notebook_to_chunks", "make_notebook", "imported_modules", "import_problems",
           "candidate_files", "linked_entries", "read_file"]


class SubmissionError(ValueError):
    """The submission cannot be read (missing file, unknown type, broken notebook)."""


_MAX_DEPTH = 4                 # folders below the submission's that are searched
_MAX_CANDIDATES = 50
_IGNORED_DIRS = {"__pycache__", "__MACOSX", ".ipynb_checkpoints", ".git", "node_modules",
                 ".venv", "venv", "site-packages"}


LINK_RULE = ("links in a submission are never followed: the file it points to is not graded; "
             "hand in the file itself")


def _scan(folder):
    """(the .py/.ipynb regular files, the symbolic links) in ``folder`` and its subfolders, as
    paths relative to it, shallowest first. Hidden and tool folders are left out; no link is
    followed, at any depth (entries are examined with lstat, folders entered by name only
    when they are real folders)."""
    found, links = [], []
    todo = [("", 0)]
    while todo and len(found) <= _MAX_CANDIDATES:
        rel, depth = todo.pop(0)
        try:
            with os.scandir(os.path.join(folder, rel) if rel else folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = os.path.join(rel, entry.name) if rel else entry.name
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                links.append(name)
            elif entry.is_dir(follow_symlinks=False):
                if entry.name not in _IGNORED_DIRS and depth < _MAX_DEPTH:
                    todo.append((name, depth + 1))
            elif entry.is_file(follow_symlinks=False) and entry.name.endswith((".py", ".ipynb")) \
                    and not entry.name.startswith("._"):
                found.append(name)
    order = sorted(found, key=lambda r: (r.count(os.sep), r))[:_MAX_CANDIDATES]
    return order, sorted(links, key=lambda r: (r.count(os.sep), r))[:_MAX_CANDIDATES]


def candidate_files(folder):
    """The .py/.ipynb regular files in ``folder`` and its subfolders (hidden and tool folders
    left out, no symbolic link followed or listed), as paths relative to it, shallowest first."""
    return _scan(folder)[0]


def linked_entries(folder):
    """The symbolic links in ``folder`` and its subfolders (relative paths): never followed."""
    return _scan(folder)[1]


def _link_error(path):
    return SubmissionError(f"{os.path.basename(os.path.normpath(path))} is a symbolic link, so it "
                           f"was not read ({LINK_RULE})")


def read_file(path, limit=8 << 20):
    """The first ``limit`` bytes of the regular file at ``path``, opened without following a
    link (O_NOFOLLOW) and without blocking on a pipe; SubmissionError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise _link_error(path) from None
        raise SubmissionError(f"cannot read {path!r}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmissionError(f"{os.path.basename(path)} is not a regular file")
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _defined_functions(path):
    """(names defined at top level, names whose body is more than ``raise NotImplementedError``)."""
    import ast
    try:
        chunks = read_submission(path)
    except SubmissionError:
        return set(), set()
    defined, implemented = set(), set()
    for chunk in chunks:
        try:
            tree = ast.parse(chunk["source"])
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
                body = [n for n in node.body if not (isinstance(n, ast.Expr)
                                                     and isinstance(n.value, ast.Constant))]
                stub = len(body) == 1 and isinstance(body[0], ast.Raise) and \
                    "NotImplementedError" in ast.unparse(body[0])
                if body and not stub:
                    implemented.add(node.name)
    return defined, implemented


def choose_submission(path, name=None, *, submission=None, functions=None):
    """``(file, note)``: the file to grade at ``path``, and a sentence saying which file was
    chosen and why ("" when there was no choice to make).

    ``path`` is a file (graded as it is) or a folder, searched with its subfolders (a nested
    ``hw1/homework.py`` is found). Among several .py/.ipynb files the winner is, in order:
    the file the config names (``submission``, e.g. "homework.ipynb"); the one defining the
    most of the assignment's ``functions`` with a body (not just ``raise NotImplementedError``),
    then the most defined; then the one named after the assignment (``{name}.py`` /
    ``{name}.ipynb``); then a .py over a notebook, and the shallower, alphabetically first
    file. SubmissionError when there is no candidate.
    """
    path = os.fspath(path)
    if os.path.islink(path):
        raise _link_error(path)
    if os.path.isfile(path):
        return path, ""
    if not os.path.isdir(path):
        raise SubmissionError(f"submission {path!r} not found")
    found, links = _scan(path)
    linked = (f"; not followed: {', '.join(links[:5])}{' ...' if len(links) > 5 else ''} "
              f"(symbolic links; {LINK_RULE})") if links else ""
    if not found and links:
        some = ", ".join(links[:5]) + (" ..." if len(links) > 5 else "")
        verb = "is a symbolic link" if len(links) == 1 else "are symbolic links"
        raise SubmissionError(f"{some} {verb}, so not read ({LINK_RULE}); and the submission has "
                              f"no other .py or .ipynb file ({path!r})")
    if not found:
        raise SubmissionError(f"no .py or .ipynb file in {path!r} (nor in its subfolders)")
    if len(found) == 1:
        nested = os.sep in found[0]
        note = (f"graded {found[0]}, the only .py or .ipynb file of the submission"
                if nested or links else "")
        return os.path.join(path, found[0]), note + linked
    if submission:
        named = [r for r in found if os.path.basename(r) == submission]
        if named:
            chosen = named[0]
            others = [r for r in found if r != chosen]
            return os.path.join(path, chosen), (
                f"graded {chosen}, the file the assignment names ({submission}); not graded: "
                f"{', '.join(others)}{linked}")
    if functions is None:
        from .cases import contract_names
        functions = set(contract_names())
    functions = set(functions)

    def rank(rel):
        defined, implemented = _defined_functions(os.path.join(path, rel))
        base = os.path.basename(rel)
        return (len(implemented & functions), len(defined & functions),
                bool(name) and base in (f"{name}.py", f"{name}.ipynb"), base.endswith(".py"))
    ranks = {r: rank(r) for r in found}
    order = sorted(found, key=lambda r: tuple(-int(x) for x in ranks[r]) + (r.count(os.sep), r))
    chosen, runner = order[0], order[1]
    n_impl, n_def, by_name, is_py = ranks[chosen]
    if ranks[chosen][:2] != ranks[runner][:2]:
        why = (f"it defines {n_impl} of the assignment's functions"
               + (f" ({n_def} counting stubs)" if n_def != n_impl else "")
               + f", {runner} {ranks[runner][0]}")
    elif by_name and not ranks[runner][2]:
        why = f"both define the same functions, and {os.path.basename(chosen)} has the assignment's name"
    elif is_py and not ranks[runner][3]:
        why = "both define the same functions: a .py file wins over a notebook"
    else:
        why = "they define the same functions: the first by name"
    others = [r for r in order[1:]]
    return os.path.join(path, chosen), (f"graded {chosen} of {len(found)} files ({why}); not "
                                        f"graded: {', '.join(others)}{linked}")


def find_submission(path, name=None):
    """The file to grade: ``path`` itself, or the one :func:`choose_submission` picks in a
    folder (the file named after the assignment, or the one defining the most functions)."""
    return choose_submission(path, name)[0]


def imported_modules(path):
    """Top-level modules the file at ``path`` imports (read from its source, never run)."""
    import ast
    try:
        chunks = read_submission(path)
    except SubmissionError:
        return set()
    mods = set()
    for chunk in chunks:
        try:
            tree = ast.parse(chunk["source"])
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods.update(a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.partition(".")[0])
    return mods


def import_problems(path, allowed=()):
    """Sentences for the modules a submission imports that the assignment does not allow: the
    rule is NumPy, the standard library and the modules the instructor allows (``grade
    --allow-module``, ``"allow_modules"`` in grading.json)."""
    import sys
    ok = set(sys.stdlib_module_names) | {"numpy", "__future__"} | set(allowed)
    own = {os.path.splitext(f)[0] for f in os.listdir(os.path.dirname(os.path.abspath(path)) or ".")}
    bad = sorted(m for m in imported_modules(path) if m not in ok and m not in own)
    rule = ("a submission may import NumPy and the standard library"
            + (f", and the modules this assignment allows ({', '.join(sorted(allowed))})"
               if allowed else "") + "; the instructor can allow more (grade --allow-module NAME, or "
            "\"allow_modules\" in grading.json)")
    return [f"{os.path.basename(path)} imports {m}, which this assignment does "
            f"not allow: {rule}" for m in bad]


def read_submission(path):
    """The chunks of code to run for the file at ``path`` (a .py file or a notebook)."""
    path = os.fspath(path)
    base = os.path.basename(path)
    text = read_file(path).decode("utf-8", errors="replace")
    if path.endswith(".ipynb"):
        return notebook_to_chunks(text, base)
    if path.endswith(".py"):
        return [{"filename": base, "source": text, "continue_on_error": False}]
    raise SubmissionError(f"{base}: expected a .py file or a .ipynb notebook")


def notebook_to_chunks(text, name="notebook.ipynb"):
    """The code cells of a notebook (JSON text) as chunks, one per cell."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"{name}: not a valid notebook (JSON error: {exc.msg} at line "
                              f"{exc.lineno})") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        # nbformat 3 kept cells under worksheets
        sheets = nb.get("worksheets") if isinstance(nb, dict) else None
        cells = [c for ws in sheets or [] for c in ws.get("cells", [])] if isinstance(sheets, list) else None
    if cells is None:
        raise SubmissionError(f"{name}: not a notebook (no cells)")
    chunks = []
    for k, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", cell.get("input", ""))
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str):
            continue
        code = cell_code(src)
        if code is None or not code.strip():
            continue
        chunks.append({"filename": f"{name} [cell {k}]", "source": code, "continue_on_error": True})
    if not chunks:
        raise SubmissionError(f"{name}: the notebook has no code cells")
    return chunks


def make_notebook(cells):
    """An nbformat-4 notebook (a dict) from ``(cell_type, source, nbgrader_or_None)`` triples.

    ``nbgrader`` metadata (``{"grade_id": ..., "solution": True, ...}``) marks the cells
    students answer in, as nbgrader's assignment notebooks do.
    """
    nb_cells = []
    for k, (cell_type, source, nbgrader) in enumerate(cells, start=1):
        lines = source.splitlines(True)
        cell = {"cell_type": cell_type, "id": f"cell-{k}", "metadata": {}, "source": lines}
        if nbgrader:
            cell["metadata"]["nbgrader"] = dict(nbgrader, schema_version=3)
        if cell_type == "code":
            cell["execution_count"] = None
            cell["outputs"] = []
        nb_cells.append(cell)
    return {"cells": nb_cells,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}
