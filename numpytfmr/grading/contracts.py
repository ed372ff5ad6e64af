"""Student contracts: the docstrings of a generated skeleton.

A skeleton function is a contract between the student and the grader. Its docstring is built
from three sources:

- the reference's docstring: its first paragraph (what the function is, with the section of
  the notes) and its equation blocks (the indented paragraphs), as the notes write them;
- the op's contract (``fn.__contract__``, from ``@op(...)`` in the topic module): the inputs,
  their shapes and kinds, and the options with their defaults;
- the student notes, data kept beside each op's registration (``numpytfmr/registry/*.toml``,
  one file per registry topic, read by :func:`load_notes`): for each op, what the student must
  know that the reference's docstring says in terms of functions the student does not have
  (``causal_mask``, ``rope_frequencies``, the reference's private helpers), every behaviour
  the graded cases check (a fully masked row, ignored positions, ...), what the student may
  use (``math.erfc`` element-wise, ``np.add.at``), and the suggested cache.

Each docstring separates what is **required and graded** (the inputs the grader passes, the
values returned, their shapes and dtypes, the order of the gradients) from what is only
**suggested** (the cache's contents, the algorithm). The skeleton names no function the
student cannot use: formulas are given instead.

Text pieces in the notes are strings, or ``(tag, text)`` pairs: a piece tagged ``"opt"``
appears only when the option ``opt`` is kept, one tagged ``"!opt"`` only when it is dropped
(``make-assignment --drop op:opt``).
"""
from dataclasses import dataclass, field
import inspect
import os
import re
import string
import textwrap

__all__ = ["StudentNotes", "NOTES", "load_notes", "notes_files", "notes_for", "forward_doc",
           "backward_doc", "helper_doc", "clean_reference_text", "WIDTH"]

WIDTH = 92          # docstring lines are wrapped to this width (4 spaces of indent included)


@dataclass(frozen=True)
class StudentNotes:
    """What a student needs to know about one op (or helper) beyond its reference docstring.

    summary:  replaces the reference's first paragraph
    math:     replaces the reference's equation blocks (pieces, one line each)
    text:     paragraphs after the equations: conventions and the graded edge cases (pieces)
    params:   parameter -> its description in "Required" (replaces the one made from the
              contract); a parameter missing here is described from the contract
    out:      what the forward returns as ``out`` (shape, dtype)
    cache:    the suggested cache contents (pieces)
    suggest:  other suggestions, not graded (pieces)
    allowed:  what the student may use beyond plain NumPy (pieces)
    backward: replaces the reference's backward docstring (pieces)
    grads:    notes on the gradients: which are None, what is summed (pieces)
    omit:     options no skeleton shows (the grader never passes them)
    depends:  option -> the options that go with it when it is dropped
    """
    summary: str = None
    math: tuple = None
    text: tuple = ()
    params: dict = field(default_factory=dict)
    out: str = ""
    cache: tuple = ()
    suggest: tuple = ()
    allowed: tuple = ()
    backward: tuple = None
    grads: tuple = ()
    omit: tuple = ()
    depends: dict = field(default_factory=dict)


# --- the notes, read from the registry's TOML files ----------------------------------------------

# Options no skeleton shows (omit) and the options that go with a dropped one (depends) are not
# prose, and grading needs them where no TOML reader is installed (Gradescope's default image runs
# Python 3.10, whose standard library has no tomllib): each op or helper declares them with its
# registration (``OpSpec.omit``/``depends``, ``Helper.omit``).

def _options(name):
    """``{"omit": ..., "depends": ...}`` of an op or helper, from its registration."""
    from ..registry import registry
    from .cases import helpers
    spec = registry().get(name) or helpers().get(name)
    if spec is None:
        return {}
    return {"omit": tuple(spec.omit), "depends": dict(getattr(spec, "depends", ()))}


_PIECES = ("math", "text", "cache", "suggest", "allowed", "backward", "grads")
_STRINGS = ("summary", "out")
_NOTES = None


