"""Markdown and Python for the reader's pages, by markdown-it-py and Pygments.

:func:`markdown_to_html`: CommonMark with tables, TeX as MathML, raw HTML escaped, headings
with GitHub's anchor ids. :func:`highlight_lines`: a Python source's lines, each with its
end-of-line comment apart (the reader sets it as math beside the line).
"""
import html
import re
from dataclasses import dataclass

from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin
from pygments.lexers import PythonLexer
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String

from .plainmath import tex_pieces_to_mathml

__all__ = ["markdown_to_html", "inline", "slugify", "Line", "highlight_lines", "highlight_block"]


def _e(text):
    # backslashes as character references: the page's HTML never spells a TeX command
    return html.escape(text, quote=True).replace("\\", "&#92;")


def slugify(text):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


# ---------------------------------------------------------------------------------------
# Python
# ---------------------------------------------------------------------------------------

@dataclass
class Line:
    """One source line: ``code`` (HTML, without an end-of-line comment), ``comment`` (the
    text of that comment without ``#``, or None), ``text`` (the plain code) and
    ``full_comment`` (the line is only a comment)."""
    code: str
    comment: str | None
    text: str
    full_comment: bool = False


_CLASSES = [(String.Doc, "ds"), (String, "str"), (Number, "num"), (Keyword, "kw"),
            (Name.Function, "fn"), (Name.Class, "fn"), (Name.Decorator, "dec"),
            (Name.Builtin.Pseudo, "sf"), (Name.Builtin, "bi"), (Operator, "op"), (Punctuation, "op")]


def _css_class(ttype):
    return next((cls for t, cls in _CLASSES if ttype in t), "")


def highlight_lines(source, *, linker=None):
    """The lines of ``source`` as :class:`Line` objects. ``linker(name)`` may return the URL
    of a name (not an attribute, not a keyword argument), which then becomes a link."""
    tokens = list(PythonLexer(stripnl=False, ensurenl=False).get_tokens(source))
    raw = source.splitlines()
    pieces, comments = [[] for _ in raw], [None] * len(raw)
    row = 0
    significant = [k for k, (_, v) in enumerate(tokens) if v.strip()]
    position = {k: i for i, k in enumerate(significant)}
    for k, (ttype, value) in enumerate(tokens):
        if ttype in Comment.Single and row < len(raw):
            comments[row] = value[1:]
            continue
        cls = _css_class(ttype)
        link = None
        if linker and ttype is Name and k in position:
            i = position[k]
            before = tokens[significant[i - 1]][1] if i > 0 else ""
            after = tokens[significant[i + 1]][1] if i + 1 < len(significant) else ""
            if before != "." and after != "=":
                link = linker(value)
        for j, part in enumerate(value.split("\n")):
            if j:
                row += 1
            if part and row < len(raw):
                frag = f'<span class="{cls}">{_e(part)}</span>' if cls else _e(part)
                if link:
                    frag = f'<a class="ref-link" href="{html.escape(link)}">{frag}</a>'
                pieces[row].append(frag)
    out = []
    for r, line in enumerate(raw):
        comment = comments[r]
        plain = line
        if comment is not None:
            plain = line[:line.rfind("#" + comment)].rstrip()
        full = comment is not None and not plain.strip()
        code = "".join(pieces[r])
        out.append(Line(code if full else code.rstrip(), comment, plain, full))
    return out


def highlight_block(code, *, python=True, linker=None):
    """A ``<pre>`` block of ``code``: highlighted Python, or escaped plain text."""
    if python:
        body = "\n".join(l.code + ("" if l.comment is None else ("" if l.full_comment else "  ")
                                   + f'<span class="com">#{_e(l.comment)}</span>')
                         for l in highlight_lines(code, linker=linker))
    else:
        body = _e(code)
    return f'<pre class="code"><code>{body}</code></pre>'


# ---------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------

def _math(content, options):
    return tex_pieces_to_mathml(content.strip(), display=bool(options.get("display_mode")))


def _parser():
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.use(dollarmath_plugin, allow_space=True, allow_digits=False, double_inline=True,
           renderer=_math)
    rules = md.add_render_rule

    def heading_open(self, tokens, idx, options, env):
        title = tokens[idx + 1].content.replace("`", "")
        base = slugify(title)
        seen = env.setdefault("ids", {})
        n = seen.get(base, 0)
        seen[base] = n + 1
        tokens[idx].meta["id"] = base if n == 0 else f"{base}-{n}"
        return f'<{tokens[idx].tag} id="{tokens[idx].meta["id"]}">'

    def heading_close(self, tokens, idx, options, env):
        opener = next(t for t in reversed(tokens[:idx]) if t.type == "heading_open")
        hid = opener.meta["id"]
        return (f'<a class="anchor" href="#{hid}" aria-label="link to this section">#</a>'
                f"</{tokens[idx].tag}>")

    def link_open(self, tokens, idx, options, env):
        href = tokens[idx].attrGet("href") or ""
        target = env["link"](href) if env.get("link") else href
        env.setdefault("links", []).append(bool(target))
        return f'<a href="{_e(target)}">' if target else ""

    def link_close(self, tokens, idx, options, env):
        return "</a>" if env.get("links", [True]).pop() else ""

    def code_inline(self, tokens, idx, options, env):
        body = tokens[idx].content
        return env["code"](body) if env.get("code") else f"<code>{_e(body)}</code>"

    def fence(self, tokens, idx, options, env):
        token = tokens[idx]
        lang = token.info.strip().lower()
        python = lang in ("python", "py") or (not lang and bool(
            re.search(r"^\s*(import|from|def|class|print|\w+\s*=)", token.content, re.M)))
        return highlight_block(token.content.rstrip("\n"), python=python)

    def code_block(self, tokens, idx, options, env):
        return highlight_block(tokens[idx].content.rstrip("\n"), python=False)

    def image(self, tokens, idx, options, env):
        return _e(tokens[idx].content)        # the reader fetches nothing: the alt text

    for name, fn in (("heading_open", heading_open), ("heading_close", heading_close),
                     ("link_open", link_open), ("link_close", link_close),
                     ("code_inline", code_inline), ("fence", fence), ("code_block", code_block),
                     ("image", image)):
        rules(name, fn)
    rules("table_open", lambda self, tokens, idx, options, env: '<div class="table-wrap"><table>')
    rules("table_close", lambda self, tokens, idx, options, env: "</table></div>")
    return md


_MD = _parser()


def markdown_to_html(text, *, link=None, code=None):
    """HTML for a Markdown document. ``link(href)`` may rewrite a link's target (None drops
    the link and keeps its text); ``code(text)`` may render a code span."""
    return _MD.render(text, {"link": link, "code": code, "ids": {}})


def inline(text, *, link=None, code=None):
    """HTML for one line of inline Markdown (code spans, math, emphasis, links)."""
    return _MD.renderInline(text, {"link": link, "code": code})
