"""numpytfmr: the transformer and its training math in plain NumPy.

Every op is a ``name_forward``/``name_backward`` pair, read beside the lecture notes;
the public contract is docs/contract.md. Every reference op and the gradient checker are
importable from here.

The modules of this folder are the notes' topics (plus ``gradcheck.py`` and ``contract.py``);
the rest is machinery in subpackages: ``registry/`` (the list of ops and their example
cases), ``checking/`` (what ``check_gradients`` runs), ``run/`` (the command line, training,
checkpoints, data, the benchmark), ``grading/`` (the autograder), ``site/`` (the reader) and
``fast/`` (fast code). ``import numpytfmr`` loads the reference only: the subpackages, and
the few entry points of the machinery named in ``_ENTRY_POINTS`` below (``load_run``, ``train_bpe``,
``BPETokenizer``, ``get_batch``, ``gpt_from_hf``, ``save_hf_checkpoint``, ...), load when first
used; ``dir(numpytfmr)`` lists them. Every name of docs/contract.md resolves here
(tests/test_package.py reads the contract's tables and checks each one).
"""
import importlib as _importlib

__version__ = "0.1.0"

from .gradcheck import *  # noqa: F401,F403
from .activations import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .norms import *  # noqa: F401,F403
from .embedding import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .ffn import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .scoring import *  # noqa: F401,F403
from .mha import *  # noqa: F401,F403
from .positional import *  # noqa: F401,F403
from .efficient import *  # noqa: F401,F403
from .blocks import *  # noqa: F401,F403
from .gpt import *  # noqa: F401,F403
from .encdec import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .lora import *  # noqa: F401,F403
from .preference import *  # noqa: F401,F403
from .posttrain import *  # noqa: F401,F403
from .optim import *  # noqa: F401,F403
from .classical import *  # noqa: F401,F403
from .cost import *  # noqa: F401,F403

# Entry points of the machinery, loaded on first use: name -> the module that defines it.
_ENTRY_POINTS = {
    "load_run": "numpytfmr.run.checkpoint",            # a trained run: model, tokenizer, config
    "train_bpe": "numpytfmr.run.bpe",
    "BPETokenizer": "numpytfmr.run.bpe",
    "load_tokenizer": "numpytfmr.run.tokenizers",
    "save_tokenizer": "numpytfmr.run.tokenizers",
    "get_batch": "numpytfmr.run.batches",
    "write_tokens": "numpytfmr.run.batches",
    "open_tokens": "numpytfmr.run.batches",
    "gpt_from_hf": "numpytfmr.run.hf",                 # a fixed name of docs/contract.md
    "load_hf_checkpoint": "numpytfmr.run.hf",
    "save_hf_checkpoint": "numpytfmr.run.hf",
    # the built-in tasks and their evaluation, as the notebooks use them
    "make_task": "numpytfmr.run.data",
    "make_translation": "numpytfmr.run.data",
    "make_preference_pairs": "numpytfmr.run.data",
    "next_token_arrays": "numpytfmr.run.data",
    "decode_completion": "numpytfmr.run.data",
    "exact_match": "numpytfmr.run.data",
    "evaluate_generation": "numpytfmr.run.data",
    "BOS_ID": "numpytfmr.run.data",
    "EOS_ID": "numpytfmr.run.data",
    "PAD_ID": "numpytfmr.run.data",
}
# ``from numpytfmr import *``: the reference ops and the gradient checker.
__all__ = sorted({n for _m in (gradcheck, activations, linear, losses, norms, embedding, dropout,
                               ffn, attention, scoring, mha, positional, efficient, blocks, gpt,
                               encdec, rnn, lora, preference, posttrain, optim, classical, cost)
                  for n in _m.__all__})
_SUBPACKAGES = ("fast", "run", "grading", "site", "registry", "checking")


def __getattr__(name):
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"{__name__}.{name}")
    if name in _ENTRY_POINTS:
        value = getattr(_importlib.import_module(_ENTRY_POINTS[name]), name, None)
        if value is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} "
                                 f"({_ENTRY_POINTS[name]} does not define it)")
        globals()[name] = value                        # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_ENTRY_POINTS) | set(_SUBPACKAGES))
