"""numpytfmr/embedding.py: lookups, and repeated ids accumulating their gradients.
"""
import numpy as np

from numpytfmr import embedding_backward, embedding_forward


def test_embedding_lookup_and_repeated_ids_accumulate():
    table = np.arange(12.0).reshape(4, 3)
    ids = np.array([[1, 3, 1], [1, 0, 3]])
    out, cache = embedding_forward(ids, table)
    np.testing.assert_array_equal(out, table[ids])
    none, dtable = embedding_backward(np.ones((2, 3, 3)), cache)
    assert none is None
    np.testing.assert_array_equal(dtable, [[1, 1, 1], [3, 3, 3], [0, 0, 0], [2, 2, 2]])
    out[0, 0, 0] = 99.0  # the output is a copy, not a view of the table
    assert table[1, 0] == 3.0
