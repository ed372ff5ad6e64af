"""Submissions whose code is unusually alike, for the staff to review (``numpytfmr grade DIR
--csv ... --similarity FILE``). A flag is a reason to look, never a penalty: the grades are not
touched.

The algorithm is winnowing (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for
document fingerprinting", SIGMOD 2003), the one behind MOSS, over normalised tokens:

1. **Normalise.** The code (a .py file, or a notebook's code cells) is split into Python
   tokens. Comments, docstrings and layout (newlines, indentation) are dropped; every name
   that is not a keyword, a builtin or an attribute (``np.exp``, ``x.sum``) becomes ``V``, every
   string ``S``. Renamed variables, rewritten comments and reformatted code then give the same
   token stream, and functions in another order give the same k-grams.
2. **Fingerprint.** Each run of ``K`` consecutive tokens (a k-gram) is hashed; in every window
   of ``W`` consecutive hashes the smallest is kept (the rightmost on a tie). Any match of at
   least ``W + K - 1`` tokens shares a fingerprint, and noise shorter than ``K`` tokens never
   does.
3. **Remove the boilerplate.** Fingerprints of the assignment's skeleton (the signatures every
   student starts from) are removed from every submission.
4. **Compare.** For two submissions with fingerprint sets A and B: ``jaccard = |A & B| / |A | B|``
   and ``containment = |A & B| / min(|A|, |B|)`` (one copied into a larger file). A pair is
   flagged when ``containment >= PAIR_CONTAINMENT`` and ``jaccard >= PAIR_JACCARD`` with at least
   ``MIN_SHARED`` shared fingerprints. Against numpytfmr's reference functions of the assignment
   (the first place a student would copy from), a submission is flagged when it contains at
   least ``REFERENCE_CONTAINMENT`` of a reference function's fingerprints (functions with fewer
   than ``MIN_REFERENCE`` fingerprints, one-liners, are too short to tell).

The thresholds were set on the fixtures in tests/grading_fixtures: independent correct
solutions of the same functions stay well below them, planted copies (renamed variables,
reordered functions, rewritten comments) well above.
"""
from dataclasses import dataclass, field
import ast
import builtins
import hashlib
import io
import json
import keyword
import re
import tokenize

__all__ = ["fingerprints", "normalise", "compare", "report", "report_text", "K", "W"]

K = 12                     # tokens per k-gram
W = 8                      # window of the winnowing
PAIR_JACCARD = 0.30
PAIR_CONTAINMENT = 0.50
MIN_SHARED = 15
REFERENCE_CONTAINMENT = 0.70
MIN_REFERENCE = 8
PAIRS_SHOWN = 100          # pairs listed in the text report (the JSON one has them all)

_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"np", "math", "numpy"}
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENCODING, tokenize.ENDMARKER}


def _docstring_lines(source):
    """Line numbers of docstrings (module, class and function), to be dropped."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    lines = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def normalise(source):
    """[(token, line)]: the code's tokens with names, strings, comments and layout normalised."""
    skip_lines = _docstring_lines(source)
    out, prev = [], ""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = None
    if tokens is None:                        # not Python: a plain split into words and symbols
        for lineno, line in enumerate(source.splitlines(), start=1):
            line = line.split("#", 1)[0]
            for t in re.findall(r"[A-Za-z_]\w*|\d+\.?\d*|\S", line):
                out.append(("V" if t[0].isalpha() and t not in _KEEP else t, lineno))
        return out
    for tok in tokens:
        if tok.type in _SKIP:
            continue
        if tok.type == tokenize.STRING:
            if tok.start[0] in skip_lines:
                continue
            text = "S"
        elif tok.type == tokenize.NAME:
            text = tok.string if (tok.string in _KEEP or prev == ".") else "V"
        else:
            text = tok.string
        prev = tok.string
        out.append((text, tok.start[0]))
    return out


def _hash(text):
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def fingerprints(source, k=K, w=W):
    """{hash: first line} of the winnowed k-gram hashes of ``source``'s normalised tokens."""
    toks = normalise(source)
    if len(toks) < k:
        return {}
    hashes = [(_hash(" ".join(t for t, _ in toks[i:i + k])), toks[i][1]) for i in range(len(toks) - k + 1)]
    out = {}
    if len(hashes) <= w:
        h, line = min(hashes)
        return {h: line}
    for i in range(len(hashes) - w + 1):
        window = hashes[i:i + w]
        low = min(h for h, _ in window)
        j = max(m for m, (h, _) in enumerate(window) if h == low)
        h, line = window[j]
        out.setdefault(h, line)
    return out


def _functions(source):
    """[(name, first line, last line)] of the top-level functions."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return [(n.name, n.lineno, n.end_lineno) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@dataclass
class Doc:
    """One submission's fingerprints (boilerplate removed) and the function of each."""
    student: str
    prints: dict
    functions: list = field(default_factory=list)

    def function_of(self, line):
        for name, lo, hi in self.functions:
            if lo <= line <= hi:
                return name
        return "(top level)"


def document(student, source, boilerplate=frozenset()):
    prints = {h: line for h, line in fingerprints(source).items() if h not in boilerplate}
    return Doc(student, prints, _functions(source))


