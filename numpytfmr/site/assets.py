"""The reader's style sheet and script, ``site.css`` and ``site.js`` beside this module
(package data), written into ``assets/`` of every site. No font, script or style is fetched
from anywhere: the math is MathML, drawn by the browser with its own math font.
"""
import pathlib

__all__ = ["CSS", "JS"]

CSS = (pathlib.Path(__file__).parent / "site.css").read_text(encoding="utf-8")
JS = (pathlib.Path(__file__).parent / "site.js").read_text(encoding="utf-8")
