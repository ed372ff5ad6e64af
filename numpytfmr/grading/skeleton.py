"""``numpytfmr make-assignment``: a student skeleton, its notebook, a grading config, and the
Gradescope ``setup.sh``/``run_autograder`` pair.

Each function of the skeleton is the reference function's signature and docstring (equation,
shapes, section of the notes) with its body replaced by ``raise NotImplementedError``. When the
reference body has nbgrader-style markers, only the code between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` is replaced and the rest is kept as scaffolding; without markers the
whole body is the solution.
"""
import ast
import inspect
import json
import os
import secrets
import shutil
import textwrap

from ..run.fileio import atomic_write_text, write_json
from .cases import DEFAULTS, resolve
from .notebook import make_notebook

__all__ = ["BEGIN", "END", "function_skeleton", "make_assignment"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
_STUB = ("# YOUR CODE HERE", "raise NotImplementedError")


def function_skeleton(fn):
    """The source of ``fn`` with its solution replaced by ``raise NotImplementedError``."""
    src = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(src)
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"{getattr(fn, '__name__', fn)!r} is not a plain function")
    lines = src.splitlines()
    first = node.body[0]
    has_doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
    indent = " " * first.col_offset
    header_end = first.end_lineno if has_doc else first.lineno - 1
    header = lines[node.lineno - 1:header_end]
    body = lines[header_end:node.end_lineno]
    if any(BEGIN in line for line in body):
        out, inside = [], False
        for line in body:
            if BEGIN in line:
                inside = True
                pad = line[:len(line) - len(line.lstrip())]
                out += [pad + s for s in _STUB]
            elif END in line:
                inside = False
            elif not inside:
                out.append(line)
        if inside:
            raise ValueError(f"{fn.__name__}: {BEGIN} without {END}")
        body = out
    else:
        body = [indent + s for s in _STUB]
    return "\n".join(header + body) + "\n"


def _functions(item):
    if item.kind == "op":
        return [item.spec.forward, item.spec.backward]
    return [item.spec.reference]


_INTRO = """Implement each function below with NumPy only: importing numpytfmr (the reference) or torch
is refused by the grader. Each docstring gives the equation, the shapes and the section of
the notes it comes from. A forward returns (out, cache); its backward takes (dout, cache) and
returns one gradient per positional input of the forward, in order, as a tuple (bare when the
forward has one input), with None for inputs that take no gradient. float32 inputs give
float32 results; inputs are never modified in place.

Check your work with:   numpytfmr grade {filename}"""

_HEADER = '''"""{title}

{intro}
"""
import math

import numpy as np
'''


def make_assignment(names, out_dir, *, name="homework", seed=0, hidden_seed=None, weights=None,
                    timeout=DEFAULTS["timeout"], memory_mb=DEFAULTS["memory_mb"]):
    """Write the assignment for ``names`` into ``out_dir``; return the paths written.

    out_dir/{name}.py, out_dir/{name}.ipynb      the student skeleton (script and notebook)
    out_dir/autograder/grading.json              weights, cases, seeds (the hidden seed is secret)
    out_dir/autograder/setup.sh, run_autograder  Gradescope's pair, plus a copy of numpytfmr
    """
    if not names:
        raise ValueError("make-assignment: no names given; expected ops (softmax, attention, ...) "
                         "or functions (causal_mask, ...)")
    if not name.isidentifier():
        raise ValueError(f"make-assignment: the name {name!r} must be a Python identifier")
    weights = dict(weights or {})
    items, seen = [], set()
    for n in names:
        item = resolve(n)
        if item.name not in seen:
            seen.add(item.name)
            items.append(item)
    unknown = set(weights) - {i.name for i in items}
    if unknown:
        raise ValueError(f"make-assignment: weights given for {', '.join(sorted(unknown))}, which "
                         "are not in the assignment")
    if hidden_seed is None:
        hidden_seed = secrets.randbelow(2 ** 31)

    filename = f"{name}.py"
    title = f"Assignment: {', '.join(i.name for i in items)}."
    blocks = [(item, [function_skeleton(fn) for fn in _functions(item)]) for item in items]
    script = _HEADER.format(title=title, intro=_INTRO.format(filename=filename))
    for item, sources in blocks:
        script += "\n\n" + "\n\n".join(sources)
    compile(script, filename, "exec")       # the skeleton must at least be valid Python

    cells = [("markdown", f"# {title}\n\n" + _INTRO.format(filename=f"{name}.ipynb"), None),
             ("code", "import math\n\nimport numpy as np\n", None)]
    for item, sources in blocks:
        cells.append(("markdown", f"## {item.name}", None))
        cells.append(("code", "\n\n".join(sources),
                      {"grade": False, "solution": True, "locked": False, "grade_id": item.name}))
    notebook = make_notebook(cells)

    config = {"assignment": name, "seed": int(seed), "hidden_seed": int(hidden_seed),
              "timeout": timeout, "memory_mb": memory_mb, "float32_case": True,
              "functions": [{"name": i.name, "weight": float(weights.get(i.name, DEFAULTS["weight"])),
                             "cases": "all"} for i in items]}

    os.makedirs(out_dir, exist_ok=True)
    auto = os.path.join(out_dir, "autograder")
    os.makedirs(auto, exist_ok=True)
    paths = {"skeleton": os.path.join(out_dir, filename),
             "notebook": os.path.join(out_dir, f"{name}.ipynb"),
             "config": os.path.join(auto, "grading.json"),
             "setup": os.path.join(auto, "setup.sh"),
             "run": os.path.join(auto, "run_autograder")}
    atomic_write_text(paths["skeleton"], script)
    atomic_write_text(paths["notebook"], json.dumps(notebook, indent=1) + "\n")
    write_json(paths["config"], config)
    atomic_write_text(paths["setup"], _SETUP)
    atomic_write_text(paths["run"], _RUN.format(name=name))
    for key in ("skeleton", "notebook", "config"):
        os.chmod(paths[key], 0o644)     # atomic writes create 0600 files
    for key in ("setup", "run"):
        os.chmod(paths[key], 0o755)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.path.join(auto, "numpytfmr")
    if os.path.isdir(target):
        shutil.rmtree(target)
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    paths["package"] = target
    return paths


_SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder image.
set -euo pipefail
if ! command -v python3 > /dev/null; then
    apt-get update -qq && apt-get install -y -qq python3 python3-pip
fi
python3 -m pip install --quiet "numpy>=1.23" \\
    || python3 -m pip install --quiet --break-system-packages "numpy>=1.23"
"""

_RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission. The grader runs the student's code in a
# separate, limited process and writes /autograder/results/results.json itself (atomically,
# after the student's code has finished, so a file forged by the submission is replaced).
cd /autograder/source
export PYTHONPATH=/autograder/source
mkdir -p /autograder/results
rm -f /autograder/results/results.json
python3 -m numpytfmr grade /autograder/submission --config /autograder/source/grading.json \\
    --json /autograder/results/results.json
status=$?
# 0: all passed, 1: some failed; anything else is a grader error, whose results are not trusted
if [ "$status" -gt 1 ] || [ ! -s /autograder/results/results.json ]; then
    echo '{{"score": 0, "output": "The grader failed (status '"$status"'); please contact the staff."}}' \\
        > /autograder/results/results.json
fi
exit 0
"""
