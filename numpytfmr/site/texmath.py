"""The TeX that the notebooks' markdown cells use, to MathML.

The notebooks write their math as ``$...$`` and ``$$...$$`` TeX. The reader draws it at
build time, so a page never shows a backslash command and never needs a script: this
module understands the subset the notebooks use -- Greek letters, ``\\frac``,
``\\sqrt[n]{}``, scripts, ``\\hat``/``\\tilde``/``\\bar`` accents, ``\\mathbf``/``\\mathbb``/
``\\mathcal``/``\\mathrm``/``\\text``/``\\operatorname``, ``\\left``/``\\right`` and the
``\\big`` sizes, spacing commands, ``bmatrix``/``pmatrix``/``cases``/``aligned``
environments, and the usual operators and relations. An unknown command is drawn as its
name (never as raw TeX). :func:`tex_to_mathml` never raises.
"""
import html
import re

__all__ = ["tex_to_mathml"]

_GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ϵ", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "vartheta": "ϑ", "iota": "ι", "kappa": "κ",
    "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ",
    "tau": "τ", "upsilon": "υ", "phi": "ϕ", "varphi": "φ", "chi": "χ", "psi": "ψ",
    "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ", "Pi": "Π",
    "Sigma": "Σ", "Upsilon": "Υ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
}
_SYMBOLS = {
    "top": "⊤", "times": "×", "cdot": "⋅", "odot": "⊙", "otimes": "⊗", "oplus": "⊕",
    "partial": "∂", "nabla": "∇", "in": "∈", "notin": "∉", "mid": "∣", "to": "→",
    "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "Leftarrow": "⇐",
    "leftrightarrow": "↔", "Leftrightarrow": "⇔", "mapsto": "↦", "infty": "∞", "neq": "≠",
    "ne": "≠", "ge": "≥", "geq": "≥", "le": "≤", "leq": "≤", "ll": "≪", "gg": "≫", "sim": "∼",
    "approx": "≈", "equiv": "≡", "propto": "∝", "succ": "≻", "prec": "≺", "pm": "±", "mp": "∓",
    "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "langle": "⟨", "rangle": "⟩",
    "|": "‖", "{": "{", "}": "}", "dots": "…", "ldots": "…", "cdots": "⋯", "vdots": "⋮",
    "ddots": "⋱", "forall": "∀", "exists": "∃", "circ": "∘", "star": "⋆", "ast": "∗",
    "cup": "∪", "cap": "∩", "subset": "⊂", "subseteq": "⊆", "setminus": "∖", "emptyset": "∅",
    "land": "∧", "lor": "∨", "neg": "¬", "perp": "⊥", "parallel": "∥", "vert": "|",
    "Vert": "‖", "backslash": "∖", "prime": "′", "dagger": "†", "ell": "ℓ", "hbar": "ℏ",
    "quad": None, "qquad": None, "%": "%", "#": "#", "&": "&", "_": "_", "$": "$",
}
_BIG = {"sum": "∑", "prod": "∏", "int": "∫", "bigcup": "⋃", "bigcap": "⋂", "oint": "∮"}
_FUNCTIONS = {"log", "ln", "exp", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arg", "det",
              "dim", "ker", "deg", "gcd", "Pr", "sec", "csc", "cot", "arcsin", "arccos",
              "arctan"}
_LIMITS = {"max", "min", "lim", "sup", "inf", "argmax", "argmin", "limsup", "liminf"}
_SPACES = {",": "0.1667em", ":": "0.2222em", ">": "0.2222em", ";": "0.2778em", " ": "0.25em",
           "quad": "1em", "qquad": "2em", "!": None, "enspace": "0.5em", "thinspace": "0.1667em"}
_ACCENTS = {"hat": "^", "widehat": "^", "tilde": "~", "widetilde": "~", "bar": "¯",
            "overline": "¯", "vec": "→", "dot": "˙", "ddot": "¨", "check": "ˇ"}
_SIZES = {"big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr",
          "Biggl", "Biggr", "middle"}
_FONTS = {"mathbf", "mathbb", "mathcal", "mathrm", "mathit", "mathsf", "mathtt", "boldsymbol",
          "bm", "mathfrak", "mathscr"}
_ENV_FENCES = {"bmatrix": ("[", "]"), "pmatrix": ("(", ")"), "vmatrix": ("|", "|"),
               "Bmatrix": ("{", "}"), "matrix": ("", ""), "cases": ("{", ""),
               "aligned": ("", ""), "align": ("", ""), "align*": ("", ""), "array": ("", ""),
               "gathered": ("", ""), "split": ("", "")}
