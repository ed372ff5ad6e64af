"""run/plot.py: the curves every training command draws (the ``plot`` extra)."""
import math

import numpy as np
import pytest

from numpytfmr.run import plot
from numpytfmr.run.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_running_mean():
    y = np.array([1.0, 3.0, 5.0, 7.0])
    assert plot._smoothed(y, 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert plot._smoothed(y, 1).tolist() == y.tolist()


def test_run_panels_draw_the_loss_and_each_metric():
    summary = {"loss_history": [3.0, 2.0, 1.5], "evals": [
        {"step": 0, "val_loss": 3.1, "exact_match": 0.0, "note": "x"},
        {"step": 3, "val_loss": 1.6, "exact_match": 0.5}]}
    panels = plot.run_panels(summary)
    assert [p["title"] for p in panels] == ["training", "val loss", "exact match"]
    assert list(panels[1]["lines"][0]["x"]) == [0, 3]
    assert [p["title"] for p in plot.run_panels(summary, ["exact_match"])] == ["training",
                                                                               "exact match"]


def test_pretrain_panel_is_in_bits_per_byte():
    s = {"loss_history": [math.log(2) * 2.0] * 4, "bytes_per_token": 2.0,
         "evals": [{"step": 0, "val_bits_per_byte": 8.0}, {"step": 4, "val_bits_per_byte": 1.5}],
         "ngram_bits_per_byte": {"trigram": 2.5}}
    (panel,) = plot.pretrain_panels(s)
    assert panel["lines"][0]["y"].tolist() == [1.0] * 4          # 2 nats/ln2/2 bytes
    assert panel["lines"][-1]["y"] == [8.0, 1.5] and panel["hlines"][0]["y"] == 2.5


def test_save_curves_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot.save_curves(tmp_path / "c.png", plot.run_panels(
        {"loss_history": [1.0, 0.5], "evals": [{"step": 2, "val_loss": 0.7}]}), "title")
    assert path == tmp_path / "c.png" and (tmp_path / "c.png").read_bytes().startswith(PNG)


def test_each_training_command_draws_into_its_run_folder(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    tiny = ["--steps", "2", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
            "--n-heads", "2", "--eval-every", "2", "--quiet"]
    assert main(["train", *tiny, "--n-test", "4", "--max-prompt-len", "3", "--out",
                 str(tmp_path / "gpt")]) == 0
    assert (tmp_path / "gpt" / "curves.png").read_bytes().startswith(PNG)
    assert f"curves: {tmp_path / 'gpt' / 'curves.png'}" in capsys.readouterr().out
    assert main(["train", *tiny, "--n-test", "4", "--max-prompt-len", "3", "--out", "none",
                 "--plot", str(tmp_path / "named.png")]) == 0
    assert (tmp_path / "named.png").read_bytes().startswith(PNG)
    assert main(["lora", "--base-steps", "4", "--max-prompt-len", "3", "--n-test", "4",
                 "--steps", "2", "--eval-every", "2", "--quiet", "--out",
                 str(tmp_path / "lora")]) == 0
    assert (tmp_path / "lora" / "curves.png").read_bytes().startswith(PNG)


def test_without_matplotlib_a_run_says_so_and_plot_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plot, "plot_available", lambda: False)
    tiny = ["--steps", "2", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
            "--n-heads", "2", "--eval-every", "2", "--quiet", "--n-test", "4",
            "--max-prompt-len", "3"]
    assert main(["train", *tiny, "--out", str(tmp_path / "gpt")]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "gpt" / "curves.png").exists()
    assert main(["train", *tiny, "--out", "none", "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot" in capsys.readouterr().err
