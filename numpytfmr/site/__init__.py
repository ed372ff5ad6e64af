"""The reader: an offline HTML site with each equation of the notes beside its code.

``numpytfmr docs -o site`` (or :func:`build_site`) writes it; docs/reader.md describes it and
the ``docs`` extra it needs. :mod:`.collect` gathers what is shown, :mod:`.pages` renders the
pages and :mod:`.build` writes them.
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
