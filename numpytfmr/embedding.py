"""Token embedding lookup (004 "x = E w"; learned position embeddings, 004 eq. 12).

The embedding of token id ``w`` is row ``w`` of the table ``E`` (V, d). The same lookup
serves the learned position embeddings ``P`` (N, d) of 004 eq. 12 with the positions as ids.
"""
import numpy as np

from .contract import backward_of, int_array, op

__all__ = ["embedding_forward", "embedding_backward"]


def row_ids(ids, name, where, args):
    """Integer ids that are rows of ``table``: each in ``[0, V)``."""
    return int_array(ids, name, where, high=args["table"].shape[0])


@op("ids: int (...)", "table: (V, d)", ids=row_ids)
def embedding_forward(ids, table):
    """Look up one row of ``table`` per id.

        out[..., :] = table[ids[...], :]

    ids: int array of any shape, values in [0, V)   table: (V, d)   ->  out: ids.shape + (d,)
    cache: {"ids", "table_shape"}
    """
    out = table[ids]                      # out_p = E[ids_p]  (fancy indexing: a copy, not a view)
    return out, {"ids": ids, "table_shape": table.shape}


@backward_of(embedding_forward)
def embedding_backward(dout, cache):
    """Gradient of :func:`embedding_forward`: each id's row of dout is added to its table row.

        dtable[v] = sum over positions p with ids[p] = v of dout[p]

    A repeated id accumulates (np.add.at, unlike ``dtable[ids] += dout`` which keeps only one).
    Returns (None, dtable): the integer ids take no gradient.
    """
    dtable = np.zeros(cache["table_shape"])
    np.add.at(dtable, cache["ids"], dout)  # dtable[ids_p] += dout_p, repeats accumulating
    return None, dtable
