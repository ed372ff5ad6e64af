"""Build the reader into a folder: :func:`build_site`.

The folder gets a marker file, ``.numpytfmr-site``, listing what was written: a folder that
carries it is rebuilt (files gone since are removed); any other non-empty folder is refused
unless ``force``. Each file is written to a temporary name and renamed.
"""
import os
import pathlib
import secrets
import time
from dataclasses import dataclass

from .assets import CSS, JS
from .collect import collect
from .pages import Site

__all__ = ["build_site", "BuildResult", "SiteExistsError", "MARKER"]

MARKER = ".numpytfmr-site"


class SiteExistsError(FileExistsError):
    """The output folder holds files that are not a numpytfmr site."""


@dataclass
class BuildResult:
    out_dir: pathlib.Path
    pages: list          # the HTML pages written, relative paths
    files: list          # every file written
    n_bytes: int
    seconds: float

    @property
    def index(self):
        return self.out_dir / "index.html"


def _check_target(out, force):
    if out.exists() and not out.is_dir():
        raise SiteExistsError(f"{out} is a file; expected a folder for the site")
    if not out.exists():
        return []
    marker = out / MARKER
    if marker.is_file():
        return [l for l in marker.read_text(encoding="utf-8").splitlines()[1:] if l.strip()]
    if any(out.iterdir()) and not force:
        raise SiteExistsError(f"{out} is not empty and holds no numpytfmr site (no {MARKER} file); "
                              "choose an empty or new folder, or pass --force to write the site's "
                              "files into it")
    return []


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{secrets.token_hex(6)}-{path.name}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def render_site(source=None, execute=False):
    """Every file of the site, as ``{relative path: text}`` (nothing is written). With
    ``execute``, the notebooks are run and their pages show their outputs and figures."""
    import numpytfmr
    model = collect(source, execute)
    site = Site(model, numpytfmr.__version__)
    bodies = {}                              # path -> (title, side, body, kind)
    for t in model.topics:
        side, body = site.topic_html(t)
        bodies[site.topic_page(t.module)] = (f"{t.module}.py", side, body, "topic")
    for kind, title, render in (("errata", "Errata", site.errata_html),
                                ("api", "API reference", site.api_html),
                                ("contract", "API contract", site.contract_html)):
        bodies[f"{kind}.html"] = (title, *render(), kind)
    for nb in model.notebooks:
        side, body = site.notebook_html(nb)
        bodies[site.nb_pages[nb.stem]] = (nb.title, side, body, "notebook")
    for name, text in model.test_sources.items():
        side, body = site.test_file_html(name, text)
        bodies[site.test_pages[name]] = (f"tests/{name}", side, body, "tests")
    # the index last: it adds the notes and notebooks to the search index, which every page carries
    side, body = site.index_html()
    bodies = {"index.html": ("The notes, equation by equation", side, body, "index"), **bodies}
    search = _dedupe(site.search)
    files = {path: site.frame(title, body, side=side, kind=kind, search=search)
             for path, (title, side, body, kind) in bodies.items()}
    files["assets/site.css"] = CSS
    files["assets/site.js"] = JS
    return files


def _dedupe(items):
    first = {}
    for it in items:
        first.setdefault((it["n"], it["u"]), it)
    return list(first.values())


def build_site(out_dir, *, force=False, source=None, execute=None):
    """Write the reader into ``out_dir``; return a :class:`BuildResult`.

    ``source``: the checkout holding README.md, docs/contract.md, notebooks/ and tests/
    (default: next to the package, else the current directory; without one, the pages come
    from the code alone). Raises :class:`SiteExistsError` for a non-empty folder that is not
    a site, unless ``force``. ``execute``: run the notebooks so that their pages show
    outputs and figures (default: when nbclient and a kernel are installed).
    """
    if execute is None:
        from .execute import can_execute
        execute = can_execute()
    start = time.perf_counter()
    out = pathlib.Path(out_dir)
    previous = _check_target(out, force)
    files = render_site(source, execute)
    out.mkdir(parents=True, exist_ok=True)
    n_bytes = 0
    for rel, text in files.items():
        data = text.encode("utf-8")
        n_bytes += len(data)
        _write(out / rel, data)
    for rel in previous:
        if rel not in files and ".." not in pathlib.PurePath(rel).parts:
            stale = out / rel
            if stale.is_file():
                stale.unlink()
    _write(out / MARKER, ("numpytfmr reader: the files of this site, rebuilt by `numpytfmr docs`\n"
                          + "\n".join(sorted(files)) + "\n").encode("utf-8"))
    pages = sorted(p for p in files if p.endswith(".html"))
    return BuildResult(out, pages, sorted(files), n_bytes, time.perf_counter() - start)
