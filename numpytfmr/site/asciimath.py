"""Plain-text math, as the docstrings and comments write it, to MathML.

The docstrings write equations the way one types them into a terminal::

    A = softmax(Q K^T * scale + M)          mu_i = (1/d) sum_j x_ij
    sigma_i = sqrt((1/d) sum_j (x_ij - mu_i)^2 + eps)

:func:`to_mathml` turns such a line into a ``<math>`` element that browsers draw natively:

- ``x_ij``, ``d_k``, ``x_{i,2k}`` are subscripts, ``K^T``, ``base^(2i/d)`` superscripts
  (parentheses around a script are dropped), ``m_hat`` and ``xhat`` carry a hat, ``x~``
  a tilde, ``q'`` a prime; ``beta1``, ``W1`` get their digit as a subscript;
- ``a/b`` (no spaces) divides the two neighbours, ``a / b`` the products on either side
  (up to a ``+``, ``-``, ``=``, a comma or a wide gap); ``(1/d)`` loses its parentheses;
- ``sqrt(...)`` is a radical; ``sum_j``, ``prod_i``, ``max_j``, ``mean_t`` put their
  index under the operator, ``sum_{i=2}^n`` both limits;
- Greek names (``alpha`` ... ``omega``, ``Phi``, ``eps``) become letters; ``dtheta``,
  ``dQ`` read as a d followed by the symbol;
- ``->``, ``<-``, ``<=``, ``>=``, ``!=``, ``*``, ``...`` become arrows, relations, a dot and
  an ellipsis;
- English words (``for``, ``over the row``), quoted strings, ````code```` and section
  references (``004 eq. 27``, ``003 §5.1.1``) stay text, so a line that mixes an equation
  and a remark reads as both.

Runs of two or more spaces, which the docstrings use to separate equations on one line,
stay visible gaps. The converter never raises: any text gives valid MathML.
"""
import html
import re

__all__ = ["to_mathml", "GREEK", "symbols"]

GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "eps": "ε",
    "varepsilon": "ε", "zeta": "ζ", "eta": "η", "theta": "θ", "iota": "ι", "kappa": "κ",
    "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ",
    "tau": "τ", "upsilon": "υ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ",
    "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ",
    "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
}
# Functions drawn upright and followed by an (invisible) function application.
FUNCTIONS = {
    "exp", "log", "ln", "sin", "cos", "tan", "tanh", "sinh", "cosh", "erf", "softmax",
    "sigmoid", "max", "min", "argmax", "argmin", "mean", "rowsum", "rowmax", "clip", "relu",
    "gelu", "silu", "act", "drop", "attn", "ffn", "cross", "Concat", "RoPE", "LN", "Var", "E",
    "sum", "prod", "abs", "diag", "rms", "Bernoulli", "round", "floor", "ceil", "sign", "det",
    "tr", "cumsum", "score", "sim", "Count", "IDF", "PPL", "PMI", "PPMI", "Phi", "phi",
}
# Operators whose subscript (and superscript) go under (and over) them.
BIG_OPERATORS = {"sum": "∑", "prod": "∏"}
LIMIT_FUNCTIONS = {"max", "min", "argmax", "argmin", "mean", "lim", "rowmax", "rowsum"}
NOT_DIFFERENTIALS = {"df", "dt", "do", "dp"}   # document frequency, a time step, ...
ACCENTS = {"hat": "^", "tilde": "~", "bar": "¯", "vec": "→", "dot": "˙"}
OPERATORS = {
    "*": "⋅", "-": "−", "->": "→", "-->": "⟶", "<-": "←", "=>": "⇒", "<=": "≤", ">=": "≥",
    "!=": "≠", "+-": "±", "||": "‖", "...": "…", "..": "…", "~": "∼", "==": "=", ":=": "≔",
}
# Words that are prose, not symbols: they are set as text, with their spaces.
PROSE = set("""
a an the of and or not nor but if else elif then when where while for from to into onto in
on at by with without over under per each every all any some no none only also as is are
be been being was were has have had do does done it its this that these those there here
which who whose what how why than so such same other another both either neither one two
three first last next previous new old own up down off again once more most less least
very too just even still yet ever never always often about above below between through
during before after since until within across along among around against toward towards
upon via vs like unlike whether because though although unless
row rows column columns token tokens position positions entry entries axis axes sequence
sequences head heads layer layers step steps term terms word words document documents
sentence sentences pair pairs plane planes feature features frequency frequencies
gradient gradients may attend allowed elementwise wise summed computed taken kept used
given applied called returned default defaults optional required exact exactly
approximately form forms gated delete insert substitute match produced consumed far
prefill afterwards cached re-projected recomputed keep keeps uniform population variance
normalized normalize normalization scaled scaling shift shifted identity path residual
decay momentum buffer skipped notes note paper fix definition printed variant variants
common logarithmically original never negative error errors large small relative raw
boolean sublinear augmented plain smooth lucene robertson okapi dangling links link
tolerance converged occurs occur absent corpus rotate rotation direction directions
divided multiplied added subtracted multiplications additions tensor tensors split swap
reshape exponent sine cosine interleaved half rank stabilized learned fixed absolute left
right yes
""".split())
_SECTION = (r"(?:\b\d{3}\s+)?(?:eqs?\.|§|ch\.|Figure|Table)\s*\d[\d.]*(?:\s*[-–]\s*\d[\d.]*)?"
            r"(?:,\s*(?:eqs?\.|§)\s*\d[\d.]*(?:\s*[-–]\s*\d[\d.]*)?)*")
