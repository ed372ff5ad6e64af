"""An embedding lookup and inverted dropout, as a student writes them."""
import numpy as np

from . import Student


def embed(ids, E):
    return E[ids], (ids, E.shape)


def embed_back(dout, cache, mistake=None):
    ids, shape = cache
    dE = np.zeros(shape)
    if mistake == "dtable[ids] += dout":
        dE[ids] += dout
    else:
        flat_ids, flat_d = ids.reshape(-1), dout.reshape(-1, shape[1])
        for i, row in zip(flat_ids, flat_d):      # every occurrence adds its row
            dE[i] += row
    return None, dE


P_DROP = 0.3


def dropout(x):
    rng = np.random.default_rng(0)                # a fixed seed: the same mask every call
    keep = rng.random(x.shape) >= P_DROP
    return x * keep / (1 - P_DROP), keep


def dropout_back(dout, keep, mistake=None):
    if mistake == "not rescaled":
        return dout * keep
    if mistake == "divided by p":
        return dout * keep / P_DROP
    if mistake == "multiplied by 1 - p":
        return dout * keep * (1 - P_DROP)
    return dout * keep / (1 - P_DROP)


def _cases():
    rng = np.random.default_rng(14)
    ids = np.array([[1, 4, 1], [6, 1, 4]])
    out = [Student("embedding", None, embed, embed_back, (ids, rng.standard_normal((8, 5))),
                   ("ids", "table")),
           Student("embedding", "dtable[ids] += dout", embed,
                   lambda d, c: embed_back(d, c, "dtable[ids] += dout"),
                   (ids, rng.standard_normal((8, 5))), ("ids", "table")),
           Student("dropout", None, dropout, dropout_back, (rng.standard_normal((3, 6)),), ("x",))]
    for m in ("not rescaled", "divided by p", "multiplied by 1 - p"):
        out.append(Student("dropout", m, dropout, lambda d, c, m=m: dropout_back(d, c, m),
                           (rng.standard_normal((3, 6)),), ("x",)))
    return out


CASES = _cases()