def notes_folder():
    """The folder of the TOML files: the registry's (numpytfmr/registry/)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "registry")


def notes_files():
    """The TOML files of the notes, one per registry topic, in name order."""
    folder = notes_folder()
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".toml")]


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:                     # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                "the student notes (numpytfmr/registry/*.toml) need a TOML reader: Python 3.11 "
                "or newer, or tomli on Python 3.10 (pip install \"numpytfmr[assignment]\")",
                name="tomli") from None
    return tomllib


def _convert(where, raw, wording):
    """One op's table of a TOML file -> :class:`StudentNotes` (without the options)."""
    def text(value, key):
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key} is {value!r}; expected a string")
        try:
            return string.Template(value).substitute(wording)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{where}: {key} names unknown wording {exc}; the [wording] "
                             f"tables hold {', '.join(sorted(wording))}") from None

    def piece(value, key):
        if isinstance(value, dict):
            if set(value) != {"when", "text"}:
                raise ValueError(f"{where}: a piece of {key} has the keys {sorted(value)}; "
                                 "expected when and text")
            return (value["when"], text(value["text"], key))
        return text(value, key)

    out = {}
    for key, value in raw.items():
        if key in _STRINGS:
            out[key] = text(value, key)
        elif key in _PIECES:
            if not isinstance(value, list):
                raise ValueError(f"{where}: {key} is {value!r}; expected a list of pieces")
            out[key] = tuple(piece(v, key) for v in value)
        elif key == "params":
            out[key] = {name: text(v, f"params.{name}") for name, v in value.items()}
        else:
            known = ", ".join(_STRINGS + _PIECES + ("params",))
            raise ValueError(f"{where}: unknown key {key!r}; the keys are {known}")
    return out


def load_notes(files=None):
    """Every op's and helper's :class:`StudentNotes`, read from ``files`` (the registry's TOML).

    A file holds ``[wording]`` (named texts any file's pieces use as ``${name}``), one
    ``[ops.NAME]`` table per op registered in the registry topic of the same name, and one
    ``[helpers.NAME]`` per plain function a skeleton can hold. The keys of a table are the
    fields of :class:`StudentNotes` (``omit`` and ``depends`` excepted: see ``_options``);
    ``summary`` and ``out`` are strings, ``params`` a table, the others lists of pieces, a
    piece being a string or ``{ when = "opt", text = "..." }`` (``when = "!opt"``: only when
    ``opt`` is dropped).
    """
    reader = _toml()
    tables, wording = [], {}
    for path in notes_files() if files is None else files:
        with open(path, "rb") as f:
            data = reader.load(f)
        name = os.path.basename(path)
        for key, text in data.get("wording", {}).items():
            if key in wording:
                raise ValueError(f"{name}: the wording {key!r} is defined twice")
            wording[key] = text
        unknown = set(data) - {"wording", "ops", "helpers"}
        if unknown:
            raise ValueError(f"{name}: unknown tables {sorted(unknown)}; expected wording, ops "
                             "and helpers")
        for kind in ("ops", "helpers"):
            tables += [(f"{name}: [{kind}.{op}]", op, raw)
                       for op, raw in data.get(kind, {}).items()]
    notes = {}
    for where, op, raw in tables:
        if op in notes:
            raise ValueError(f"{where}: {op!r} has notes twice")
        notes[op] = StudentNotes(**_convert(where, raw, wording), **_options(op))
    return notes


def _notes():
    global _NOTES
    if _NOTES is None:
        _NOTES = load_notes()
    return _NOTES


def __getattr__(name):
    if name == "NOTES":                             # read on first use, not on import
        return _notes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def notes_for(name):
    """The :class:`StudentNotes` of an op or helper (empty ones when it has none).

    Where no TOML reader is installed (Python 3.10 without tomli), only the options a grader
    needs (``omit``, ``depends``) are given; the docstrings (:func:`forward_doc`, ...) need the
    prose and say what to install.
    """
    try:
        return _prose(name)
    except ModuleNotFoundError:
        return StudentNotes(**_options(name))


def _prose(name):
    """The notes of ``name`` with their prose: they need the TOML reader."""
    return _notes().get(name) or StudentNotes(**_options(name))


# --- text -------------------------------------------------------------------------------------

_FUNC = re.compile(r":(?:func|class|meth|data):`~?([\w.]+)`")


def clean_reference_text(text):
    """Reference prose for a student: Sphinx roles and the backticks around code (double) and
    math (single, docs/math.md) removed."""
    text = _FUNC.sub(r"\1", text)
    return text.replace("``", "").replace("`", "")


def _pieces(pieces, dropped):
    """The texts of ``pieces`` that apply with the options ``dropped`` left out."""
    out = []
    for piece in pieces or ():
        if isinstance(piece, tuple):
            tag, text = piece
            present = tag[1:] in dropped if tag.startswith("!") else tag not in dropped
            if not present:
                continue
            piece = text
        out.append(piece)
    return out


def _paragraphs(doc):
    doc = inspect.cleandoc(doc or "")
    return [p for p in re.split(r"\n\s*\n", doc) if p.strip()]