_TOKEN = re.compile(r"""
  (?P<ws>[ \t]+)
| (?P<code>``[^`]+``|`[^`]+`)
| (?P<ref>""" + _SECTION + r""")
| (?P<str>"[^"\n]*"|(?<![\w)\]'])'[^'\n]*\s[^'\n]*'(?!\w))
| (?P<num>0x[0-9a-fA-F]+|\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d+|\.\d+)
| (?P<op>-->|->|<-|=>|<=|>=|!=|==|:=|\+-|\|\||\.\.\.|\.\.|//|[-+*/=<>|:,;.!?&%@#^_'~\\$])
| (?P<id>[^\W\d_][^\W_]*)
| (?P<open>[(\[{])
| (?P<close>[)\]}])
| (?P<other>.)
""", re.X | re.S)
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_BREAKS = {"+", "-", "=", "<", ">", "<=", ">=", "!=", "==", ":=", "->", "-->", "<-", "=>", ",",
           ";", ":", "~", "+-", "|", "||"}


def _e(text):
    return html.escape(text, quote=False)


# ---------------------------------------------------------------------------------------
# Tokens and bracket groups
# ---------------------------------------------------------------------------------------

class _Tok:
    __slots__ = ("kind", "text")

    def __init__(self, kind, text):
        self.kind, self.text = kind, text

    def __repr__(self):
        return f"{self.kind}:{self.text!r}"


class _Group:
    __slots__ = ("open", "close", "items", "kind")

    def __init__(self, open_, close, items):
        self.open, self.close, self.items, self.kind = open_, close, items, "group"

    @property
    def text(self):
        return self.open + "".join(i.text for i in self.items) + self.close


def _tokenize(text):
    return [_Tok(m.lastgroup, m.group()) for m in _TOKEN.finditer(text)]


def _group(tokens):
    """Nest the tokens by brackets; an unmatched closing bracket stays an operator and an
    unclosed group closes at the end."""
    stack = [("", [])]
    for t in tokens:
        if t.kind == "open":
            stack.append((t.text, []))
        elif t.kind == "close" and len(stack) > 1 and _PAIRS[stack[-1][0]] == t.text:
            open_, items = stack.pop()
            stack[-1][1].append(_Group(open_, t.text, items))
        elif t.kind == "close":
            stack[-1][1].append(_Tok("op", t.text))
        else:
            stack[-1][1].append(t)
    while len(stack) > 1:
        open_, items = stack.pop()
        stack[-1][1].append(_Group(open_, "", items))
    return stack[0][1]


