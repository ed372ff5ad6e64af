"""numpytfmr/seq2seq.py: teacher forcing (003 eq. 2.2): the decoder reads tgt_ids[:, :-1]
and is scored on tgt_ids[:, 1:], where the loss mask says."""
import numpy as np
import pytest

from numpytfmr.seq2seq import IGNORE, teacher_forcing


def test_inputs_are_the_targets_shifted_right():
    tgt = np.array([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    inputs, targets = teacher_forcing({"src_ids": np.zeros((2, 3), int), "tgt_ids": tgt}, "f")
    np.testing.assert_array_equal(inputs, tgt[:, :-1])
    np.testing.assert_array_equal(targets, tgt[:, 1:])          # no mask: every next token


def test_the_loss_mask_turns_unscored_targets_into_ignore():
    tgt = np.array([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=bool)
    _, targets = teacher_forcing({"src_ids": None, "tgt_ids": tgt, "loss_mask": mask}, "f")
    np.testing.assert_array_equal(targets, [[5, 6, 7, 2], [8, 2, IGNORE, IGNORE]])


@pytest.mark.parametrize("batch,exc,match", [
    ((np.zeros((2, 3), int),), TypeError, r"f: batch is a tuple; expected a dict"),
    ({"tgt_ids": np.zeros((2, 3), int)}, ValueError, r"expected a key 'src_ids'"),
    ({"src_ids": 0, "tgt_ids": np.zeros((2, 1), int)}, ValueError, r"batch\['tgt_ids'\] has shape \(2, 1\)"),
    ({"src_ids": 0, "tgt_ids": np.zeros((2, 3))}, TypeError, r"batch\['tgt_ids'\]"),
    ({"src_ids": 0, "tgt_ids": np.zeros((2, 3), int), "loss_mask": np.ones((2, 2), bool)}, ValueError,
     r"loss_mask has dtype bool and shape \(2, 2\)"),
])
def test_bad_batches_are_refused_naming_what_is_wrong(batch, exc, match):
    with pytest.raises(exc, match=match):
        teacher_forcing(batch, "f")
