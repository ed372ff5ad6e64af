"""numpytfmr.fast: the same GPT as the reference, computed fast.

The reference (``numpytfmr.gpt_forward`` and the topic modules) is the notes' equations
written out; this package computes the same numbers with the tricks that make NumPy fast
(one matrix product per projection, key-major attention scores, BLAS row means and column
sums, in-place temporaries, a blocked float32 GELU, the softmax fused with the
cross-entropy, an in-place AdamW). Every entry point has the signature and the results of
its reference twin, and tests/test_fast.py checks them tensor by tensor::

    from numpytfmr import fast
    loss, grads = fast.gpt_loss(params, ids, targets, config=config)
    params, state = fast.adamw_step(params, grads, state, lr=1e-3)

``fast.mha_forward`` / ``fast.mha_backward`` are multi-head attention with the GQA groups
broadcast against their key/value head instead of repeated.

``fast.posttrain`` has the LoRA and DPO functions of ``numpytfmr.posttrain`` that run the
model (``gpt_lora_loss``, ``dpo_loss_and_grads``, ``complete_prompts``, ...), on the fast GPT.

Inputs are validated once at the entry; nothing inside the hot path checks again.

``gpt_loss`` keeps its activations in a :class:`Workspace` between calls (this thread's
``loss_workspace()`` unless one is passed): a training step reuses the same memory instead
of faulting in fresh pages. ``generate`` fuses the projections once per call, writes the
KV cache into buffers allocated at their final length and runs each new token through a
one-position step (no mask, no per-token checks), everything it needs looked up and
allocated once per call.

``fast.parallel`` runs the elementwise and row-wise passes (norms, GELU, softmax and the
attention of pairs of sequences, the cross-entropy, AdamW) in row blocks on
``parallel.workers()`` threads, the BLAS thread count when it is set through
``numpytfmr.run.blas`` (else 1; ``parallel.set_workers(n)`` sets it alone). The results
do not depend on that number, bit for bit.
"""
from . import parallel, posttrain
from .mha import mha_backward, mha_forward
from .gpt import Workspace, generate, gpt_backward, gpt_forward, gpt_loss, loss_workspace
from .optim import adamw_step, adamw_step_, clip_grad_norm_

__all__ = ["gpt_forward", "gpt_backward", "gpt_loss", "generate", "adamw_step", "adamw_step_",
           "clip_grad_norm_", "mha_forward", "mha_backward", "Workspace", "loss_workspace"]
