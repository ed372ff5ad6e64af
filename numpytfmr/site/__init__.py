"""The reader: an offline HTML site with each equation of the notes beside its code.

``numpytfmr docs -o site`` (or :func:`build_site`) writes it. The site needs no network,
neither to build nor to view: the equations of the docstrings are drawn at build time as
MathML (:mod:`.asciimath`, and :mod:`.texmath` for the notebooks' TeX), the code is
highlighted by the standard library's tokenizer (:mod:`.highlight`), and the style sheet
and script are written beside the pages (:mod:`.assets`).

- :mod:`.collect` gathers what is shown: the topic modules and the registry's ops, the
  data files docs/modules.toml and docs/errata.toml, the tests, the notebooks and the notes' references;
- :mod:`.pages` renders the pages; :mod:`.build` writes them.
"""
from .asciimath import to_mathml
from .build import BuildResult, SiteExistsError, build_site, render_site
from .texmath import tex_to_mathml

__all__ = ["build_site", "render_site", "BuildResult", "SiteExistsError", "to_mathml", "tex_to_mathml"]