# ---------------------------------------------------------------------------------------
# Rendered pieces: each knows whether it is an atom (an operand), an operator, a gap or text
# ---------------------------------------------------------------------------------------

class _Piece:
    __slots__ = ("kind", "ml", "op", "wide", "inner")

    def __init__(self, kind, ml, op="", wide=False, inner=None):
        self.kind, self.ml, self.op, self.wide = kind, ml, op, wide
        self.inner = inner      # for an atom that is a bracket group: its content, unbracketed

    def __repr__(self):
        return f"{self.kind}:{self.ml}"


def _mo(text, **attrs):
    extra = "".join(f' {k}="{v}"' for k, v in attrs.items())
    return f"<mo{extra}>{_e(text)}</mo>"


def _mi(text, normal=False):
    return f'<mi mathvariant="normal">{_e(text)}</mi>' if normal else f"<mi>{_e(text)}</mi>"


def _mtext(text, cls=None):
    c = f' class="{cls}"' if cls else ""
    return f"<mtext{c}>{_e(text)}</mtext>"


def _row(parts):
    return parts[0] if len(parts) == 1 else "<mrow>" + "".join(parts) + "</mrow>"


def _ident(name):
    """MathML for one identifier (no scripts)."""
    if name in GREEK:
        return _mi(GREEK[name], normal=name[0].isupper())
    m = re.fullmatch(r"([A-Za-z]|" + "|".join(sorted(GREEK, key=len, reverse=True)) + r")(\d+)", name)
    if m:                                                     # beta1, W1, k1
        return f"<msub>{_ident(m[1])}<mn>{m[2]}</mn></msub>"
    m = re.fullmatch(r"([a-zA-Z]|" + "|".join(GREEK) + r")hat", name)
    if m:                                                     # xhat
        return f'<mover accent="true">{_ident(m[1])}<mo>^</mo></mover>'
    if len(name) > 1 and name[0] == "d" and name not in FUNCTIONS and name not in NOT_DIFFERENTIALS and (
            len(name) == 2 and name[1].isalpha() or name[1:] in GREEK
            or re.fullmatch(r"[a-zA-Z]hat", name[1:])):      # dQ, dtheta, dxhat
        return "<mrow>" + _mi("d", normal=True) + _ident(name[1:]) + "</mrow>"
    if name == "inf":
        return _mi("∞")
    return _mi(name)


