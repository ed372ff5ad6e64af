"""The command line: ``numpytfmr`` and ``python -m numpytfmr`` are the same program."""
import subprocess
import sys

from conftest import COMMAND_TIMEOUT
from numpytfmr.run.cli import main


def test_check_one_op_passes(capsys):
    assert main(["check", "--op", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "softmax" in out and "PASS" in out


def test_check_unknown_op_is_a_usage_error(capsys):
    assert main(["check", "--op", "no_such_op"]) == 2
    assert "unknown op 'no_such_op'" in capsys.readouterr().err


def test_check_fails_on_a_broken_backward(monkeypatch, capsys):
    from numpytfmr.registry import registry
    import dataclasses
    spec = registry()["softmax"]

    def softmax_backward(dout, cache):  # the gradient of a sum, not of the softmax
        return spec.backward(dout, cache) * 2.0

    monkeypatch.setitem(registry(), "softmax", dataclasses.replace(spec, backward=softmax_backward))
    assert main(["check", "--op", "softmax"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_python_dash_m_is_the_same_program():
    proc = subprocess.run([sys.executable, "-m", "numpytfmr", "check", "--op", "relu"],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "relu" in proc.stdout


def test_no_command_prints_help():
    proc = subprocess.run([sys.executable, "-m", "numpytfmr"], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)
    assert proc.returncode == 2
    assert "check" in proc.stdout


# ---------------------------------------------------------------------------------------
# docs/commands.md against the parsers: every command and every flag, both ways
# ---------------------------------------------------------------------------------------

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

COMMANDS_PAGE = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "commands.md")


def _subparsers():
    from numpytfmr.run.cli import build_parser
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, action.choices


def _documented():
    """``{command: [first cells of the rows of its flag table]}``: the sections
    ``## numpytfmr COMMAND`` of docs/commands.md, and the summary table's commands."""
    with open(COMMANDS_PAGE, encoding="utf-8") as f:
        text = f.read()
    sections = {}
    for m in re.finditer(r"^## numpytfmr (\S+)\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        rows = re.findall(r"^\| (.+?) \| .* \|$", m.group(2), flags=re.M)
        sections[m.group(1)] = [r for r in rows if r != "flag" and not r.startswith("---")]
    summary = re.findall(r"^\| \[`([a-z0-9-]+)`\]\(#numpytfmr-\1\) \|", text, flags=re.M)
    return sections, summary


def _flags_in(cell):
    return set(re.findall(r"(?<![\w-])--?[a-z][a-z0-9-]*", cell))


def test_each_command_s_help_and_description_come_from_commands_json():
    """run/commands/commands.json holds the help and description of every command and of
    no other, the parsers show them, and the wheel packages the file."""
    from numpytfmr.run.options import _command_texts
    parser, commands = _subparsers()
    texts = _command_texts()
    assert sorted(texts) == sorted(commands)
    listed = {a.dest: a.help for a in next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction))._choices_actions}
    for name, sub in commands.items():
        assert texts[name]["help"] and listed[name] == texts[name]["help"]
        assert sub.description == texts[name]["description"]
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "pyproject.toml"),
              encoding="utf-8") as f:
        assert '"numpytfmr.run.commands" = ["commands.json"]' in f.read()


def test_the_commands_page_has_a_section_and_a_summary_row_per_command():
    _, commands = _subparsers()
    sections, summary = _documented()
    assert sorted(sections) == sorted(commands)
    assert sorted(summary) == sorted(commands)


@pytest.mark.parametrize("command", sorted(_subparsers()[1]))
def test_every_flag_of_the_command_is_on_the_page_and_every_flag_on_the_page_exists(command):
    """A flag added to a command needs its row in docs/commands.md (one row per flag, the
    flag in the first column), and a row of the page needs its flag."""
    sub = _subparsers()[1][command]
    sections, _ = _documented()
    cells = sections.get(command, [])
    documented = set().union(*map(_flags_in, cells)) if cells else set()
    flags = {s for a in sub._actions if not isinstance(a, argparse._HelpAction)
             for s in a.option_strings}
    missing = sorted(flags - documented)
    assert not missing, f"docs/commands.md, ## numpytfmr {command}: no row for {missing}"
    unknown = sorted(documented - flags)
    assert not unknown, f"docs/commands.md, ## numpytfmr {command}: {unknown} are not flags"
    for action in sub._actions:
        if not action.option_strings:              # a positional: its name heads a row
            name = action.metavar or action.dest.upper()
            assert any(cell.strip("`").startswith(name) for cell in cells), \
                f"docs/commands.md, ## numpytfmr {command}: no row for {name}"


def test_no_parser_accepts_abbreviations():
    parser, commands = _subparsers()
    assert parser.allow_abbrev is False
    assert all(sub.allow_abbrev is False for sub in commands.values())
    for argv, wrong in ((["pretrain", "--minute", "1"], "--minute"),
                        (["lora", "--minute", "1"], "--minute"),
                        (["dpo", "--minute", "1"], "--minute"),
                        (["generate", "--prompt", "1", "--temp", "1"], "--temp")):
        assert main(argv) == 2, argv


@pytest.mark.parametrize("argv, needles", [
    ([], ["tokenize", "pretrain", "lora --checkpoint", "--text", "--data rows.jsonl",
          "dpo --checkpoint", "prefs.jsonl", "export"]),
    (["lora"], ["--text", "--data", "prompt", "completion", "model of text"]),
    (["dpo"], ["--data", "chosen", "rejected", "model of text", "--full"]),
])
def test_the_help_describes_the_learners_own_data(argv, needles, capsys):
    assert main([*argv, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for needle in needles:
        assert needle in out, needle
