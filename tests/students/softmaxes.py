"""Softmax, log-softmax and cross-entropy, as a student writes them."""
import numpy as np

from . import Student


# --- softmax over the last axis -------------------------------------------------------------
def softmax(x):
    shifted = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(shifted)
    probs = e / np.sum(e, axis=-1, keepdims=True)
    return probs, {"probs": probs}


def softmax_back(dout, cache, mistake=None):
    p = cache["probs"]
    if mistake == "diagonal only":
        return dout * p * (1 - p)            # d p_i / d x_i = p_i (1 - p_i)
    if mistake == "without the subtraction":
        return p * dout
    if mistake == "plain mean":
        return p * (dout - dout.mean(axis=-1, keepdims=True))
    if mistake == "log-softmax's backward":
        return dout - p * dout.sum(axis=-1, keepdims=True)
    dot = np.sum(dout * p, axis=-1, keepdims=True)
    return p * (dout - dot)


# --- log-softmax, rows in a loop --------------------------------------------------------------
def log_softmax(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        row = x[i]
        m = row.max()
        out[i] = row - m - np.log(np.exp(row - m).sum())
    return out, out


def log_softmax_back(dout, out, mistake=None):
    p = np.exp(out)
    if mistake == "without the subtraction":
        return dout.copy()
    if mistake == "diagonal only":
        return dout * (1 - p)
    if mistake == "softmax's backward":
        return p * (dout - (dout * p).sum(axis=1)[:, None])
    return dout - p * dout.sum(axis=1)[:, None]


# --- cross-entropy: mean over the counted positions, optional smoothing and ignored ids ------
def make_cross_entropy(smoothing=0.0, ignore=None):
    def cross_entropy(logits, targets):
        z = logits - logits.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        K = logits.shape[-1]
        valid = np.ones(targets.shape, bool) if ignore is None else targets != ignore
        safe = np.where(valid, targets, 0)
        onehot = np.eye(K)[safe]
        q = (1 - smoothing) * onehot + smoothing / K
        per_position = -(q * logp).sum(axis=-1)
        n = max(int(valid.sum()), 1)
        loss = np.sum(per_position * valid) / n
        return loss, (logp, onehot, valid, n, K)
    return cross_entropy


def make_cross_entropy_back(smoothing=0.0, mistake=None):
    def backward(dout, cache):
        logp, onehot, valid, n, K = cache
        p = np.exp(logp)
        q = (1 - smoothing) * onehot + smoothing / K
        if mistake == "label smoothing left out":
            q = onehot
        if mistake == "log-probabilities for probabilities":
            p = logp
        grad = (p - q) * dout
        if mistake != "ignored positions not zeroed":
            grad = grad * valid[..., None]
        if mistake == "sum instead of mean":
            return grad, None
        if mistake == "divided by every position":
            return grad / valid.size, None
        return grad / n, None
    return backward


def _cases():
    rng = np.random.default_rng(12)
    out = [Student("softmax", None, softmax, softmax_back, (rng.standard_normal((2, 3, 6)),), ("x",)),
           Student("log_softmax", None, log_softmax, log_softmax_back,
                   (rng.standard_normal((4, 6)),), ("x",))]
    for m in ("diagonal only", "without the subtraction", "plain mean", "log-softmax's backward"):
        out.append(Student("softmax", m, softmax, lambda d, c, m=m: softmax_back(d, c, m),
                           (rng.standard_normal((2, 3, 6)),), ("x",)))
    for m in ("without the subtraction", "diagonal only", "softmax's backward"):
        out.append(Student("log_softmax", m, log_softmax, lambda d, c, m=m: log_softmax_back(d, c, m),
                           (rng.standard_normal((4, 6)),), ("x",)))
    names = ("logits", "targets")
    targets = rng.integers(0, 5, size=(2, 3))
    plain = (rng.standard_normal((2, 3, 5)), targets)
    out.append(Student("cross_entropy", None, make_cross_entropy(), make_cross_entropy_back(),
                       plain, names))
    for m in ("sum instead of mean", "log-probabilities for probabilities"):
        out.append(Student("cross_entropy", m, make_cross_entropy(),
                           make_cross_entropy_back(mistake=m),
                           (rng.standard_normal((2, 3, 5)), targets), names))
    out.append(Student("cross_entropy", "label smoothing left out", make_cross_entropy(0.1),
                       make_cross_entropy_back(0.1, "label smoothing left out"),
                       (rng.standard_normal((6, 5)), rng.integers(0, 5, size=6)), names))
    ignored = rng.integers(0, 5, size=(2, 4))
    ignored[0, 1] = ignored[1, 3] = -100
    for m in (None, "ignored positions not zeroed", "divided by every position"):
        out.append(Student("cross_entropy", m, make_cross_entropy(0.0, -100),
                           make_cross_entropy_back(0.0, m),
                           (rng.standard_normal((2, 4, 5)), ignored), names))
    return out


CASES = _cases()
