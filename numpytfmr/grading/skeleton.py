"""``numpytfmr make-assignment``: the folder handed to students (a skeleton, its notebook and
the self-check ``check.py`` with its judge ``judge.py`` and the visible cases' data), a grading
config, and the Gradescope ``setup.sh``/``run_autograder`` pair, also bundled as
``autograder.zip``. ``check.py`` is :mod:`.selfcheck` and ``judge.py`` is :mod:`.judge`, the
grader's own judge, both copied byte for byte.

Each function of the skeleton is the reference function's signature with a student docstring
(:mod:`.contracts`: what is required and graded, what is only suggested, what the student may
use) and its body replaced by ``raise NotImplementedError``. The skeleton carries no
decorators and imports only ``math`` and ``numpy``. When the reference body has
nbgrader-style markers, only the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
is replaced and the rest is kept as scaffolding; without markers the whole body is the
solution.

Options an instructor drops (``drop={"lora_linear": ["dropout"]}``, ``--drop
lora_linear:dropout``) vanish from the signatures and docstrings, and the grading config
records them so that the cases using them are skipped.
"""
import ast
import inspect
import io
import json
import os
import secrets
import shutil
import textwrap
import zipfile
import zlib

import numpy as np

from ..registry import bind
from ..shared.fileio import atomic_write_bytes, atomic_write_text, write_json
from .cases import DEFAULTS, input_names, load_config, make_graded_cases, resolve
from .compare import numeric_options
from .contracts import backward_doc, forward_doc, helper_doc
from .judge import drop_probability
from .notebook import make_notebook

