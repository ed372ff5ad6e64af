"""The docstrings' plain-text math (the convention is docs/math.md), drawn by latex2mathml.

:func:`to_tex` spells a line such as ``sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)`` in
TeX word by word (names become symbols, scripts get braces, English words and the notes'
references stay text); it does not parse the math: latex2mathml does, in :func:`to_mathml`.
"""
import html
import re

from latex2mathml.converter import convert

__all__ = ["to_tex", "to_mathml", "tex_to_mathml", "atoms", "tex_atoms", "tex_pieces_to_mathml",
           "symbols", "GREEK"]

GREEK = {name: "\\" + name for name in (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi",
    "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi", "Omega")}
GREEK["eps"] = GREEK["epsilon"] = "\\varepsilon"
# Set upright, as functions.
FUNCTIONS = {
    "exp", "log", "ln", "sin", "cos", "tan", "tanh", "sinh", "cosh", "erf", "erfc", "softmax",
    "sigmoid", "argmax", "argmin", "mean", "rowsum", "rowmax", "clip", "relu", "gelu", "silu",
    "act", "drop", "attn", "ffn", "cross", "Concat", "RoPE", "LN", "Var", "abs", "diag", "rms",
    "Bernoulli", "round", "floor", "ceil", "sign", "det", "tr", "cumsum", "score", "sim",
    "Count", "IDF", "PPL", "PMI", "PPMI", "logsumexp", "swish", "split", "concat", "repeat",
    "stack", "linear", "norm", "lse", "KL", "H", "CE", "TF", "BM25", "RRF", "MHA", "FFN",
    "Attention", "MultiHead", "head", "sort", "len", "count", "min", "max", "softplus",
}
# Functions TeX knows by name.
STANDARD = {"exp", "log", "ln", "sin", "cos", "tan", "tanh", "sinh", "cosh", "det", "arg"}
# Operators whose subscripts go underneath.
BIG = {"sum": "\\sum", "prod": "\\prod", "max": "\\max", "min": "\\min", "lim": "\\lim"}
# English words: set as text.
PROSE = set("""
a an the of and or not nor but if else elif then when where while for from to into onto in
on at by with without over under per each every all any some no is are be was were been has
have had it its this that these those as so such than same other only also both either
neither which who whose what how why here there one two three four row rows column columns
entry entries axis axes last first next previous new old token tokens position positions
key keys query queries value values head heads layer layers batch step steps time times
mask masked allowed shape shapes element elements length sum sums mean over term terms
using use used because since until after before true false none else otherwise given
held out kept dropped unchanged just more less most least equal equals zero ones zeros
up down left right population variance sample broadcast same size elementwise element-wise
wise row-wise by per-head gradient gradients forward backward cache cached via along
along-axis stable stably copy copies view views times fold folded scaled unscaled
""".split())
ACCENT_SUFFIX = {"hat": "\\hat", "tilde": "\\tilde", "bar": "\\bar"}
OPERATORS = [
    ("-->", "\\longrightarrow "), ("->", "\\to "), ("<-", "\\leftarrow "), ("=>", "\\Rightarrow "),
    ("<=", "\\le "), (">=", "\\ge "), ("!=", "\\ne "), ("+-", "\\pm "), ("...", "\\ldots "),
    ("..", "\\ldots "), ("||", "\\| "), (":=", "\\coloneqq "), ("==", "="), ("*", "\\cdot "),
    ("~", "\\sim "), ("%", "\\% "), ("&", "\\& "), ("#", "\\# "), ("$", "\\$ "), ("{", "\\{ "),
    ("}", "\\} "), ("\\", "\\backslash "), ("@", "\\mathbin{@} "),
]
_REF = r"\(?\b00[0-4](?:,?\s*(?:eqs?\.\s*[\d.]+(?:[-–][\d.]+)?|§\s*[\d.]+(?:[-–][\d.]+)?|ch\.\s*\d+(?:[-–]\d+)?|Figure\s+\d+))*\)?"
_TOKEN = re.compile(rf"""
    (?P<ref>{_REF})
  | (?P<str>"[^"]*"|'[^'\s][^']*'(?=[\s,:;)\]]|$))
  | (?P<code>``?[^`]+``?)
  | (?P<gap>\s{{2,}})
  | (?P<space>\s)
  | (?P<snake>[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+){{2,}}|[A-Za-z][A-Za-z0-9]{{2,}}_[A-Za-z][A-Za-z0-9]{{3,}})
  | (?P<word>[A-Za-z][A-Za-z0-9]*(?:-[a-z]+)*)
  | (?P<num>\d+(?:\.\d+)?(?:e-?\d+)?)
  | (?P<script>[_^])
  | (?P<op>-->|->|<-|=>|<=|>=|!=|\+-|\.\.\.|\.\.|\|\||:=|==|.)
""", re.X)


