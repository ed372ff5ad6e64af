"""One step of a GRU cell (no context vector), as a student writes it: gates stacked [r | z | h~]."""
import numpy as np

from . import Student


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def gru(e, h, We, Wh, b):
    d = h.shape[-1]
    pre = e @ We + b
    r = sigmoid(pre[:, :d] + h @ Wh[:, :d])
    z = sigmoid(pre[:, d:2 * d] + h @ Wh[:, d:2 * d])
    rh = r * h
    cand = np.tanh(pre[:, 2 * d:] + rh @ Wh[:, 2 * d:])
    h_new = z * h + (1 - z) * cand
    return h_new, (e, h, We, Wh, r, z, rh, cand)


def gru_back(dh_new, cache, mistake=None):
    e, h, We, Wh, r, z, rh, cand = cache
    d = h.shape[-1]
    dz = dh_new * (cand - h) if mistake == "dZ sign" else dh_new * (h - cand)
    dcand = dh_new * (1 - z)
    da_h = dcand if mistake == "no tanh derivative" else dcand * (1 - cand ** 2)
    da_z = dz * z * (1 - z)
    drh = da_h @ Wh[:, 2 * d:].T
    da_r = drh * h * r * (1 - r)
    da = np.concatenate([da_r, da_z, da_h], axis=1)
    dh = drh * r + da_r @ Wh[:, :d].T + da_z @ Wh[:, d:2 * d].T
    if mistake != "no direct path":
        dh = dh + dh_new * z
    dWh = np.zeros_like(Wh)
    dWh[:, :d] = h.T @ da_r
    dWh[:, d:2 * d] = h.T @ da_z
    dWh[:, 2 * d:] = (h if mistake == "h_prev for R h_prev" else rh).T @ da_h
    return da @ We.T, dh, e.T @ da, dWh, da.sum(axis=0)


def _cases():
    rng = np.random.default_rng(19)

    def inputs():
        return (rng.standard_normal((3, 4)), 0.8 * rng.standard_normal((3, 5)),
                rng.standard_normal((4, 15)) / 2, rng.standard_normal((5, 15)) / 2.2,
                0.3 * rng.standard_normal(15))
    names = ("e", "h_prev", "W_e", "W_h", "b")
    out = [Student("gru_cell", None, gru, gru_back, inputs(), names)]
    for m in ("no direct path", "dZ sign", "no tanh derivative", "h_prev for R h_prev"):
        out.append(Student("gru_cell", m, gru, lambda d, c, m=m: gru_back(d, c, m), inputs(), names))
    return out


CASES = _cases()