__all__ = ["BEGIN", "END", "function_skeleton", "make_assignment", "skeleton_source"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
_STUB = ("# YOUR CODE HERE", "raise NotImplementedError")
_MAX_LINE = 99


def _without_params(args, dropped):
    """A copy of an ``ast.arguments`` without the parameters named in ``dropped``."""
    pos = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    keep = [(a, d) for a, d in zip(pos, defaults) if a.arg not in dropped]
    n_only = len([a for a in args.posonlyargs if a.arg not in dropped])
    kw = [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if a.arg not in dropped]
    first_default = next((i for i, (_, d) in enumerate(keep) if d is not None), len(keep))
    return ast.arguments(posonlyargs=[a for a, _ in keep[:n_only]],
                         args=[a for a, _ in keep[n_only:]],
                         vararg=args.vararg, kwonlyargs=[a for a, _ in kw],
                         kw_defaults=[d for _, d in kw], kwarg=args.kwarg,
                         defaults=[d for _, d in keep[first_default:]])


def _def_line(name, args):
    """``def name(args):``, wrapped at commas when longer than the line limit."""
    text = ast.unparse(args)
    line = f"def {name}({text}):"
    if len(line) <= _MAX_LINE:
        return [line]
    pad = " " * (len(name) + 5)
    out, current = [], f"def {name}("
    for k, part in enumerate(text.split(", ")):
        piece = part + (", " if k < len(text.split(", ")) - 1 else "):")
        started = current.strip() not in ("", f"def {name}(")
        if len(current + piece.rstrip()) > _MAX_LINE and started:
            out.append(current.rstrip())
            current = pad
        current += piece
    out.append(current)
    return out


def _docstring_lines(doc, indent):
    doc = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = doc.splitlines()
    body = [indent + '"""' + lines[0]]
    body += [(indent + line) if line.strip() else "" for line in lines[1:]]
    body.append(indent + '"""')
    return body


def function_skeleton(fn, doc=None, dropped=()):
    """The source of ``fn`` with its solution replaced by ``raise NotImplementedError``.

    doc:     the docstring to give it (default: the reference's own)
    dropped: parameters left out of the signature

    The result has no decorators and, without ``doc``, the reference's docstring verbatim.
    """
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
    if doc is None and not dropped:
        header = lines[node.lineno - 1:header_end]
    else:
        header = _def_line(node.name, _without_params(node.args, set(dropped)))
        text = doc
        if text is None and has_doc:
            text = ast.get_docstring(node, clean=True)
        if text:
            header += _docstring_lines(text, indent)
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


def skeleton_source(item):
    """The skeleton functions of one item (an op's forward and backward, or a helper)."""
    dropped = tuple(item.drop)
    if item.kind == "op":
        fwd, bwd = item.spec.forward, item.spec.backward
        return [function_skeleton(fwd, forward_doc(item.name, fwd, bwd.__name__, dropped), dropped),
                function_skeleton(bwd, backward_doc(item.name, fwd, bwd, dropped))]
    fn = item.spec.reference
    return [function_skeleton(fn, helper_doc(item.name, fn, dropped), dropped)]


_INTRO = """Implement each function below with NumPy (np) and the math module only: the grader
refuses imports of the reference (numpytfmr) and of autodiff libraries. You may define helper
functions of your own, and call one function of this file from another.

Each docstring is the contract of its function:
- "Required (graded)" lists what the grader passes and what must come back: the values, their
  shapes and dtypes, and the order of the gradients. They are compared with the reference on
  visible and hidden cases, the edge cases the docstring names included.
- "Suggested (not graded)" is advice: the cache, for one, may hold anything you like.
A forward returns (out, cache); its backward takes (dout, cache) and returns one gradient per
positional input of the forward, in order, as a tuple (bare when the forward has one input),
with None for inputs that take no gradient. float32 inputs give float32 results; inputs are
never modified in place. The inputs are always valid: you need not check them.

Check your work on the visible cases with:   python check.py {filename}
(check.py needs only Python and NumPy; the grader adds hidden cases.)"""

_HEADER = '''"""{title}

{intro}
"""
import math

import numpy as np
'''


# --- the student's self-check: visible cases and their expected results ---------------------------

def _encode(value, arrays, key):
    """A case's value as JSON, its arrays stored in ``arrays`` under keys built from ``key``."""
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {"array": key}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    if isinstance(value, dict):
        return {"dict": {str(k): _encode(v, arrays, f"{key}.{k}") for k, v in value.items()}}
    if isinstance(value, (tuple, list)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [_encode(v, arrays, f"{key}.{i}") for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"a case holds {type(value).__name__}, which the self-check cannot store")


def _draw(item, gc, out):
    """What the self-check needs to judge a random case against the student's own draw, or None
    (the conditions are those of :func:`.cases.own_draw`)."""
    p = drop_probability(item.name, gc.case.kwargs) if item.kind == "op" else None
    if p is None:
        return None
    return {"op": item.name, "p": p, "shape": list(np.shape(out))}


_MAX_NEAR_ENTRIES = 4096     # outputs larger than this store no near-miss variants


def _near_misses(item, gc, names, seen, out, arrays, key, sentences):
    """What the self-check needs for the own-forward credit's near misses on a visible case
    (grader.recognised_forward), in float64: the named variants' outputs (``near``: [[sentence,
    row]], in the grader's order, the rows of the array ``near_out``: one per distinct output;
    a sentence is its index in ``sentences``, {sentence: index}, which the cases share)
    and each numeric option's output at twice its value (``moved``: [[option, value, row]], the
    rows of ``moved_out``)."""
    from .grader import near_miss_candidates
    out = np.asarray(out)
    if out.dtype.kind != "f" or not 0 < out.size <= _MAX_NEAR_ENTRIES:
        return {}
    args, kwargs = gc.case.args, gc.case.kwargs
    names = list(names[:len(args)]) + [f"input {i}" for i in range(len(names), len(args))]
    near, rows, seen_rows = [], [], {}
    for sentence, thunk in near_miss_candidates(item, gc, names, seen):
        try:
            with np.errstate(all="ignore"):
                v = np.asarray(thunk(), dtype=np.float64)
        except Exception:  # noqa: BLE001 -- a variant the reference refuses matches nothing
            continue
        if v.shape != out.shape or not np.isfinite(v).all():
            continue
        row = seen_rows.setdefault(v.tobytes(), len(rows))
        if row == len(rows):
            rows.append(v)
        near.append([sentences.setdefault(sentence, len(sentences)), row])
    moved, moved_rows = [], []
    for name, value in numeric_options(kwargs):
        try:
            with np.errstate(all="ignore"):
                m = np.asarray(bind(item.spec.forward, dict(kwargs, **{name: 2.0 * value}))(*args)[0],
                               dtype=np.float64)
        except Exception:  # noqa: BLE001 -- an option value the reference refuses
            continue
        if m.shape == out.shape and np.isfinite(m).all():
            moved.append([name, float(value), len(moved_rows)])
            moved_rows.append(m)
    entry = {}
    if near:
        arrays[f"{key}.near"] = np.stack(rows)
        entry.update(near=near, near_out=f"{key}.near")
    if moved:
        arrays[f"{key}.moved"] = np.stack(moved_rows)
        entry.update(moved=moved, moved_out=f"{key}.moved")
    return entry


def check_data(items, *, seed, hidden_seed=None, float32_case=True):
    """The self-check's data: (a JSON-able dict, {key: array}) holding, for every visible case
    of ``items``, its inputs and options, the upstream gradient and the expected output and
    gradients. Hidden cases are never included (``hidden_seed``: the grader's, which decides
    which cases are hidden), only their number per item (``hidden_cases``); neither is any code
    of the reference."""
    arrays, out_items, skipped, sentences = {}, [], [], {}
    for n, item in enumerate(items):
        names = input_names(item.spec)
        cases, n_hidden = [], 0
        graded = make_graded_cases(item, seed=seed, hidden_seed=hidden_seed, float32_case=float32_case)
        # the string options the grader's near misses try: those of the visible cases (a value
        # only a hidden case uses is not named here)
        seen = {}
        for gc in graded:
            for k2, v in gc.case.kwargs.items():
                if isinstance(v, str) and not gc.hidden:
                    seen.setdefault(k2, set()).add(v)
        for k, gc in enumerate(graded):
            if gc.hidden:
                n_hidden += 1
                continue
            key = f"i{n}c{k}"
            try:
                args = [_encode(a, arrays, f"{key}.a{i}") for i, a in enumerate(gc.case.args)]
                kwargs = {name: _encode(v, arrays, f"{key}.k.{name}")
                          for name, v in gc.case.kwargs.items()}
            except TypeError as exc:          # e.g. a Generator object: the grader's alone
                for k2 in [k2 for k2 in arrays if k2.startswith(key + ".")]:
                    del arrays[k2]
                skipped.append({"functions": list(item.functions), "label": gc.label,
                                "why": str(exc)})
                continue
            entry = {"label": gc.label, "dtype": gc.dtype, "check": bool(gc.case.check),
                     "args": args, "kwargs": kwargs}
            if item.kind == "op":
                out, cache = bind(item.spec.forward, gc.case.kwargs)(*gc.case.args)
                out = np.asarray(out)
                rng = np.random.default_rng([0x73656c66, seed, zlib.crc32(item.name.encode()), k])
                dout = rng.standard_normal(out.shape).astype(out.dtype)
                if out.dtype.kind == "f":
                    dout = np.where(np.isfinite(out), dout, 0).astype(out.dtype)
                raw = item.spec.backward(dout.copy(), cache)
                grads = list(raw) if len(gc.case.args) > 1 else [raw]
                arrays[f"{key}.out"], arrays[f"{key}.dout"] = out, dout
                entry.update(out=f"{key}.out", dout=f"{key}.dout", draw=_draw(item, gc, out),
                             grads=[])
                entry.update(_near_misses(item, gc, names, seen, out, arrays, key, sentences))
                for i, g in enumerate(grads):
                    if g is None:
                        entry["grads"].append(None)
                    else:
                        arrays[f"{key}.g{i}"] = np.asarray(g)
                        entry["grads"].append(f"{key}.g{i}")
            else:
                arrays[f"{key}.out"] = np.asarray(item.spec.reference(*gc.case.args, **gc.case.kwargs))
                entry["out"] = f"{key}.out"
            cases.append(entry)
        out_items.append({"name": item.name, "kind": item.kind, "functions": list(item.functions),
                          "inputs": names, "cases": cases, "hidden_cases": n_hidden})
    return {"format": 1, "seed": int(seed), "items": out_items, "skipped": skipped,
            "near_sentences": list(sentences)}, arrays


def _npz_bytes(arrays):
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def _own_source(name):
    """The bytes of ``name``, a module of this folder (selfcheck.py, judge.py), as they are."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "rb") as f:
        return f.read()


def _zip_bytes(folder, files, package):
    """The Gradescope bundle: ``files`` of ``folder`` and the package copy, at the zip's root."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in files:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            mode = 0o755 if name in ("setup.sh", "run_autograder") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(os.path.join(folder, name), "rb") as f:
                z.writestr(info, f.read())
        for root, dirs, names in os.walk(package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".pyc"):
                    continue
                full = os.path.join(root, name)
                arc = os.path.relpath(full, folder).replace(os.sep, "/")
                info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (0o100000 | 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                with open(full, "rb") as f:
                    z.writestr(info, f.read())
    return buf.getvalue()


def _existing_hidden_seed(config_path):
    """The hidden seed of an existing grading.json, or None when there is none."""
    if not os.path.exists(config_path):
        return None
    try:
        seed = load_config(config_path).get("hidden_seed")
    except (OSError, ValueError) as exc:
        raise ValueError(f"make-assignment: cannot keep the hidden seed of {config_path} ({exc}); "
                         "pass --new-seed (or --hidden-seed N)") from None
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"make-assignment: {config_path} has hidden_seed {seed!r}; pass "
                         "--new-seed (or --hidden-seed N)")
    return seed


def make_assignment(names, out_dir, *, name="homework", seed=0, hidden_seed=None, weights=None,
                    timeout=DEFAULTS["timeout"], memory_mb=DEFAULTS["memory_mb"], drop=None,
                    force=False, new_seed=False, submission=None, allow_modules=(), late=None,
                    gradescope_tests="function", hidden=None):
    """Write the assignment for ``names`` into ``out_dir``; return the paths written.

    out_dir/student/                    the folder handed to students: the skeleton ({name}.py
                                        and {name}.ipynb), check.py, judge.py (the
                                        grader's judge, unchanged) and check.py's data (the
                                        visible cases and their expected results; no reference
                                        code and no hidden case)
    out_dir/autograder/grading.json     weights, cases, seeds (the hidden seed is secret)
    out_dir/autograder/setup.sh, run_autograder  Gradescope's pair, plus a copy of numpytfmr
    out_dir/autograder.zip              the same files at the zip's root: Gradescope's upload

    submission:    the file name students hand in (recorded as ``"submission"``), when a
                   submission may hold several files
    allow_modules: modules the submissions may import besides NumPy and the standard library
    late:          the late policy (``{"due": ISO time, "penalty_percent": ..., "per": "day"}``,
                   see :mod:`.course`)
    gradescope_tests: "function" (one Gradescope test per function, its cases in the output)
                   or "case" (one per case)
    weights:       {name: points}: an op or helper's total, or one function of an op's pair
                   (``softmax_backward``), which then no longer takes its default share
    hidden:        {item name: "auto" | "none" | "all" | "redraw" | [case, ...]}: which cases are
                   hidden (cases.hidden_indices); default "auto"

    drop:     {item name: [option, ...]}, options left out of the skeleton and of the graded
              cases (e.g. {"lora_linear": ["dropout", "rank_stabilized"]})
    force:    write into an existing, non-empty ``out_dir`` (refused otherwise); the hidden
              seed of its grading.json is kept unless ``new_seed`` (or ``hidden_seed`` is given)
    """
    if not names:
        raise ValueError("make-assignment: no names given; expected ops (softmax, attention, ...) "
                         "or functions (causal_mask, ...)")
    if not name.isidentifier():
        raise ValueError(f"make-assignment: the name {name!r} must be a Python identifier")
    weights = dict(weights or {})
    drop = {k: list(v) for k, v in (drop or {}).items()}
    hidden = dict(hidden or {})
    items, seen, named = [], set(), {}
    for n in names:
        item = resolve(n)
        named.setdefault(item.name, set()).add(n)
        if item.name not in seen:
            seen.add(item.name)
            items.append(item)
    known = {i.name for i in items}
    functions_of = {fn: i.name for i in items for fn in i.functions}
    for label, given in (("weights", weights), ("options to drop", drop), ("hidden cases", hidden)):
        unknown = set(given) - known - (set(functions_of) if label == "weights" else set())
        if unknown:
            raise ValueError(f"make-assignment: {label} given for {', '.join(sorted(unknown))}, "
                             "which are not in the assignment")
    splits, notes = {}, []
    for i in items:
        split = {fn: w for fn, w in weights.items() if functions_of.get(fn) == i.name and fn != i.name}
        alone = named[i.name] & set(i.functions)
        if i.kind == "op" and len(alone) == 1 and i.name not in named[i.name] and len(named[i.name]) == 1:
            (only,) = alone                      # one function of a pair: the other carries nothing
            other = next(fn for fn in i.functions if fn != only)
            split.setdefault(other, 0.0)
            notes.append(f"{other} is in the skeleton ({i.functions[1]} needs the forward's cache) "
                         f"but carries no points: the assignment names {only} only")
        splits[i.name] = split
    items = [resolve(i.name, weights.get(i.name), drop=drop.get(i.name, ()),
                     weights=splits[i.name] or None, hidden=hidden.get(i.name, "auto"))
             for i in items]
    for item in items:                       # every item must keep a case to grade
        make_graded_cases(item, seed=seed, hidden_seed=None, float32_case=False)

    out_dir = os.fspath(out_dir)
    auto = os.path.join(out_dir, "autograder")
    config_path = os.path.join(auto, "grading.json")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"{out_dir} exists and is not a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        if not force:
            raise ValueError(f"{out_dir} is not empty; pass --force to write "
                             "into it (the skeleton and the autograder are replaced)")
        if hidden_seed is None and not new_seed:
            hidden_seed = _existing_hidden_seed(config_path)
    if hidden_seed is None:
        hidden_seed = secrets.randbelow(2 ** 31)

    filename = f"{name}.py"
    title = f"Assignment: {', '.join(i.name for i in items)}."
    blocks = [(item, skeleton_source(item)) for item in items]
    script = _HEADER.format(title=title, intro=_INTRO.format(filename=filename))
    for item, sources in blocks:
        script += "\n\n" + "\n\n".join(sources)
    script += f"\n\n# Check your work on the visible cases:   python check.py {filename}\n"
    compile(script, filename, "exec")       # the skeleton must at least be valid Python

    cells = [("markdown", f"# {title}\n\n" + _INTRO.format(filename=f"{name}.ipynb"), None),
             ("code", "import math\n\nimport numpy as np\n", None)]
    for item, sources in blocks:
        cells.append(("markdown", f"## {item.name}", None))
        cells.append(("code", "\n\n".join(sources),
                      {"grade": False, "solution": True, "locked": False, "grade_id": item.name}))
    notebook = make_notebook(cells)

    functions = []
    for i in items:
        entry = {"name": i.name, "weight": float(i.weight), "cases": "all"}
        if i.weights:
            entry["weights"] = dict(i.weights)
        if i.hidden != "auto":
            entry["hidden"] = i.hidden
        chosen = [d for d in i.drop if d not in i.spec.omit]
        if chosen:
            entry["drop"] = chosen
        functions.append(entry)
    config = {"assignment": name, "seed": int(seed), "hidden_seed": int(hidden_seed),
              "timeout": timeout, "memory_mb": memory_mb, "float32_case": True,
              "functions": functions}

    if submission is not None:
        config["submission"] = submission
    if allow_modules:
        config["allow_modules"] = sorted(set(allow_modules))
    if late is not None:
        config["late"] = late
    if gradescope_tests != "function":
        config["gradescope_tests"] = gradescope_tests
    load_config(config)                      # the new keys' values are checked once, here
    data, arrays = check_data(items, seed=int(seed), hidden_seed=int(hidden_seed), float32_case=True)
    data["assignment"] = name
    data["timeout"] = timeout               # check.py's limit for each call of a function
    data["slip_deduction"] = float(config.get("slip_deduction", DEFAULTS["slip_deduction"]))

    student = os.path.join(out_dir, "student")
    os.makedirs(auto, exist_ok=True)
    os.makedirs(student, exist_ok=True)
    paths = {"skeleton": os.path.join(student, filename),
             "notebook": os.path.join(student, f"{name}.ipynb"),
             "check": os.path.join(student, "check.py"),
             "judge": os.path.join(student, "judge.py"),
             "check_data": os.path.join(student, "check_data.json"),
             "check_arrays": os.path.join(student, "check_data.npz"),
             "student": student,
             "config": config_path,
             "setup": os.path.join(auto, "setup.sh"),
             "run": os.path.join(auto, "run_autograder"),
             "zip": os.path.join(out_dir, "autograder.zip")}
    atomic_write_text(paths["skeleton"], script)
    atomic_write_text(paths["notebook"], json.dumps(notebook, indent=1) + "\n")
    atomic_write_bytes(paths["check"], _own_source("selfcheck.py"))
    atomic_write_bytes(paths["judge"], _own_source("judge.py"))      # check.py's judge, unchanged
    write_json(paths["check_data"], data)
    atomic_write_bytes(paths["check_arrays"], _npz_bytes(arrays))
    write_json(paths["config"], config)
    atomic_write_text(paths["setup"], setup_script(config.get("allow_modules", ())))
    atomic_write_text(paths["run"], _RUN.format(name=name))
    for key in ("setup", "run"):                   # scripts: executable wherever readable
        mode = os.stat(paths[key]).st_mode & 0o777  # (the mode the umask gave the new file)
        os.chmod(paths[key], mode | (mode & 0o444) >> 2)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.path.join(auto, "numpytfmr")
    if os.path.isdir(target):
        shutil.rmtree(target)
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    paths["package"] = target
    atomic_write_bytes(paths["zip"], _zip_bytes(auto, ["setup.sh", "run_autograder", "grading.json"],
                                                target))
    paths["notes"] = notes
    return paths


def gradescope_image():
    """The Gradescope image the bundle is made for, and the NumPy pinned for it
    (``gradescope.json`` beside this module; the docs name the same image)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gradescope.json"),
              encoding="utf-8") as f:
        return json.load(f)


def _distribution(module):
    """The pip name of the distribution that provides ``module`` in this Python (``sklearn``
    -> ``scikit-learn``), or the module's own name when none is installed here."""
    import importlib.metadata
    names = sorted(importlib.metadata.packages_distributions().get(module, []))
    return names[0] if names else module


def setup_script(allow_modules=()):
    """Gradescope's setup.sh: NumPy pinned for the image's Python, and every allowed module."""
    import shlex
    image = gradescope_image()
    pythons = image["numpy_pythons"]
    if image["image"]["python"] not in pythons:
        raise ValueError(f"gradescope.json: NumPy {image['numpy']} is listed for Python "
                         f"{', '.join(pythons)}, not the image's {image['image']['python']}")
    modules = sorted(set(allow_modules))
    packages = [f"numpy=={image['numpy']}"] + sorted({_distribution(m) for m in modules} - {"numpy"})
    im = image["image"]
    return _SETUP.format(image=f"{im['name']} {im['version']} (variant {im['variant']})",
                         python=im["python"], numpy=image["numpy"], pythons=" ".join(pythons),
                         packages=" ".join(shlex.quote(p) for p in packages),
                         modules=" ".join(shlex.quote(m) for m in ["numpy"] + modules))


_SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image. The bundle is made
# for Gradescope's base image {image}, whose Python is {python}.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if ! command -v python3 > /dev/null || ! python3 -m pip --version > /dev/null 2>&1; then
    apt-get install -y -qq python3 python3-pip
fi
# bubblewrap isolates every submission process (namespaces, a read-only filesystem without the
# reference or the config, no network); without it, each runs as a user ID of its own.
apt-get install -y -qq bubblewrap || echo "warning: bubblewrap could not be installed" >&2
# NumPy {numpy} has wheels for Python {pythons}: on another Python, stop here and say so.
python_version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case " {pythons} " in
    *" $python_version "*) ;;
    *) echo "setup.sh: this image has Python $python_version, and NumPy {numpy} has no build for it" \\
            "(it has for Python {pythons}); choose Gradescope's base image {image}" >&2
       exit 1 ;;
