# Planted bug: the LoRA branch scaled by alpha instead of alpha/r.


def lora_linear_forward(x, W, A, B, b=None, *, alpha, rank_stabilized=False, dropout=0.0,
                        rng=None, train=True):
    r = A.shape[1]
    s = alpha / math.sqrt(r) if rank_stabilized else alpha
    y = x @ W
    if b is not None:
        y = y + b
    keep = None
    xd = x
    if train and dropout > 0:
        keep = (rng.random(x.shape) >= dropout).astype(x.dtype) / (1.0 - dropout)
        xd = x * keep
    u = xd @ A
    y = y + s * (u @ B)
    return y, {"xd": xd, "u": u, "W": W, "A": A, "B": B, "keep": keep, "s": s}