def compare(a, b):
    """(jaccard, containment, shared, the functions of ``a`` and of ``b`` holding shared prints)."""
    shared = set(a.prints) & set(b.prints)
    union = len(set(a.prints) | set(b.prints))
    smaller = min(len(a.prints), len(b.prints))
    jaccard = len(shared) / union if union else 0.0
    containment = len(shared) / smaller if smaller else 0.0
    fa = sorted({a.function_of(a.prints[h]) for h in shared})
    fb = sorted({b.function_of(b.prints[h]) for h in shared})
    return jaccard, containment, len(shared), fa, fb


def report(sources, *, boilerplate_sources=(), references=None):
    """The similarity report (a dict).

    sources: {student: code}; boilerplate_sources: code every student was given (the
    skeleton); references: {function name: reference code} to compare every submission with.
    """
    boiler = set()
    for code in boilerplate_sources:
        boiler |= set(fingerprints(code))
    docs = [document(s, code, boiler) for s, code in sorted(sources.items())]
    pairs, scores = [], []
    for i, a in enumerate(docs):
        for b in docs[i + 1:]:
            jac, cont, n, fa, fb = compare(a, b)
            scores.append(jac)
            if n >= MIN_SHARED and jac >= PAIR_JACCARD and cont >= PAIR_CONTAINMENT:
                pairs.append({"a": a.student, "b": b.student, "jaccard": round(jac, 3),
                              "containment": round(cont, 3), "shared": n,
                              "functions_a": fa, "functions_b": fb})
    pairs.sort(key=lambda p: (-p["jaccard"], p["a"], p["b"]))
    refs = {name: {h: 0 for h in fingerprints(code) if h not in boiler}
            for name, code in (references or {}).items()}
    close = []
    for d in docs:
        for name, prints in refs.items():
            if len(prints) < MIN_REFERENCE:
                continue
            shared = set(prints) & set(d.prints)
            frac = len(shared) / len(prints)
            if frac >= REFERENCE_CONTAINMENT:
                close.append({"student": d.student, "reference": name, "containment": round(frac, 3),
                              "shared": len(shared),
                              "functions": sorted({d.function_of(d.prints[h]) for h in shared})})
    close.sort(key=lambda c: (-c["containment"], c["student"], c["reference"]))
    scores.sort()
    median = scores[len(scores) // 2] if scores else 0.0
    # groups of submissions joined by flagged pairs (many copies of one file are one group)
    parent = {d.student: d.student for d in docs}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for p in pairs:
        parent[root(p["a"])] = root(p["b"])
    groups = {}
    for d in docs:
        groups.setdefault(root(d.student), []).append(d.student)
    clusters = []
    for members in groups.values():
        if len(members) < 2:
            continue
        inside = [p["jaccard"] for p in pairs if p["a"] in members]
        clusters.append({"members": sorted(members), "pairs": len(inside),
                         "min_jaccard": min(inside), "max_jaccard": max(inside)})
    clusters.sort(key=lambda c: (-len(c["members"]), c["members"]))
    return {"algorithm": f"winnowing of normalised token {K}-grams, window {W}",
            "thresholds": {"pair_jaccard": PAIR_JACCARD, "pair_containment": PAIR_CONTAINMENT,
                           "min_shared": MIN_SHARED, "reference_containment": REFERENCE_CONTAINMENT,
                           "min_reference_fingerprints": MIN_REFERENCE},
            "submissions": len(docs), "pairs_compared": len(scores),
            "median_jaccard": round(median, 3), "clusters": clusters, "pairs": pairs,
            "reference": close,
            "note": "flags are for review, never penalties"}


def report_text(rep):
    lines = [f"similarity of {rep['submissions']} submissions ({rep['algorithm']}; "
             f"{rep['pairs_compared']} pairs, median Jaccard {rep['median_jaccard']:g})",
             "Flags are for review by the staff, never penalties.", ""]
    def names(fns, most=8):
        return ", ".join(fns[:most]) + (f" and {len(fns) - most} more" if len(fns) > most else "")
    clusters = rep.get("clusters", [])
    lines.append(f"groups of alike submissions: {len(clusters)}")
    for c in clusters:
        lines.append(f"  {len(c['members'])} submissions, {c['pairs']} flagged pairs, Jaccard "
                     f"{c['min_jaccard']:.2f} to {c['max_jaccard']:.2f}: {', '.join(c['members'])}")
    shown = rep["pairs"][:PAIRS_SHOWN]
    lines += ["", f"pairs flagged: {len(rep['pairs'])}"
              + (f" (the {PAIRS_SHOWN} most alike below; all in the JSON report)"
                 if len(rep["pairs"]) > PAIRS_SHOWN else "")]
    for p in shown:
        lines.append(f"  {p['a']}  ~  {p['b']}: Jaccard {p['jaccard']:.2f}, containment "
                     f"{p['containment']:.2f}, {p['shared']} shared fingerprints")
        lines.append(f"      in {names(p['functions_a'])}")
        if p["functions_b"] != p["functions_a"]:
            lines.append(f"      and {names(p['functions_b'])}")
    lines += ["", f"close to numpytfmr's reference: {len(rep['reference'])}"]
    for c in rep["reference"]:
        lines.append(f"  {c['student']}: {c['containment']:.0%} of the reference {c['reference']} "
                     f"({c['shared']} fingerprints), in {', '.join(c['functions'])}")
    return "\n".join(lines) + "\n"


def write_report(path, rep):
    """The report as JSON (a ``.json`` path) or text, written atomically."""
    from ..shared.fileio import atomic_write_text
    text = json.dumps(rep, indent=1) + "\n" if str(path).endswith(".json") else report_text(rep)
    atomic_write_text(path, text)
