"""Python syntax highlighting with the standard library's tokenizer.

:func:`highlight_lines` splits a source into lines, each with its highlighted code and,
separately, its end-of-line comment: the reader sets that comment (``# mu_i  (004 eq. 27)``)
as rendered math in a column beside the line. Names can be made links (``linker``), so a
call of ``masked_softmax`` in a body leads to its entry.
"""
import builtins
import html
import io
import keyword
import token
import tokenize
from dataclasses import dataclass

__all__ = ["Line", "highlight_lines", "highlight_block"]

_BUILTINS = {n for n in dir(builtins) if not n.startswith("_")}


@dataclass
class Line:
    """One source line: ``code`` (HTML, without an end-of-line comment), ``comment`` (the
    text of that comment without ``#``, or None), ``text`` (the plain code) and
    ``full_comment`` (the line is only a comment)."""
    code: str
    comment: str | None
    text: str
    full_comment: bool = False


def _e(text):
    # backslashes as character references: the page's HTML never spells a TeX command
    return html.escape(text, quote=True).replace("\\", "&#92;")


def _span(cls, text):
    return f'<span class="{cls}">{_e(text)}</span>' if cls else _e(text)


def highlight_lines(source, *, linker=None):
    """The lines of ``source`` as :class:`Line` objects (plain, escaped text when the
    source does not tokenize)."""
    raw = source.splitlines()
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [Line(_e(l), None, l) for l in raw]
    # pieces[r] = list of html fragments of line r (0-based), comments apart
    pieces = [[] for _ in raw]
    comments = [None] * len(raw)
    cursor = [0] * len(raw)                    # next column not yet emitted, per line
    prev_name = None
    prev_op = None
    for k, tok in enumerate(toks):
        kind, text, (r0, c0), (r1, c1) = tok.type, tok.string, tok.start, tok.end
        if kind in (token.ENDMARKER, token.INDENT, token.DEDENT) or r0 - 1 >= len(raw):
            continue
        if kind in (token.NEWLINE, token.NL):
            continue
        r0 -= 1
        r1 -= 1
        # the whitespace between the previous token and this one
        if c0 > cursor[r0]:
            pieces[r0].append(_e(raw[r0][cursor[r0]:c0]))
        if kind == token.COMMENT:
            comments[r0] = text[1:]
            cursor[r0] = c1
            continue
        cls = ""
        link = None
        if kind == token.NAME:
            if keyword.iskeyword(text) or text in ("match", "case") and c0 == len(raw[r0]) - len(raw[r0].lstrip()):
                cls = "kw"
            elif prev_name in ("def", "class"):
                cls = "fn"
            elif prev_op == "@":
                cls = "dec"
            elif text in ("self", "cls"):
                cls = "sf"
            elif text in _BUILTINS:
                cls = "bi"
            nxt = toks[k + 1].string if k + 1 < len(toks) else ""
            if linker and cls in ("", "dec") and prev_op != "." and nxt != "=":
                link = linker(text)                 # not an attribute, not a keyword argument
            prev_name = text
        else:
            prev_name = None
        if kind == token.NUMBER:
            cls = "num"
        elif kind == token.STRING:
            cls = "str"
            if text.lstrip("rRbBuUfF")[:3] in ('"""', "'''") and prev_op in (None, ":"):
                cls = "ds"
        elif kind == token.OP:
            cls = "dec" if text == "@" and c0 == len(raw[r0]) - len(raw[r0].lstrip()) else "op"
        prev_op = text if kind == token.OP else None
        if r0 == r1:
            frag = _span(cls, text)
            if link:
                frag = f'<a class="ref-link" href="{html.escape(link)}">{frag}</a>'
            pieces[r0].append(frag)
            cursor[r0] = c1
        else:                                   # a multi-line string: one span per line
            parts = text.split("\n")
            for k, part in enumerate(parts):
                r = r0 + k
                if r >= len(raw):
                    break
                if k > 0:
                    cursor[r] = 0
                pieces[r].append(_span(cls, part))
                cursor[r] = (c0 if k == 0 else 0) + len(part)
    out = []
    for r, line in enumerate(raw):
        if cursor[r] < len(line) and comments[r] is None:
            pieces[r].append(_e(line[cursor[r]:]))
        full = comments[r] is not None and not line[:_comment_column(line, comments[r])].strip()
        code = "".join(pieces[r])
        code = code if full else code.rstrip()
        plain = line
        if comments[r] is not None:
            hash_at = _comment_column(line, comments[r])
            plain = line[:hash_at].rstrip()
        out.append(Line(code, comments[r], plain, full))
    return out


def _comment_column(line, comment):
    at = line.rfind("#" + comment)
    return at if at >= 0 else len(line)


def highlight_block(code, *, python=True, linker=None, cls="code"):
    """A ``<pre>`` block of ``code``: highlighted Python, or escaped plain text."""
    if python:
        lines = highlight_lines(code, linker=linker)
        body = "\n".join(l.code + ("" if l.comment is None else
                                   ("" if l.full_comment else "  ") + _span("com", "#" + l.comment))
                         for l in lines)
    else:
        body = _e(code)
    return f'<pre class="{cls}"><code>{body}</code></pre>'