_TOKEN = re.compile(r"\\([A-Za-z]+)\*?|\\(.)|(\d+(?:\.\d+)?)|([A-Za-z])|(\s+)|(.)", re.S)


def _e(text):
    return html.escape(text, quote=False)


def _styled(char, font):
    """A letter in a math alphabet (bold, double-struck, calligraphic), as a Unicode character."""
    if font in ("mathbf", "boldsymbol", "bm"):
        if "A" <= char <= "Z":
            return chr(0x1D400 + ord(char) - 65)
        if "a" <= char <= "z":
            return chr(0x1D41A + ord(char) - 97)
        if "0" <= char <= "9":
            return chr(0x1D7CE + ord(char) - 48)
        bold_greek = {"α": 0x1D6C2, "β": 0x1D6C3, "θ": 0x1D6C9, "μ": 0x1D6CD, "σ": 0x1D6D4}
        if char in bold_greek:
            return chr(bold_greek[char])
    if font == "mathbb":
        special = {"C": "ℂ", "H": "ℍ", "N": "ℕ", "P": "ℙ", "Q": "ℚ", "R": "ℝ", "Z": "ℤ"}
        if char in special:
            return special[char]
        if "A" <= char <= "Z":
            return chr(0x1D538 + ord(char) - 65)
        if "0" <= char <= "9":
            return chr(0x1D7D8 + ord(char) - 48)
    if font in ("mathcal", "mathscr"):
        special = {"B": "ℬ", "E": "ℰ", "F": "ℱ", "H": "ℋ", "I": "ℐ", "L": "ℒ", "M": "ℳ", "R": "ℛ"}
        if char in special:
            return special[char]
        if "A" <= char <= "Z":
            return chr(0x1D49C + ord(char) - 65)
    return char