def _is_math(paragraph):
    lines = [line for line in paragraph.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("    ") for line in lines)


def _fill(text, indent="", hang=None):
    hang = indent if hang is None else hang
    return textwrap.fill(" ".join(text.split()), width=WIDTH - 4, initial_indent=indent,
                         subsequent_indent=hang, break_long_words=False, break_on_hyphens=False)


def _block(lines, dropped, indent="    "):
    return "\n".join(indent + line.strip() if line.strip() else ""
                     for line in _pieces(lines, dropped))


def _text_lines(pieces, dropped):
    """Paragraph pieces as blocks: prose is filled, formula lines (indented, or ``name:  ...``
    with two spaces after the colon) are kept together as one indented block."""
    blocks, formulas = [], []
    for piece in _pieces(pieces, dropped):
        if piece.startswith("    ") or re.match(r"^[\w ()]+:\s{2,}", piece):
            formulas.append("    " + piece.strip() if not piece.startswith("    ") else piece)
            continue
        if formulas:
            blocks.append("\n".join(formulas))
            formulas = []
        blocks.append(_fill(piece))
    if formulas:
        blocks.append("\n".join(formulas))
    return blocks


# --- parameters ---------------------------------------------------------------------------------

def _validator_text(v):
    """A validator's condition in a student's words: ``a number > 0``, ``None or ...``."""
    from .. import contract as c
    known = {c.positive: "a number > 0", c.nonnegative: "a number >= 0",
             c.fraction: "a number in [0, 1)", c.probability: "a number in [0, 1]",
             c.real: "a number", c.count: "a positive integer", c.flag: "True or False",
             c.generator: "a numpy.random.Generator"}
    if v in known:
        return known[v]
    if getattr(v, "__qualname__", "").startswith("optional.") and v.__closure__:
        inner = next((cell.cell_contents for cell in v.__closure__
                      if callable(cell.cell_contents)), None)
        if inner is not None:
            return "None or " + _validator_text(inner)
    doc = " ".join(clean_reference_text((v.__doc__ or "").strip().split("\n\n")[0]).split())
    if doc[:1].isupper() and not doc[1:2].isupper():
        doc = doc[0].lower() + doc[1:]
    return doc.rstrip(".") or v.__name__


def _array_text(spec):
    kinds = {"float": "float array", "int": "int array", "bool": "bool array", "any": "array"}
    kind = kinds[spec.kind]
    shape = spec.shape_text
    text = f"{kind} broadcastable to {shape}" if spec.broadcast else f"{kind} {shape}"
    if spec.ellipsis and not spec.axes and not spec.broadcast:
        text = f"{kind} of any shape"
    return text + (", or None" if spec.optional else "")


def _default_text(param):
    if param.default is param.empty:
        return ""
    d = param.default
    shown = getattr(d, "__name__", None) if isinstance(d, type) else None
    return f" (default {shown or repr(d)})"


def _param_lines(fn, name, dropped, kind):
    """The "Required" lines of the parameters of ``fn`` (a reference forward or helper)."""
    notes = _prose(name)
    contract = getattr(fn, "__contract__", None)
    arrays = {s.name: s for s in contract.arrays} if contract else {}
    options = dict(contract.options) if contract else {}
    lines = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in dropped:
            continue
        if p.name in notes.params:
            text = notes.params[p.name]
        elif p.name in arrays:
            text = _array_text(arrays[p.name])
            if arrays[p.name].kind == "any" and p.name in options:
                text = _validator_text(options[p.name])
            text += _default_text(p) if p.default is not p.empty and p.default is not None else ""
            if p.default is None and not arrays[p.name].optional:
                text += ", or None"
        elif p.name in options:
            text = _validator_text(options[p.name]) + _default_text(p)
        else:
            text = ("" if kind == "function" else "a value") + _default_text(p)
            text = text.strip() or "as described above"
        lines.append(_fill(f"{p.name}: {text}", "    ", "        "))
    return lines


def _positional(fn, dropped=()):
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in dropped]


def grad_name(name):
    """``dx``, ``dW``; ``d_policy_chosen`` for long names (as the grader's messages write them)."""
    return f"d_{name}" if "_" in name or len(name) > 5 else f"d{name}"


# --- docstrings ---------------------------------------------------------------------------------

def _summary_and_math(doc, notes, dropped):
    paragraphs = _paragraphs(clean_reference_text(doc))
    summary = _fill(notes.summary or (paragraphs[0] if paragraphs else ""))
    if notes.math is not None:
        math = _block(notes.math, dropped)
    else:
        blocks = []
        for para in paragraphs[1:]:
            if para.lstrip().lower().startswith("cache"):
                break
            if _is_math(para):
                blocks.append(textwrap.dedent(para).rstrip())
        math = "\n\n".join(textwrap.indent(b, "    ") for b in blocks)
    return summary, math


