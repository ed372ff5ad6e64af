"""The student notes (numpytfmr/grading/contracts.py): read from the registry's TOML files, one
per registry topic, they cover exactly the registered ops and the gradable helpers, every piece
of them reaches a skeleton's docstrings, and a broken file or a missing TOML reader is named."""
import importlib
import os
import sys

import pytest

from numpytfmr.grading import contracts
from numpytfmr.grading.cases import helpers, resolve
from numpytfmr.registry import registry

try:
    import tomllib
except ModuleNotFoundError:                         # Python 3.10: the test extra brings tomli
    import tomli as tomllib

REGISTRY_DIR = os.path.dirname(importlib.import_module("numpytfmr.registry").__file__)
TOPICS = sorted(n[:-3] for n in os.listdir(REGISTRY_DIR)
                if n.endswith(".py") and n not in ("__init__.py", "check.py"))


def _raw(topic):
    with open(os.path.join(REGISTRY_DIR, f"{topic}.toml"), "rb") as f:
        return tomllib.load(f)


def test_one_notes_file_per_registry_topic():
    files = sorted(os.path.basename(p)[:-5] for p in contracts.notes_files())
    assert files == TOPICS


@pytest.mark.parametrize("topic", TOPICS)
def test_each_file_holds_the_ops_its_topic_registers_in_their_order(topic):
    registered = [spec.name for spec in importlib.import_module(f"numpytfmr.registry.{topic}").OPS]
    assert list(_raw(topic).get("ops", {})) == registered


def test_the_notes_cover_every_registered_op_and_helper_and_nothing_else():
    ops = [op for t in TOPICS for op in _raw(t).get("ops", {})]
    named_helpers = [h for t in TOPICS for h in _raw(t).get("helpers", {})]
    assert sorted(ops) == sorted(registry())
    assert sorted(named_helpers) == sorted(helpers())
    assert len(set(ops + named_helpers)) == len(ops) + len(named_helpers)
    assert set(contracts.NOTES) == set(registry()) | set(helpers())


def _words(text):
    return " ".join(text.split())


def _texts(pieces, dropped):
    for p in pieces or ():
        if isinstance(p, tuple):
            tag, p = p
            if (tag[1:] not in dropped) if tag.startswith("!") else (tag in dropped):
                continue
        if p.strip():
            yield p


@pytest.mark.parametrize("name", list(registry()) + list(helpers()))
def test_every_piece_of_the_notes_reaches_the_docstrings(name):
    notes = contracts.notes_for(name)
    tags = {p[0].lstrip("!") for f in contracts._PIECES for p in getattr(notes, f) or ()
            if isinstance(p, tuple)}
    for dropped in [()] + [(t,) for t in sorted(tags)]:
        item = resolve(name)
        if name in registry():
            fwd, bwd = item.spec.forward, item.spec.backward
            doc = (contracts.forward_doc(name, fwd, bwd.__name__, dropped) + "\n"
                   + contracts.backward_doc(name, fwd, bwd, dropped))
        else:
            doc = contracts.helper_doc(name, item.spec.reference, dropped)
            assert not (notes.cache or notes.suggest or notes.allowed or notes.grads
                        or notes.backward), f"{name}: a helper's docstring shows none of these"
        doc = _words(doc)
        texts = [notes.summary or "", notes.out]
        texts += [v for k, v in notes.params.items() if k not in dropped]
        for field in contracts._PIECES:
            texts += list(_texts(getattr(notes, field), dropped))
        for text in texts:
            assert _words(text) in doc, f"{name} (dropped {dropped}): {text!r} is not shown"


def test_the_wording_is_shared_across_files():
    # the attention file defines the mask wording, the efficient file uses it
    assert "${mask}" in open(os.path.join(REGISTRY_DIR, "efficient.toml"), encoding="utf-8").read()
    flash = contracts.notes_for("flash_attention")
    mask = [t for tag, t in (p for p in flash.text if isinstance(p, tuple)) if tag == "mask"]
    assert mask and mask[0].startswith("mask: True = may attend.")


def _write(tmp_path, text):
    path = tmp_path / "topic.toml"
    path.write_text(text, encoding="utf-8")
    return [str(path)]


def test_a_broken_notes_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"topic.toml: \[ops.relu\]: unknown key 'outt'"):
        contracts.load_notes(_write(tmp_path, '[ops.relu]\noutt = "x"\n'))
    with pytest.raises(ValueError, match=r"names unknown wording 'nope'.*hold erf"):
        contracts.load_notes(_write(tmp_path, '[wording]\nerf = "e"\n[ops.relu]\n'
                                              'text = ["${nope}"]\n'))
    with pytest.raises(ValueError, match="expected when and text"):
        contracts.load_notes(_write(tmp_path, '[ops.relu]\ntext = [{ if = "a", text = "b" }]\n'))
    with pytest.raises(ValueError, match="relu.*notes twice"):
        contracts.load_notes(_write(tmp_path, '[ops.relu]\nout = "a"\n[helpers.relu]\nout = "b"\n'))
    notes = contracts.load_notes(_write(tmp_path, '[wording]\nw = "word"\n[ops.relu]\n'
                                                  'text = ["a ${w}.", { when = "!p", text = "b" }]\n'))
    assert notes["relu"].text == ("a word.", ("!p", "b"))


def test_without_a_toml_reader_grading_keeps_its_options_and_the_docstrings_say_what_to_install(
        monkeypatch):
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    monkeypatch.setattr(contracts, "_NOTES", None)
    # what grading needs (resolve: the options never shown, the ones that go with a dropped one)
    assert contracts.notes_for("lora_linear").depends == {"dropout": ("rng", "train")}
    assert contracts.notes_for("sinusoidal_encoding").omit == ("dtype",)
    assert tuple(resolve("lora_linear", drop=["dropout"]).drop) == ("dropout", "rng", "train")
    assert "dtype" in resolve("sinusoidal_encoding").drop
    spec = registry()["softmax"]
    with pytest.raises(ModuleNotFoundError, match=r"tomli.*numpytfmr\[assignment\]"):
        contracts.forward_doc("softmax", spec.forward, "softmax_backward")

