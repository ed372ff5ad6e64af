"""Sequence log-probabilities, DPO (sigmoid, hinge, IPO), the Bradley-Terry loss and a reward
head, as a student writes them."""
import numpy as np

from . import Student


# --- sum of the completion's token log-probabilities ----------------------------------------
def seq_logprob(logits, targets, mask):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return (picked * mask).sum(-1), (np.exp(logp), targets, mask)


def seq_logprob_back(dout, cache, mistake=None):
    p, y, mask = cache
    onehot = np.eye(p.shape[-1])[y]
    m = np.ones_like(mask, dtype=float) if mistake == "mask ignored" else mask.astype(float)
    if mistake == "mean over tokens":
        m = m / m.sum(-1, keepdims=True)
    g = (dout[:, None] * m)[..., None]
    if mistake == "no softmax":
        return g * onehot, None, None
    return g * (onehot - p), None, None


# --- DPO -------------------------------------------------------------------------------------
def log_sigmoid(t):
    return -np.logaddexp(0, -t)


def make_dpo(beta=0.1, kind="sigmoid", eps=0.0):
    def dpo(pol_c, pol_r, ref_c, ref_r):
        h = (pol_c - ref_c) - (pol_r - ref_r)
        z = beta * h
        if kind == "sigmoid":
            loss = -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)
        elif kind == "hinge":
            loss = np.maximum(0.0, 1 - z)
        else:
            loss = (h - 1 / (2 * beta)) ** 2
        return loss.mean(), (h, z)

    def backward(dL, cache, mistake=None):
        h, z = cache
        n = h.size
        sig = lambda t: 1 / (1 + np.exp(-t))  # noqa: E731
        if kind == "sigmoid":
            if mistake == "sigmoid(+margin)":
                dz = -(1 - eps) * sig(z) + eps * sig(-z)
            elif mistake == "smoothing left out":
                dz = -sig(-z)
            else:
                dz = -(1 - eps) * sig(-z) + eps * sig(z)
            dh = beta * dz
        elif kind == "hinge":
            dh = -beta * ((z > 1) if mistake == "hinge indicator reversed" else (z < 1))
        else:
            target = 1 / beta if mistake == "ipo target 1/beta" else 1 / (2 * beta)
            dh = 2 * (h - target)
        dh = dh * dL / n
        return dh, -dh, None, None
    return dpo, backward


def bradley_terry(r_c, r_r):
    diff = r_c - r_r
    return np.mean(np.logaddexp(0, -diff)), diff


def bradley_terry_back(dL, diff, mistake=None):
    sign = -1.0 if mistake == "sigmoid(+d)" else 1.0
    g = -dL / (1 + np.exp(sign * diff)) / diff.size
    return g, -g


# --- a reward head: the last token's hidden state times w, plus b ----------------------------
def reward(hs, w, b):
    last = hs[:, -1, :]
    return last @ w + b, (hs, w)


def reward_back(dr, cache, mistake=None):
    hs, w = cache
    dhs = np.zeros_like(hs)
    if mistake == "pooling weights left out":
        dhs[:] = (dr[:, None] * w)[:, None, :]          # every token gets the gradient
    else:
        dhs[:, -1, :] = dr[:, None] * w
    return dhs, hs[:, -1, :].T @ dr, np.sum(dr)


def _logps(rng, n=6):
    rc, rr = -rng.uniform(5, 30, n), -rng.uniform(5, 30, n)
    return rc + rng.uniform(-3, 3, n), rr + rng.uniform(-3, 3, n), rc, rr


def _cases():
    rng = np.random.default_rng(21)
    out = []
    names = ("logits", "targets", "mask")

    def slp():
        mask = np.ones((2, 5), bool)
        mask[:, :2] = False
        mask[1, 4] = False
        return rng.standard_normal((2, 5, 6)), rng.integers(0, 6, size=(2, 5)), mask
    out.append(Student("sequence_logprobs", None, seq_logprob, seq_logprob_back, slp(), names))
    for m in ("mask ignored", "mean over tokens", "no softmax"):
        out.append(Student("sequence_logprobs", m, seq_logprob,
                           lambda d, c, m=m: seq_logprob_back(d, c, m), slp(), names))
    dnames = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")
    for kind, eps, mistakes in (("sigmoid", 0.0, ("sigmoid(+margin)",)),
                                ("sigmoid", 0.1, ("smoothing left out",)),
                                ("hinge", 0.0, ("hinge indicator reversed",)),
                                ("ipo", 0.0, ("ipo target 1/beta",))):
        fwd, back = make_dpo(0.1, kind, eps)
        inputs = _logps(rng)
        if kind == "hinge":                               # z = beta h kept away from the kink at 1
            h = rng.choice([-1.0, 1.0], 6) * rng.uniform(0.5, 8.0, 6)
            h[:2] = rng.uniform(12.0, 20.0, 2)
            inputs = (inputs[2] + (inputs[1] - inputs[3]) + h,) + inputs[1:]
        out.append(Student("dpo_loss", None, fwd, back, inputs, dnames))
        for m in mistakes:
            out.append(Student("dpo_loss", m, fwd, lambda d, c, m=m, b=back: b(d, c, m), inputs, dnames))
    bt = (rng.standard_normal(7), rng.standard_normal(7))
    out.append(Student("bradley_terry_loss", None, bradley_terry, bradley_terry_back, bt,
                       ("r_chosen", "r_rejected")))
    out.append(Student("bradley_terry_loss", "sigmoid(+d)", bradley_terry,
                       lambda d, c: bradley_terry_back(d, c, "sigmoid(+d)"),
                       (rng.standard_normal(7), rng.standard_normal(7)), ("r_chosen", "r_rejected")))
    rh = lambda: (rng.standard_normal((3, 4, 5)), rng.standard_normal(5), rng.standard_normal(()))  # noqa: E731
    out.append(Student("reward_head", None, reward, reward_back, rh(), ("h", "w_r", "b_r")))
    out.append(Student("reward_head", "pooling weights left out", reward,
                       lambda d, c: reward_back(d, c, "pooling weights left out"), rh(),
                       ("h", "w_r", "b_r")))
    return out


CASES = _cases()