class _Tex:
    def __init__(self, text):
        self.toks = []
        for m in _TOKEN.finditer(text):
            if m.group(1):
                self.toks.append(("cmd", m.group(1)))
            elif m.group(2):
                self.toks.append(("sym", m.group(2)))
            elif m.group(3):
                self.toks.append(("num", m.group(3)))
            elif m.group(4):
                self.toks.append(("let", m.group(4)))
            elif m.group(5):
                self.toks.append(("ws", m.group(5)))
            else:
                self.toks.append(("chr", m.group(6)))
        self.i = 0

    def peek(self, skip_ws=True):
        j = self.i
        while skip_ws and j < len(self.toks) and self.toks[j][0] == "ws":
            j += 1
        return self.toks[j] if j < len(self.toks) else (None, None)

    def next(self, skip_ws=True):
        while skip_ws and self.i < len(self.toks) and self.toks[self.i][0] == "ws":
            self.i += 1
        if self.i >= len(self.toks):
            return (None, None)
        t = self.toks[self.i]
        self.i += 1
        return t

    def raw_group(self):
        """The text of the next ``{...}`` group, unparsed (for ``\\text`` and environment names)."""
        kind, val = self.next()
        if (kind, val) != ("chr", "{"):
            return "" if kind is None else val
        depth, out = 1, []
        while self.i < len(self.toks):
            kind, val = self.toks[self.i]
            self.i += 1
            if (kind, val) == ("chr", "{"):
                depth += 1
            elif (kind, val) == ("chr", "}"):
                depth -= 1
                if depth == 0:
                    break
            out.append("\\" + val if kind == "cmd" else val)
        return "".join(out)

    # -- expressions --------------------------------------------------------------------

    def seq(self, stop=()):
        """Parse until a closing ``}``, ``\\right``, ``&``, ``\\\\``, ``\\end`` or ``stop``."""
        parts = []
        while True:
            kind, val = self.peek()
            if kind is None or (kind, val) == ("chr", "}") or (kind == "cmd" and val in ("right", "end")) \
                    or (kind, val) == ("chr", "&") or (kind, val) == ("sym", "\\") or val in stop:
                return parts
            atom = self.atom()
            if atom is None:
                continue
            atom = self.scripts(atom)
            parts.append(atom)

    def group_or_atom(self):
        kind, val = self.peek()
        if kind == "num" and len(val) > 1:          # \frac12: one digit per argument
            self.next()
            self.i -= 1
            self.toks[self.i] = ("num", val[1:])
            return f"<mn>{val[0]}</mn>"
        if (kind, val) == ("chr", "{"):
            self.next()
            inner = self.seq()
            self.next()                    # the closing brace
            return _row(inner)
        atom = self.atom()
        return atom if atom is not None else "<mrow></mrow>"

    def scripts(self, base):
        sub = sup = None
        primes = ""
        while True:
            kind, val = self.peek()
            if (kind, val) == ("chr", "_") and sub is None:
                self.next()
                sub = self.group_or_atom()
            elif (kind, val) == ("chr", "^") and sup is None:
                self.next()
                sup = self.group_or_atom()
            elif (kind, val) == ("chr", "'"):
                self.next()
                primes += "′"
            else:
                break
        if primes:
            p = f"<mo>{primes}</mo>"
            sup = p if sup is None else f"<mrow>{p}{sup}</mrow>"
        limits = base.startswith("<mo largeop") or base.startswith('<mi data-limits="1"')
        if limits:
            base = base.replace(' data-limits="1"', "")
        if sub is not None and sup is not None:
            tag = "munderover" if limits else "msubsup"
            return f"<{tag}>{base}{sub}{sup}</{tag}>"
        if sub is not None:
            tag = "munder" if limits else "msub"
            return f"<{tag}>{base}{sub}</{tag}>"
        if sup is not None:
            tag = "mover" if limits else "msup"
            return f"<{tag}>{base}{sup}</{tag}>"
        return base

    def atom(self):
        kind, val = self.next()
        if kind is None:
            return None
        if kind == "let":
            return f"<mi>{val}</mi>"
        if kind == "num":
            return f"<mn>{val}</mn>"
        if kind == "chr":
            if val == "{":
                inner = self.seq()
                self.next()
                return _row(inner)
            if val in "_^":
                return f"<mo>{val}</mo>"
            if val == "~":
                return '<mspace width="0.25em"></mspace>'
            op = {"-": "−", "*": "∗", "'": "′"}.get(val, val)
            return f"<mo>{_e(op)}</mo>"
        if kind == "sym":
            if val in _SPACES:
                w = _SPACES[val]
                return f'<mspace width="{w}"></mspace>' if w else ""
            if val == "\\":
                return ""
            return f"<mo>{_e(_SYMBOLS.get(val, val))}</mo>"
        return self.command(val)

    def command(self, name):
        if name in _GREEK:
            normal = ' mathvariant="normal"' if name[0].isupper() else ""
            return f"<mi{normal}>{_GREEK[name]}</mi>"
        if name in ("frac", "tfrac", "dfrac", "cfrac"):
            num = self.group_or_atom()
            den = self.group_or_atom()
            return f"<mfrac>{num}{den}</mfrac>"
        if name == "binom":
            top = self.group_or_atom()
            bottom = self.group_or_atom()
            return f'<mrow><mo>(</mo><mfrac linethickness="0">{top}{bottom}</mfrac><mo>)</mo></mrow>'
        if name == "sqrt":
            index = None
            if self.peek() == ("chr", "["):
                self.next()
                index = _row(self.seq(stop=("]",)))
                self.next()
            body = self.group_or_atom()
            return f"<mroot>{body}{index}</mroot>" if index else f"<msqrt>{body}</msqrt>"
        if name in _ACCENTS:
            body = self.group_or_atom()
            return f'<mover accent="true">{body}<mo>{_ACCENTS[name]}</mo></mover>'
        if name in ("underbrace", "overbrace"):
            body = self.group_or_atom()
            mark = "⏟" if name == "underbrace" else "⏞"
            tag = "munder" if name == "underbrace" else "mover"
            return f"<{tag}>{body}<mo>{mark}</mo></{tag}>"
        if name in _FONTS:
            return self.font(name)
        if name in ("text", "textrm", "textit", "textbf", "mbox", "texttt"):
            return f"<mtext>{_e(self.raw_group())}</mtext>"
        if name == "operatorname":
            text = re.sub(r"\\,|\\;|\\!|\\", "", self.raw_group())
            return f"<mi>{_e(text)}</mi>"
        if name in ("left", "right") or name in _SIZES:
            kind, val = self.next()
            if kind is None or val == ".":
                return ""
            fence = _SYMBOLS.get(val, val) if kind in ("cmd", "sym") else val
            if name == "left":
                inner = self.seq()
                if self.peek() == ("cmd", "right"):
                    self.next()
                    k2, v2 = self.next()
                    close = "" if v2 in (".", None) else _SYMBOLS.get(v2, v2) if k2 in ("cmd", "sym") else v2
                else:
                    close = ""
                parts = [f'<mo fence="true">{_e(fence)}</mo>'] + inner + (
                    [f'<mo fence="true">{_e(close)}</mo>'] if close else [])
                return "<mrow>" + "".join(parts) + "</mrow>"
            return f'<mo stretchy="true">{_e(fence)}</mo>' if fence else ""
        if name == "begin":
            return self.environment(self.raw_group())
        if name in _BIG:
            return f'<mo largeop="true" movablelimits="true">{_BIG[name]}</mo>'
        if name in _LIMITS:
            return f'<mi data-limits="1">{name}</mi>'
        if name in _FUNCTIONS:
            return f'<mi>{name}</mi><mo rspace="0.1667em">\u2061</mo>'
        if name in _SPACES:
            w = _SPACES[name]
            return f'<mspace width="{w}"></mspace>' if w else ""
        if name in _SYMBOLS:
            return f"<mo>{_e(_SYMBOLS[name])}</mo>"
        if name in ("limits", "nolimits", "displaystyle", "textstyle", "scriptstyle"):
            return ""
        return f"<mi>{_e(name)}</mi>"          # unknown: its name, without the backslash

    def font(self, name):
        kind, val = self.peek()
        if (kind, val) == ("chr", "{"):
            text = self.raw_group()
        else:
            self.next()
            text = "\\" + val if kind == "cmd" else (val or "")
        if name == "mathrm" and not re.search(r"[\\{}^_]", text):
            return f"<mi>{_e(text)}</mi>" if len(text) > 1 else f'<mi mathvariant="normal">{_e(text)}</mi>'
        inner = _Tex(text).seq()
        if name in ("mathrm", "mathsf", "mathtt", "mathit", "mathfrak"):
            return _row(inner)
        # rewrite the letters of simple identifiers into the alphabet
        return _row([re.sub(r"<mi>([^<]+)</mi>",
                            lambda m: "<mi>" + "".join(_styled(c, name) for c in m.group(1)) + "</mi>",
                            p).replace("<mn>", "<mn>") for p in inner])

    def environment(self, env):
        open_, close = _ENV_FENCES.get(env, ("", ""))
        if env == "array":
            self.raw_group()                   # the column spec
        rows, row, cell = [], [], []
        while True:
            kind, val = self.peek()
            if kind is None:
                break
            if (kind, val) == ("cmd", "end"):
                self.next()
                self.raw_group()
                break
            if (kind, val) == ("chr", "&"):
                self.next()
                row.append(cell)
                cell = []
                continue
            if (kind, val) == ("sym", "\\"):
                self.next()
                row.append(cell)
                rows.append(row)
                row, cell = [], []
                continue
            if (kind, val) == ("chr", "}") or (kind, val) == ("cmd", "right"):
                self.next()
                continue
            cell += self.seq()
        if cell or row:
            row.append(cell)
            rows.append(row)
        table = "<mtable>" + "".join(
            "<mtr>" + "".join(f"<mtd>{_row(c) if c else ''}</mtd>" for c in r) + "</mtr>"
            for r in rows) + "</mtable>"
        parts = ([f'<mo fence="true">{_e(open_)}</mo>'] if open_ else []) + [table] + (
            [f'<mo fence="true">{_e(close)}</mo>'] if close else [])
        return "<mrow>" + "".join(parts) + "</mrow>"


def _row(parts):
    parts = [p for p in parts if p]
    if len(parts) == 1:
        return parts[0]
    return "<mrow>" + "".join(parts) + "</mrow>"


def tex_to_mathml(tex, *, display=False, strict=False):
    """The ``<math>`` element for a TeX formula (the notebooks' subset). It never raises:
    what it cannot parse is set as text (``strict=True`` raises instead, for the tests)."""
    attrs = ' display="block"' if display else ""
    try:
        parser = _Tex(tex)
        parts = []
        while parser.peek()[0] is not None:
            parts += parser.seq()
            if parser.peek()[0] is not None:
                parser.next()                  # a stray closing brace or \right
        body = "".join(parts)
    except Exception:  # noqa: BLE001
        if strict:
            raise
        body = f"<mtext>{_e(tex)}</mtext>"
    return f"<math{attrs}><mrow>{body}</mrow></math>"
