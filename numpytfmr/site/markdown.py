"""A small Markdown-to-HTML converter for the pages the reader renders: ``docs/contract.md``,
the notebooks' markdown cells and the README's tables.

Blocks: ATX headings (with GitHub's anchor ids, so ``[x](#the-contract-layer)`` links
work), paragraphs, nested bullet and numbered lists, pipe tables, fenced code (Python
highlighted), block quotes, rules and ``$$ ... $$`` display math. Inline: ```code```,
``$math$`` (TeX, drawn as MathML by :mod:`texmath`), ``**bold**``, ``*italic*``/``_italic_``,
``[links](url)`` and ``<br>``. Everything else is escaped: the output never carries raw
HTML from the input.
"""
import html
import re

from .highlight import highlight_block
from .texmath import tex_to_mathml

__all__ = ["markdown_to_html", "slugify", "inline"]


def _e(text):
    return html.escape(text, quote=True)


def slugify(text):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_INLINE = re.compile(r"""
  (?P<code>`+)(?P<codebody>.+?)(?P=code)(?!`)
| \$\$(?P<dmath>[^$]+?)\$\$
| (?<![\w$\\])\$(?P<math>[^$\s][^$]*?)\$(?![\w$])
| !\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]*)\)
| \[(?P<ltext>[^\]]+)\]\((?P<href>[^)\s]+)\)
| \*\*(?P<bold>.+?)\*\*
| (?<![\w*])\*(?P<em>[^*\s](?:[^*]*?[^*\s])?)\*(?![\w*])
| (?<![\w_])_(?P<em2>[^_\s](?:[^_]*?[^_\s])?)_(?![\w_])
| (?P<br><br\s*/?>)
| (?P<url>https?://[^\s)<>]+)
""", re.X | re.S)


