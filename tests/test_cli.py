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