esac
# NumPy, and the modules the assignment allows (grading.json's allow_modules), resolved together
# so that each is a release that works with this NumPy and this Python.
packages=({packages})
python3 -m pip install --quiet --only-binary=numpy "${{packages[@]}}" \\
    || python3 -m pip install --quiet --only-binary=numpy --break-system-packages "${{packages[@]}}"
python3 -c 'import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)' {modules}
# Check now, not at the first submission, that a submission process can start here: this prints
# the isolation it will use and fails the build, saying why, when none works.
cd /autograder/source
PYTHONPATH=/autograder/source python3 -m numpytfmr.grading --check
"""

_RUN = """#!/usr/bin/env bash
# Gradescope runs this, as root, for every submission. The grader runs the student's code in
# separate processes, each in the operating system's sandbox (bubblewrap, or a user ID of its
# own: setup.sh checked which works), and writes the results itself, atomically, after the
# student's code has finished; nothing the student's processes wrote is ever read.
root="${{NUMPYTFMR_AUTOGRADER_ROOT:-/autograder}}"
cd "$root/source"
export PYTHONPATH="$root/source"
mkdir -p "$root/results"
rm -f "$root/results/results.json"
# Everything under the autograder's folder -- the reference (a copy of numpytfmr in source/),
# grading.json with its hidden seed, the submission, the results -- belongs to root, with no
# access for anyone else: a submission running as a user ID of its own cannot read it.
if [ "$(id -u)" = 0 ]; then
    chown -R root:root "$root/source"
    chmod -R go-rwx "$root/source" "$root/submission" "$root/results"
    chmod go-rwx "$root"
fi
python3 -m numpytfmr grade "$root/submission" --config "$root/source/grading.json" \\
    --json "$root/results/results.json"
status=$?
# 0: all passed, 1: some failed; anything else is a grader error, whose results are not trusted
if [ "$status" -gt 1 ] || [ ! -s "$root/results/results.json" ]; then
    echo '{{"score": 0, "output": "The grader failed (status '"$status"'); please contact the staff."}}' \\
        > "$root/results/results.json"
fi
exit 0
"""