def _prose(items, i):
    """Is ``items[i]`` an English word (not a symbol)? A one-letter word ("a") only counts
    next to another word; a capitalised word counts when its lower case does."""
    t = items[i]
    if t.kind != "id":
        return False
    w = t.text
    if not (w in PROSE or len(w) > 1 and w[0].isupper() and w[1:].islower() and w.lower() in PROSE):
        return False
    if len(w) == 1:
        for j in (i - 2, i + 2):
            if 0 <= j < len(items) and items[(i + j) // 2].kind == "ws" and items[j].kind == "id" \
                    and len(items[j].text) > 1 and items[j].text.lower() in PROSE:
                return True
        return False
    return True


class _Parser:
    def __init__(self, display):
        self.display = display

    # -- atoms and scripts ------------------------------------------------------------

    def script(self, items, i, sub):
        """Read the script after ``_``/``^`` at ``items[i]``: (MathML, plain text, next index)."""
        if i >= len(items):
            return None, "", i
        it = items[i]
        if isinstance(it, _Group) and it.open in "({":
            inner = self.render(it.items)
            return _row(inner) if inner else "<mrow></mrow>", "".join(x.text for x in it.items), i + 1
        if it.kind == "op" and it.text in ("-", "<", "+") and i + 1 < len(items) \
                and items[i + 1].kind in ("id", "num"):
            nxt = items[i + 1]
            body = self.simple_atom(nxt) if nxt.kind == "id" else f"<mn>{nxt.text}</mn>"
            return "<mrow>" + _mo(OPERATORS.get(it.text, it.text)) + body + "</mrow>", \
                it.text + nxt.text, i + 2
        if it.kind == "id":
            return self.simple_atom(it) if not sub else self.sub_text(it.text), it.text, i + 1
        if it.kind == "num":
            return f"<mn>{it.text}</mn>", it.text, i + 1
        if it.kind == "op" and it.text == "'":
            return _mo("′"), "'", i + 1
        return None, "", i

    def sub_text(self, text):
        """A subscript written as letters: ``ij``, ``k``, ``model``, ``2k``."""
        if text in GREEK:
            return _ident(text)
        if len(text) == 1 or text.isdigit():
            return _mi(text) if text.isalpha() else f"<mn>{text}</mn>"
        if len(text) == 2 and text.isalpha() and text.islower():       # x_ij: two indices
            return "<mrow>" + _mi(text[0]) + _mi(text[1]) + "</mrow>"
        return _mi(text)

    def simple_atom(self, tok):
        if tok.kind == "num":
            return f"<mn>{tok.text}</mn>"
        return _ident(tok.text)

    def atom(self, items, i):
        """Parse one operand starting at ``items[i]``; return (piece, next index)."""
        it = items[i]
        # identifier with scripts, a call or an index
        if it.kind == "id":
            name = it.text
            j = i + 1
            sub = sup = None
            accent = None
            primes = 0
            tilde = False
            sub_text = ""
            while j < len(items):
                nxt = items[j]
                if nxt.kind == "op" and nxt.text == "_":
                    ml, txt, k = self.script(items, j + 1, True)
                    if ml is None:
                        break
                    if txt in ACCENTS:
                        accent, j = ACCENTS[txt], k
                        continue
                    if sub is None and len(name) > 2 and name not in GREEK and name not in BIG_OPERATORS \
                            and (name not in FUNCTIONS or name in LIMIT_FUNCTIONS) and len(txt) > 2 \
                            and txt.isalpha() and txt not in GREEK:   # rank_stabilized, max_norm: a name
                        name, j = f"{name}_{txt}", k
                        continue
                    if sub is not None:             # phi_Q_i, n_kv_heads: a second subscript
                        if sub_text.isalpha() and txt.isalpha() and len(sub_text + txt) > 3:
                            sub_text = f"{sub_text}_{txt}"
                            sub = _mi(sub_text)
                        else:
                            sub_text = f"{sub_text},{txt}"
                            sub = f"<mrow>{sub}<mo separator=\"true\">,</mo>{ml}</mrow>"
                        j = k
                        continue
                    sub, sub_text, j = ml, txt, k
                elif nxt.kind == "op" and nxt.text == "^" and sup is None:
                    ml, _, k = self.script(items, j + 1, False)
                    if ml is None:
                        break
                    sup, j = ml, k
                elif nxt.kind == "op" and nxt.text == "'":
                    primes, j = primes + 1, j + 1
                elif nxt.kind == "op" and nxt.text == "~" and not tilde and (
                        j + 1 >= len(items) or items[j + 1].kind in ("ws", "op")):
                    tilde, j = True, j + 1
                else:
                    break
            if name in BIG_OPERATORS:
                base = _mo(BIG_OPERATORS[name], largeop="true", movablelimits="true")
                return _Piece("atom", self.limits(base, sub, sup), op="bigop"), j
            if name == "sqrt" and j < len(items):
                nxt = items[j]
                if isinstance(nxt, _Group) and nxt.open == "(":
                    inner = self.render(nxt.items)
                    return _Piece("atom", f"<msqrt>{''.join(inner)}</msqrt>"), j + 1
                if nxt.kind in ("id", "num"):
                    return _Piece("atom", f"<msqrt>{self.simple_atom(nxt)}</msqrt>"), j + 1
            if name in LIMIT_FUNCTIONS and sub is not None and sup is None:
                base = _mi(name)
                return _Piece("atom", f"<munder>{base}{sub}</munder>", op="bigop"), j
            base = _ident(name)
            if accent:
                base = f'<mover accent="true">{base}<mo>{_e(accent)}</mo></mover>'
            if tilde:
                base = f'<mover accent="true">{base}<mo>~</mo></mover>'
            if primes:
                sup = _mo("′" * primes) if sup is None else "<mrow>" + _mo("′" * primes) + sup + "</mrow>"
            ml = self.scripts(base, sub, sup)
            # a call f(...) or an index a[...]
            while j < len(items) and isinstance(items[j], _Group) and items[j].open in "([":
                g = items[j]
                call = g.open == "(" and (name in FUNCTIONS or len(name) > 1 or name.isupper()
                                          or name in "fgLPpqhkN")
                inner = self.render(g.items)
                bracket = self.brackets(g, inner)
                ml = "<mrow>" + ml + (_mo("\u2061") if call else "") + bracket + "</mrow>"
                j += 1
                # a script after the call: softmax(x)_i, (...)^2
                if j + 1 < len(items) and items[j].kind == "op" and items[j].text in "^_":
                    s, _, k = self.script(items, j + 1, items[j].text == "_")
                    if s is not None:
                        ml = self.scripts(ml, s if items[j].text == "_" else None,
                                          s if items[j].text == "^" else None)
                        j = k
            return _Piece("atom", ml, op="func" if name in FUNCTIONS else ""), j
        if it.kind == "num":
            ml = f"<mn>{_e(it.text)}</mn>"
            j = i + 1
            if j + 1 < len(items) and items[j].kind == "op" and items[j].text == "^":
                s, _, k = self.script(items, j + 1, False)
                if s is not None:
                    ml, j = f"<msup>{ml}{s}</msup>", k
            return _Piece("atom", ml), j
        if isinstance(it, _Group):
            if self.is_prose_group(it):
                return _Piece("text", _mtext(it.text)), i + 1
            pieces = self.fractions(self.pieces(it.items))
            solid = [p for p in pieces if p.kind != "space"]
            if it.open == "(" and len(solid) == 1 and solid[0].ml.startswith("<mfrac>") and not (
                    i + 1 < len(items) and items[i + 1].kind == "op" and items[i + 1].text in "^_"):
                return solid[0], i + 1                   # (1/d): a fraction needs no brackets
            inner = self.join(pieces)
            ml = self.brackets(it, inner)
            j = i + 1
            while j + 1 < len(items) and items[j].kind == "op" and items[j].text in "^_":
                s, _, k = self.script(items, j + 1, items[j].text == "_")
                if s is None:
                    break
                ml = self.scripts(ml, s if items[j].text == "_" else None,
                                  s if items[j].text == "^" else None)
                j = k
                inner = None
            return _Piece("atom", ml, inner=inner if it.open == "(" else None), j
        if it.kind in ("str", "code"):
            text = it.text.strip("`") if it.kind == "code" else it.text
            return _Piece("atom", _mtext(text, "code" if it.kind == "code" else "str")), i + 1
        if it.kind == "ref":
            return _Piece("text", _mtext(it.text, "ref")), i + 1
        return None, i

    def scripts(self, base, sub, sup):
        if sub is not None and sup is not None:
            return f"<msubsup>{base}{sub}{sup}</msubsup>"
        if sub is not None:
            return f"<msub>{base}{sub}</msub>"
        if sup is not None:
            return f"<msup>{base}{sup}</msup>"
        return base

    def limits(self, base, sub, sup):
        if sub is not None and sup is not None:
            return f"<munderover>{base}{sub}{sup}</munderover>"
        if sub is not None:
            return f"<munder>{base}{sub}</munder>"
        if sup is not None:
            return f"<mover>{base}{sup}</mover>"
        return base

    def brackets(self, g, inner):
        open_ = {"{": "{"}.get(g.open, g.open)
        parts = [_mo(open_)] + inner + ([_mo(g.close)] if g.close else [])
        return "<mrow>" + "".join(parts) + "</mrow>"

    @staticmethod
    def is_prose_group(g):
        if g.open != "(":
            return False
        words = [t.text for t in g.items if t.kind == "id"]
        refs = any(t.kind == "ref" for t in g.items)
        if refs and all(t.kind in ("ref", "ws", "op") for t in g.items):
            return True
        if not any(t.kind == "ws" for t in g.items):
            return False
        prose = [t.text for k, t in enumerate(g.items) if _prose(g.items, k)]
        if refs and len(prose) == len(words):
            return True
        return len(words) >= 2 and len(prose) >= 0.6 * len(words) and len(prose) >= 2 \
            and not any(isinstance(t, _Group) for t in g.items)

    # -- a sequence ---------------------------------------------------------------------

    def pieces(self, items):
        out = []
        i = 0
        while i < len(items):
            it = items[i]
            if it.kind == "ws":
                n = len(it.text.expandtabs(4))
                out.append(_Piece("space", "", wide=n >= 2))
                i += 1
                continue
            if _prose(items, i) and not self.attached(items, i):
                # a run of prose words (with single spaces and light punctuation)
                j, words = i, []
                while j < len(items):
                    t = items[j]
                    if _prose(items, j) and not self.attached(items, j):
                        words.append(t.text)
                    elif t.kind == "ws" and len(t.text) == 1 and j + 1 < len(items) and \
                            _prose(items, j + 1) and not self.attached(items, j + 1):
                        words.append(" ")
                    elif t.kind == "op" and t.text == "'" and words and words[-1] not in (" ", "-"):
                        words.append("'")
                    elif t.kind == "op" and t.text == "-" and words and j + 1 < len(items) \
                            and _prose(items, j + 1):
                        words.append("-")
                    else:
                        break
                    j += 1
                out.append(_Piece("text", _mtext("".join(words))))
                i = j
                continue
            piece, j = self.atom(items, i)
            if piece is not None:
                out.append(piece)
                i = j
                continue
            # an operator
            text = it.text
            if text in ("_", "^") and out and out[-1].kind != "space":
                ml, _, k = self.script(items, i + 1, text == "_")
                if ml is not None:              # ||g||^2, |x|_1: a script on what precedes it
                    prev = out[-1]
                    tag = "msup" if text == "^" else "msub"
                    out[-1] = _Piece("atom" if prev.kind != "op" else "op",
                                     f"<{tag}>{prev.ml}{ml}</{tag}>", op=prev.op)
                    i = k
                    continue
                out.append(_Piece("op", _mo(text), op=text))
            elif text in ("_", "^"):          # a stray script marker: show it as written
                out.append(_Piece("op", _mo(text), op=text))
            elif text == "$" or text == "\\":
                out.append(_Piece("op", _mo(text), op=text))
            elif text == "-" and self.unary(out):
                out.append(_Piece("op", _mo("−", form="prefix"), op="neg"))
            elif text == "*" and self.unary(out):       # f(*args): unpacking, not a product
                out.append(_Piece("op", _mo("*", form="prefix"), op="star"))
            elif text in (",", ";", ".", ":") and out and out[-1].kind != "space" and \
                    i + 1 < len(items) and items[i + 1].kind == "ws":
                out.append(_Piece("op", _mo(text, separator="true") if text != "." else _mo(text),
                                  op=text))
            else:
                out.append(_Piece("op", _mo(OPERATORS.get(text, text)), op=text))
            i += 1
        return out

    @staticmethod
    def attached(items, i):
        """Is the identifier at ``i`` followed by a script or a bracket (so a symbol)?"""
        j = i + 1
        quote = "" if _prose(items, i) else "'"
        return j < len(items) and (isinstance(items[j], _Group) and items[j].open in "([" or
                                   items[j].kind == "op" and items[j].text in ("_", "^", quote))

    @staticmethod
    def unary(out):
        k = len(out) - 1
        while k >= 0 and out[k].kind == "space":
            k -= 1
        return k < 0 or out[k].kind in ("op", "text") and out[k].op not in (")", "]")

    def fractions(self, pieces):
        """Combine ``a/b`` (the adjacent operands) and ``a / b`` (the products on either side)."""
        i = 0
        while i < len(pieces):
            p = pieces[i]
            if not (p.kind == "op" and p.op == "/"):
                i += 1
                continue
            tight = (i > 0 and pieces[i - 1].kind != "space") and \
                (i + 1 < len(pieces) and pieces[i + 1].kind != "space")
            lo = self.extent(pieces, i, -1, tight)
            hi = self.extent(pieces, i, +1, tight)
            if lo is None or hi is None:
                i += 1
                continue
            num = self.operand(pieces[lo:i])
            den = self.operand(pieces[i + 1:hi + 1])
            frac = _Piece("atom", f"<mfrac>{num}{den}</mfrac>")
            pieces[lo:hi + 1] = [frac]
            i = lo + 1
        return pieces

    @staticmethod
    def extent(pieces, i, step, tight):
        """Index of the far end of the operand of the ``/`` at ``i`` in direction ``step``."""
        j = i + step
        if not tight:
            while 0 <= j < len(pieces) and pieces[j].kind == "space" and not pieces[j].wide:
                j += step
        if not (0 <= j < len(pieces)) or pieces[j].kind != "atom":
            if step > 0 and 0 <= j < len(pieces) and pieces[j].op == "neg":
                pass
            else:
                return None
        end = j
        k = j + step
        while 0 <= k < len(pieces):
            q = pieces[k]
            if q.kind == "atom":
                if step < 0 and q.op == "bigop" and not tight:
                    end = k                      # sum_j x_ij / N: the sum belongs to the numerator
                    k += step
                    continue
                end = k
            elif q.kind == "space":
                if tight or q.wide:
                    break
            elif q.kind == "op" and q.op in ("*",) and not tight:
                pass
            elif q.kind == "op" and q.op == "neg" and step > 0 and k == j:
                pass
            else:
                break
            k += step
        # trailing spaces are not part of the operand
        while end != j and pieces[end].kind == "space":
            end -= step
        return end

    def operand(self, pieces):
        pieces = [p for p in pieces]
        while pieces and pieces[0].kind == "space":
            pieces.pop(0)
        while pieces and pieces[-1].kind == "space":
            pieces.pop()
        if len(pieces) == 1 and pieces[0].inner is not None:      # (a + b) / c: drop the brackets
            return _row(pieces[0].inner) if pieces[0].inner else "<mrow></mrow>"
        return _row(self.join(pieces)) if pieces else "<mrow></mrow>"

    @staticmethod
    def join(pieces):
        """The pieces' MathML, with spaces made visible between operands."""
        out = []
        prev = None
        for k, p in enumerate(pieces):
            if p.kind == "space":
                nxt = pieces[k + 1] if k + 1 < len(pieces) else None
                if p.wide and prev is not None and nxt is not None:
                    out.append('<mspace width="1.2em"></mspace>')
                elif prev is not None and nxt is not None and prev.kind in ("atom", "text") \
                        and nxt.kind in ("atom", "text"):
                    out.append('<mspace width="0.3em"></mspace>')
                continue
            out.append(p.ml)
            prev = p
        return out

    def render(self, items):
        """MathML parts (a list of strings) for a list of tokens and groups."""
        pieces = self.fractions(self.pieces(items))
        return self.join(pieces)

    def math(self, text):
        return "".join(self.render(_group(_tokenize(text.strip()))))


def to_mathml(text, *, display=False, strict=False):
    """The MathML ``<math>`` element for one line of plain-text math. It never raises:
    text it cannot parse is set as text (``strict=True`` raises instead, for the tests)."""
    attrs = ' display="block"' if display else ""
    try:
        body = _Parser(display).math(text)
    except Exception:  # noqa: BLE001 -- a reader must never fail on an odd docstring
        if strict:
            raise
        body = _mtext(text)
    annotation = f'<annotation encoding="text/plain">{_e(text.strip())}</annotation>'
    return f"<math{attrs}><semantics><mrow>{body}</mrow>{annotation}</semantics></math>"


_SYMBOL = re.compile(r"[^\W\d_][^\W_]*")


def symbols(text):
    """The symbols an equation line uses (identifiers that are not prose), for the search
    index: ``"mu_i = (1/d) sum_j x_ij"`` -> ``["mu", "μ", "d", "x"]``."""
    out = []
    for m in _SYMBOL.finditer(text):
        w = m.group()
        if w in PROSE or w in BIG_OPERATORS:
            continue
        for s in (w, GREEK.get(w)):
            if s and s not in out:
                out.append(s)
    return out