def inline(text, *, link=None, code=None):
    """Inline Markdown of ``text`` as HTML. ``link(href)`` may rewrite a link target (None:
    drop the link, keep its text); ``code(text)`` may render a code span (default: <code>)."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_e(text[pos:m.start()]))
        pos = m.end()
        if m.group("code"):
            body = m.group("codebody").strip()
            out.append(code(body) if code else f"<code>{_e(body)}</code>")
        elif m.group("dmath") is not None:
            out.append(tex_to_mathml(m.group("dmath"), display=True))
        elif m.group("math") is not None:
            out.append(tex_to_mathml(m.group("math")))
        elif m.group("src") is not None:
            out.append(_e(m.group("alt")))
        elif m.group("href") is not None:
            href = m.group("href")
            target = link(href) if link else href
            label = inline(m.group("ltext"), link=None, code=code)
            out.append(f'<a href="{_e(target)}">{label}</a>' if target else label)
        elif m.group("bold") is not None:
            out.append(f"<strong>{inline(m.group('bold'), link=link, code=code)}</strong>")
        elif m.group("em") is not None or m.group("em2") is not None:
            body = m.group("em") if m.group("em") is not None else m.group("em2")
            out.append(f"<em>{inline(body, link=link, code=code)}</em>")
        elif m.group("br"):
            out.append("<br>")
        elif m.group("url"):
            url = m.group("url")
            out.append(f'<a href="{_e(url)}">{_e(url)}</a>')
    out.append(_e(text[pos:]))
    return "".join(out)


def _split_row(line):
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells, cur, in_code = [], [], False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "`":
            in_code = not in_code
        if c == "\\" and i + 1 < len(line) and line[i + 1] == "|":
            cur.append("|")
            i += 2
            continue
        if c == "|" and not in_code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    cells.append("".join(cur).strip())
    return cells


def parse_table(lines):
    """The rows of a pipe table (header first) as lists of cell texts."""
    rows = [_split_row(l) for l in lines if l.strip()]
    return [r for k, r in enumerate(rows) if not (k == 1 and all(re.fullmatch(r":?-+:?", c) for c in r))]


_LIST = re.compile(r"^(?P<indent> *)(?P<marker>[-*+]|\d+[.)])\s+(?P<body>.*)$")


class _Renderer:
    def __init__(self, link, code, heading_ids):
        self.link, self.code = link, code
        self.ids = heading_ids if heading_ids is not None else {}

    def inl(self, text):
        return inline(text, link=self.link, code=self.code)

    def heading_id(self, text):
        base = slugify(re.sub(r"`", "", text))
        n = self.ids.get(base, 0)
        self.ids[base] = n + 1
        return base if n == 0 else f"{base}-{n}"

    def blocks(self, lines):
        out = []
        i = 0
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if not stripped:
                i += 1
                continue
            if stripped.startswith("```") or stripped.startswith("~~~"):
                fence = stripped[:3]
                lang = stripped[3:].strip().lower()
                indent = len(line) - len(line.lstrip())
                j = i + 1
                body = []
                while j < len(lines) and not lines[j].strip().startswith(fence):
                    body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                    j += 1
                code = "\n".join(body)
                out.append(highlight_block(code, python=lang in ("python", "py", "")
                                           and not lang == "text" and _looks_python(code, lang)))
                i = j + 1
                continue
            if stripped.startswith("$$"):
                j = i
                text = stripped[2:]
                if text.endswith("$$") and len(text) >= 2:
                    tex = text[:-2]
                    i += 1
                else:
                    parts = [text]
                    j = i + 1
                    while j < len(lines) and "$$" not in lines[j]:
                        parts.append(lines[j])
                        j += 1
                    if j < len(lines):
                        parts.append(lines[j].split("$$")[0])
                    tex = "\n".join(parts)
                    i = j + 1
                out.append(f'<div class="display-math">{tex_to_mathml(tex, display=True)}</div>')
                continue
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", stripped)
            if m:
                level = len(m.group(1))
                text = m.group(2)
                hid = self.heading_id(text)
                out.append(f'<h{level} id="{hid}">{self.inl(text)}'
                           f'<a class="anchor" href="#{hid}" aria-label="link to this section">#</a></h{level}>')
                i += 1
                continue
            if re.fullmatch(r"(-{3,}|\*{3,}|_{3,})", stripped):
                out.append("<hr>")
                i += 1
                continue
            if stripped.startswith("|") and i + 1 < len(lines) and \
                    re.fullmatch(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?", lines[i + 1].strip()):
                j = i
                while j < len(lines) and lines[j].strip().startswith("|"):
                    j += 1
                out.append(self.table(lines[i:j]))
                i = j
                continue
            if stripped.startswith(">"):
                j = i
                quoted = []
                while j < len(lines) and lines[j].strip().startswith(">"):
                    quoted.append(re.sub(r"^\s*> ?", "", lines[j]))
                    j += 1
                out.append(f"<blockquote>{self.blocks(quoted)}</blockquote>")
                i = j
                continue
            if _LIST.match(line) and (len(line) - len(line.lstrip())) < 4:
                j, html_list = self.list_block(lines, i)
                out.append(html_list)
                i = j
                continue
            if line.startswith("    ") and not out or line.startswith("    ") and \
                    (i == 0 or not lines[i - 1].strip()):
                j = i
                body = []
                while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                    body.append(lines[j][4:])
                    j += 1
                while body and not body[-1].strip():
                    body.pop()
                out.append(highlight_block("\n".join(body), python=False))
                i = j
                continue
            # a paragraph
            j = i
            para = []
            while j < len(lines) and lines[j].strip() and not self.starts_block(lines, j):
                para.append(lines[j].strip())
                j += 1
            if not para:
                para, j = [stripped], i + 1
            out.append(f"<p>{self.inl(' '.join(para))}</p>")
            i = j
        return "\n".join(out)

    @staticmethod
    def starts_block(lines, j):
        s = lines[j].strip()
        return bool(s.startswith("```") or s.startswith("#") or s.startswith("$$")
                    or s.startswith("|") or s.startswith(">") or
                    (_LIST.match(lines[j]) and len(lines[j]) - len(lines[j].lstrip()) < 4))

    def list_block(self, lines, i):
        first = _LIST.match(lines[i])
        base = len(first.group("indent"))
        ordered = first.group("marker")[0].isdigit()
        items = []
        j = i
        while j < len(lines):
            m = _LIST.match(lines[j])
            if m and len(m.group("indent")) == base and m.group("marker")[0].isdigit() == ordered:
                items.append([m.group("body")])
                content_indent = base + len(m.group("marker")) + 1
                j += 1
                while j < len(lines):
                    line = lines[j]
                    if not line.strip():
                        # a blank line continues the item if the next line is indented under it
                        if j + 1 < len(lines) and lines[j + 1].strip() and \
                                len(lines[j + 1]) - len(lines[j + 1].lstrip()) > base:
                            items[-1].append("")
                            j += 1
                            continue
                        break
                    indent = len(line) - len(line.lstrip())
                    m2 = _LIST.match(line)
                    if m2 and len(m2.group("indent")) <= base:
                        break
                    if indent <= base and (self.starts_block(lines, j)):
                        break
                    items[-1].append(line[min(indent, content_indent):] if indent >= content_indent
                                     else line.strip())
                    j += 1
                continue
            break
        tag = "ol" if ordered else "ul"
        start = ""
        if ordered:
            n = int(re.match(r"\d+", first.group("marker")).group())
            start = f' start="{n}"' if n != 1 else ""
        parts = []
        for body in items:
            if len(body) == 1 or all(not self.starts_block(body, k) and body[k].strip()
                                     for k in range(1, len(body))):
                parts.append(f"<li>{self.inl(' '.join(b.strip() for b in body))}</li>")
            else:
                head = []
                k = 0
                while k < len(body) and body[k].strip() and (k == 0 or not self.starts_block(body, k)):
                    head.append(body[k].strip())
                    k += 1
                parts.append(f"<li>{self.inl(' '.join(head))}{self.blocks(body[k:])}</li>")
        return j, f"<{tag}{start}>" + "".join(parts) + f"</{tag}>"

    def table(self, lines):
        rows = parse_table(lines)
        head, body = rows[0], rows[1:]
        th = "".join(f"<th>{self.inl(c)}</th>" for c in head)
        trs = "".join("<tr>" + "".join(f"<td>{self.inl(c)}</td>" for c in r) + "</tr>" for r in body)
        return f'<div class="table-wrap"><table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table></div>'


def _looks_python(code, lang):
    return lang in ("python", "py") or bool(re.search(r"^\s*(import|from|def|class|print|\w+\s*=)",
                                                       code, re.M))


def markdown_to_html(text, *, link=None, code=None, heading_ids=None):
    """HTML for a Markdown document (see the module docstring for what is understood)."""
    return _Renderer(link, code, heading_ids).blocks(text.splitlines())