def _text(s, kind="text"):
    """Text inside math: ``\\text{ s }`` (``\\texttt`` for code). While :func:`to_mathml`
    converts, ``_TEXTS`` holds the words and the TeX holds their numbers, so that no
    character of the words can upset the TeX (latex2mathml takes text literally)."""
    if _TEXTS is not None:
        _TEXTS.append(s)
        s = f"zq{len(_TEXTS) - 1}zq"
    return f"\\{kind}{{ {s} }}" if kind == "text" else f"\\{kind}{{{s}}}"


_TEXTS = None


def _name(word, after):
    """TeX for one name; ``after`` is the text that follows it (a parenthesis: a call)."""
    if word in GREEK:
        return GREEK[word]
    m = re.fullmatch(r"([A-Za-z]+?)(hat|tilde|bar)", word)
    if m and word not in PROSE and len(m.group(1)) <= 2:
        base = m.group(1)
        d, base = ("d", base[1:]) if len(base) == 2 and base[0] == "d" else ("", base)
        return f"{d}{ACCENT_SUFFIX[m.group(2)]}{{{_name(base, '')}}}"
    m = re.fullmatch(r"([A-Za-z]+?)(\d+)", word)
    if m and (m.group(1) in GREEK or len(m.group(1)) == 1):
        return f"{_name(m.group(1), '')}_{{{m.group(2)}}}"
    if word in BIG:
        return BIG[word] + " "
    if word in STANDARD:
        return f"\\{word} "
    if word in FUNCTIONS:
        return f"\\operatorname{{{word}}}"
    if len(word) == 1:
        return word
    if len(word) >= 2 and word[0] == "d" and (word[1:] in GREEK or (len(word) == 2 and word[1].isalpha())):
        return "d" + _name(word[1:], after) + " "
    if word.lower() in PROSE or "-" in word:
        return _text(word)
    return f"\\mathit{{{word}}}"


def _script(word):
    """A subscript or superscript: letters as they are (``ij``, ``kv``, ``T``), a Greek name
    as its letter, a longer word as a name (``d_model``)."""
    if word in GREEK:
        return GREEK[word]
    return word if re.fullmatch(r"[A-Za-z]{1,3}|[A-Za-z]\d*", word) else f"\\mathit{{{word}}}"


def _snake(name, after):
    """A name with underscores: ``phi_Q_i`` -> phi_{Q,i}, ``n_kv_heads`` -> n_{kv_heads},
    ``attention_forward(`` -> a code name."""
    base, *rest = name.split("_")
    if len(base) > 1 and base[0] == "d" and (base[1:] in GREEK or len(base) == 2):
        return "d" + _snake(name[1:], after)                 # dphi_Q_i: d of phi_{Q,i}
    if base in GREEK or len(base) <= 2:
        if all(len(r) <= 2 for r in rest):
            return _name(base, "") + "_{" + ",".join(rest) + "}"
        return _name(base, "") + "_{\\mathit{" + "\\_".join(rest) + "}}"
    escaped = name.replace("_", "\\_")
    return _text(name, "texttt") if after == "(" else f"\\mathit{{{escaped}}}"