def _assemble(parts):
    return "\n\n".join(p.rstrip() for p in parts if p and p.strip())


def forward_doc(name, forward, backward_name, dropped=()):
    """The student docstring of an op's forward (text without the quotes, not indented)."""
    notes = _prose(name)
    summary, math = _summary_and_math(forward.__doc__, notes, dropped)
    text = "\n\n".join(_text_lines(notes.text, dropped))
    required = ["Required (graded):"] + _param_lines(forward, name, dropped, "op")
    required.append("    returns (out, cache):")
    required.append(_fill(f"out: {notes.out or 'an array of the inputs float dtype (see above)'}",
                          "        ", "            "))
    required.append(_fill(f"cache: anything you like; the grader passes it, unchanged, to "
                          f"{backward_name}", "        ", "            "))
    suggested = ["Suggested (not graded):"]
    cache = _pieces(notes.cache, dropped)
    if cache:
        suggested.append(_fill("cache: " + " ".join(cache), "    ", "        "))
    suggested += [_fill(s, "    ", "    ") if not s.startswith("    ") else "    " + s
                  for s in _pieces(notes.suggest, dropped)]
    allowed = _pieces(notes.allowed, dropped)
    parts = [summary, math, text, "\n".join(required)]
    if len(suggested) > 1:
        parts.append("\n".join(suggested))
    if allowed:
        parts.append(_fill("You may use: " + " ".join(allowed), "", "    "))
    return _assemble(parts)


def backward_doc(name, forward, backward, dropped=()):
    """The student docstring of an op's backward (text without the quotes, not indented)."""
    notes = _prose(name)
    if notes.backward is not None:
        body = "\n".join(line if line.startswith("    ") or not line else _fill(line)
                         for line in _pieces(notes.backward, dropped))
    else:
        kept = []
        for para in _paragraphs(clean_reference_text(backward.__doc__)):
            low = para.lower()
            first = para.split("\n")[0]
            if low.startswith(("returns", "->", "dout:", "cache")) and "=" not in first:
                continue
            if not _is_math(para):          # the "Returns (...)" sentences: "Required" says it
                para = "\n".join(line for line in para.splitlines()
                                 if not line.lstrip().startswith("Returns ("))
            if para.strip():
                kept.append(textwrap.indent(textwrap.dedent(para), "    ") if _is_math(para)
                            else para)
        if not kept or not kept[0].startswith(("Gradient", "Backward", "Returns")):
            kept.insert(0, f"Gradient of {forward.__name__}.")
        body = "\n\n".join(kept)
    inputs = _positional(forward, dropped)
    grads = [grad_name(n) for n in inputs]
    fwd = forward.__name__
    dname = next(iter(inspect.signature(backward).parameters), "dout")
    required = ["Required (graded):",
                _fill(f"{dname}: the upstream gradient, of the shape and dtype of {fwd}'s out",
                      "    ", "        "),
                _fill(f"cache: what {fwd} returned", "    ", "        ")]
    if len(grads) == 1:
        ret = (f"returns {grads[0]}, the gradient of {inputs[0]} (bare, not in a tuple), of "
               f"{inputs[0]}'s shape and dtype.")
    else:
        ret = (f"returns ({', '.join(grads)}): one gradient per positional input of {fwd}, in "
               "this order, each of its input's shape and dtype; None for an input that was "
               "None or takes no gradient.")
    required.append(_fill(ret + " " + " ".join(_pieces(notes.grads, dropped)), "    ", "        "))
    return _assemble([body, "\n".join(required)])


def helper_doc(name, fn, dropped=()):
    """The student docstring of a plain function of the contract."""
    notes = _prose(name)
    if notes.text or notes.math is not None:
        summary, math = _summary_and_math(fn.__doc__, notes, dropped)
        body = _assemble([summary, math, "\n\n".join(_text_lines(notes.text, dropped))])
    else:
        paragraphs = _paragraphs(clean_reference_text(fn.__doc__))
        body = "\n\n".join(textwrap.indent(textwrap.dedent(p), "    ") if _is_math(p) else p
                           for p in paragraphs)
    required = ["Required (graded):"] + _param_lines(fn, name, dropped, "function")
    if notes.out:
        required.append(_fill(f"returns: {notes.out}", "    ", "        "))
    return _assemble([body, "\n".join(required)])
