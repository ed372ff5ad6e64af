# Planted bug: the DPO loss with its sign flipped (+log sigma(z)), backward to match.


def dpo_loss_forward(policy_chosen, policy_rejected, ref_chosen, ref_rejected, *, beta=0.1,
                     label_smoothing=0.0, loss_type="sigmoid"):
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    z = beta * h
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = (1.0 - eps) * _log_sigmoid(z) + eps * _log_sigmoid(-z)
    elif loss_type == "hinge":
        losses = -np.maximum(0.0, 1.0 - z)
    else:
        losses = -(h - 1.0 / (2.0 * beta)) ** 2
    loss = np.asarray(losses.mean(), dtype=policy_chosen.dtype)
    return loss, {"h": h, "z": z, "beta": beta, "eps": eps, "loss_type": loss_type}


_correct_dpo_loss_backward = dpo_loss_backward


def dpo_loss_backward(dout, cache):
    d_chosen, d_rejected, _, _ = _correct_dpo_loss_backward(dout, cache)
    return -d_chosen, -d_rejected, None, None