def to_tex(text):
    """The TeX of a line of the docstrings' plain-text math (docs/math.md)."""
    out = []
    closers = []                       # what each open bracket closes with: ")" or "}"
    pending = None                     # "sqrt" or a script that takes the next bracket as braces
    tokens = list(_TOKEN.finditer(text))
    for k, m in enumerate(tokens):
        kind, s = m.lastgroup, m.group()
        after = text[m.end():m.end() + 1]
        if kind in ("ref", "str"):
            out.append(_text(s))
        elif kind == "code":
            out.append(_text(s.strip("`"), "texttt"))
        elif kind == "gap":
            out.append("\\quad ")
        elif kind == "space":
            out.append(" ")
        elif kind == "snake":
            out.append(_snake(s, after))
        elif kind == "word":
            prev = out[-1] if out else ""
            if s in ACCENT_SUFFIX and prev.endswith("_"):      # m_hat: the accent on m
                out.pop()
                base = out.pop()
                out.append(f"{ACCENT_SUFFIX[s]}{{{base}}}")
                continue
            if s == "sqrt" and after == "(":
                pending = "sqrt"
                continue
            if prev.endswith(("_", "^")):                       # a script: x_ij, K^T
                out.append("{" + _script(s) + "}")
                continue
            out.append(_name(s, after))
        elif kind == "num":
            prev = out[-1] if out else ""
            out.append("{" + s + "}" if prev.endswith(("_", "^")) else s)
        elif kind == "script":
            out.append(s)
            nxt = text[m.end():m.end() + 1]
            if nxt == "(":
                pending = "script"
            elif nxt == "-" and re.match(r"-\w", text[m.end():]):   # x^-1, e^-x
                pending = "minus"
        elif kind == "op":
            if s == "(" and pending in ("sqrt", "script"):
                out.append("\\sqrt{" if pending == "sqrt" else "{")
                closers.append("}")
                pending = None
            elif s == "-" and pending == "minus":
                out.append("{-")
                closers.append("minus")
                pending = None
                continue
            elif s in "([":
                out.append("(" if s == "(" else "[")
                closers.append(")" if s == "(" else "]")
            elif s in ")]":
                if closers:
                    c = closers.pop()
                    out.append("}" if c == "}" else s)
                else:
                    out.append(s)
            elif s == "{" and out and out[-1].endswith(("_", "^")):
                out.append("{")
                closers.append("brace")
            elif s == "}" and closers and closers[-1] == "brace":
                closers.pop()
                out.append("}")
            elif s == "~" and out and re.fullmatch(r"[A-Za-z]|\\[a-z]+", out[-1]):
                out.append(f"\\tilde{{{out.pop()}}}")
            else:
                out.append(dict(OPERATORS).get(s, s))
        if closers and closers[-1] == "minus" and kind in ("word", "num"):
            closers.pop()
            out.append("}")
    while closers:                      # unbalanced input: close what is open
        c = closers.pop()
        out.append("}" if c in ("}", "brace", "minus") else "")
    return re.sub(r" {2,}", " ", "".join(out)).strip()


def atoms(text):
    """``text`` cut at its spaces into the pieces a page may wrap between, never inside a
    radical, a script, a quoted string or a reference: ``"A = softmax(Q K^T) V"`` ->
    ["A", "=", "softmax(Q", "K^T)", "V"]. Each piece converts on its own (an ordinary
    bracket may open in one piece and close in another; browsers do not break MathML)."""
    out, cur, stack = [], [], []
    for m in _TOKEN.finditer(text):
        kind, s = m.lastgroup, m.group()
        before = text[:m.start()]
        if kind in ("space", "gap") and not any(stack):
            if cur:
                out.append("".join(cur))
            cur = []
            continue
        if kind == "op" and s in "([{":
            stack.append(bool(re.search(r"(?:sqrt|[_^])$", before)))
        elif kind == "op" and s in ")]}" and stack:
            stack.pop()
        cur.append(s)
    if cur:
        out.append("".join(cur))
    return out


_TEX_RELATION = re.compile(r"=|\\approx(?![a-z])|\\le(?![a-z])|\\ge(?![a-z])|\\to(?![a-z])|"
                           r"\\Rightarrow(?![a-z])|\\propto(?![a-z])|\\equiv(?![a-z])")
