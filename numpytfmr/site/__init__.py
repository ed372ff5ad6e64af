"""The reader: an offline HTML site with each equation of the notes beside its code.

``numpytfmr docs -o site`` (or :func:`build_site`) writes it. The site needs no network,
neither to build nor to view: the equations of the docstrings are drawn at build time as
MathML by latex2mathml (:mod:`.plainmath` spells the docstrings' plain-text math in TeX),
Markdown is rendered by markdown-it-py and code highlighted by Pygments (:mod:`.markup`),
and the style sheet and script are written beside the pages (:mod:`.assets`). These
libraries are the ``docs`` extra: ``pip install "numpytfmr[docs]"``.

- :mod:`.collect` gathers what is shown: the topic modules and the registry's ops, the
  data files docs/modules.toml and docs/errata.toml, the tests, the notebooks and the notes' references;
- :mod:`.pages` renders the pages; :mod:`.build` writes them.
"""
import importlib

__all__ = ["build_site", "render_site", "BuildResult", "SiteExistsError", "to_mathml", "tex_to_mathml"]
_HOME = {"build_site": "build", "render_site": "build", "BuildResult": "build",
         "SiteExistsError": "build", "to_mathml": "plainmath", "tex_to_mathml": "plainmath"}


def __getattr__(name):
    # loaded on use: the data files (tables, collect) need none of the docs extra's libraries
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
