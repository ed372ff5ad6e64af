"""Token embedding lookup (004 "x = E w"; learned position embeddings, 004 eq. 12).

The embedding of token id ``w`` is row ``w`` of the table ``E`` (V, d). The same lookup
serves the learned position embeddings ``P`` (N, d) of 004 eq. 12 with the positions as ids.
"""
import numpy as np

from ._validate import float_array, int_array

__all__ = ["embedding_forward", "embedding_backward"]


def embedding_forward(ids, table):
    """Look up one row of ``table`` per id.

        out[..., :] = table[ids[...], :]

    ids: int array of any shape, values in [0, V)   table: (V, d)   ->  out: ids.shape + (d,)
    cache: {"ids", "table_shape", "dtype"}
    """
    where = "embedding_forward"
    table = float_array(table, "table", where)
    if table.ndim != 2:
        raise ValueError(f"{where}: table has shape {table.shape}; expected a matrix of shape (V, d)")
    ids = int_array(ids, "ids", where, low=0, high=table.shape[0])
    out = table[ids]  # fancy indexing copies, so the caller may modify out freely
    return out, {"ids": ids, "table_shape": table.shape, "dtype": table.dtype}


def embedding_backward(dout, cache):
    """Gradient of :func:`embedding_forward`: each id's row of dout is added to its table row.

        dtable[v] = sum over positions p with ids[p] = v of dout[p]

    A repeated id accumulates (np.add.at, unlike ``dtable[ids] += dout`` which keeps only one).
    Returns (None, dtable): the integer ids take no gradient.
    """
    V, d = cache["table_shape"]
    dtable = np.zeros((V, d), dtype=cache["dtype"])
    # flatten the positions: ids (P,), dout (P, d)
    np.add.at(dtable, cache["ids"].reshape(-1), dout.reshape(-1, d))
    return None, dtable