_TEX_AFTER = re.compile(r",|\\quad(?![a-z])|\\qquad(?![a-z])|\\,")


def tex_atoms(tex):
    """A TeX formula cut around its top-level relations (``=``, ``\\approx``, ...) and binary
    ``+`` and ``-``, and after its top-level commas and spaces (``\\,``, ``\\quad``), never
    inside braces, ``\\left...\\right`` or an environment: the pieces a page may wrap
    between."""
    out, start, depth, k = [], 0, 0, 0
    while k < len(tex):
        c = tex[k]
        if c == "\\":
            word = re.match(r"\\([A-Za-z]+|.)", tex[k:]).group()
            if word in ("\\left", "\\begin"):
                depth += 1
            elif word in ("\\right", "\\end"):
                depth -= 1
            if depth == 0 and _TEX_RELATION.match(tex, k):
                out += [tex[start:k], word]
                start = k + len(word)
            elif depth == 0 and _TEX_AFTER.match(tex, k):
                out.append(tex[start:k + len(word)])
                start = k + len(word)
            k += len(word)
            continue
        depth += c == "{"
        depth -= c == "}"
        binary = c == "+" or (c == "-" and re.search(r"[\w})\]|]\s*$", tex[start:k]))
        if depth == 0 and (c == "=" or binary):
            out += [tex[start:k], c]
            start = k + 1
        elif depth == 0 and c == ",":
            out.append(tex[start:k + 1])
            start = k + 1
        k += 1
    out.append(tex[start:])
    # spacing at the ends of a piece is the gap between pieces: drop it
    space = r"(?:\\(?:qquad|quad|[,;: ])(?![A-Za-z])|~|\s)+"
    out = [re.sub(rf"^{space}|{space}$", "", p) for p in out]
    return [p for p in out if p]


def tex_pieces_to_mathml(tex, *, display=False):
    """MathML for a TeX formula as a run of math elements, one per piece of
    :func:`tex_atoms`, that a line may break between (display style when ``display``)."""
    parts = tex_atoms(tex)
    if len(parts) <= 1:
        return tex_to_mathml(tex, display=display)
    return " ".join(tex_to_mathml("\\displaystyle " + p if display else p) for p in parts)


def tex_to_mathml(tex, *, display=False):
    """MathML for TeX (the notebooks' ``$...$``), by latex2mathml."""
    try:
        mathml = convert(tex, display="block" if display else "inline")
    except Exception as exc:            # latex2mathml raises many kinds; the page says which
        return (f'<math><merror><mtext>{html.escape(tex)} ({html.escape(type(exc).__name__)})'
                f"</mtext></merror></math>")
    # characters as themselves (the page is UTF-8), but the five that markup needs escaped
    return re.sub(r"&#x([0-9A-Fa-f]+);", lambda m: m.group() if chr(int(m.group(1), 16)) in "<>&\"'"
                  else chr(int(m.group(1), 16)), mathml)


def to_mathml(text, *, display=False):
    """MathML for a line of plain-text math, with the line itself as its title. ``display``
    sets it in display style (large operators, limits underneath) but inline, so that the
    pieces of a long equation can wrap."""
    if not text.strip():
        return ""
    global _TEXTS
    _TEXTS = texts = []
    try:
        tex = to_tex(text)
    finally:
        _TEXTS = None
    mathml = tex_to_mathml("\\displaystyle " + tex if display else tex)
    mathml = re.sub(r"zq(\d+)zq", lambda m: html.escape(texts[int(m.group(1))], quote=False), mathml)
    return mathml.replace("<math ", f'<math title="{html.escape(text.strip())}" ', 1)


def symbols(text):
    """The symbols a line of math names, spelled both ways: ``sigma_i`` -> {"sigma", "σ"}."""
    out = set()
    for w in re.findall(r"[A-Za-z]+", text):
        base = re.sub(r"(hat|tilde|bar|\d+)$", "", w) or w
        if base in GREEK:
            out |= {base, html.unescape(f"&{base};") if base != "eps" else "ε"}
        elif len(base) <= 3 and base not in PROSE:
            out.add(base)
    return out
