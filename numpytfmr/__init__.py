"""numpytfmr: the transformer and its training math in plain NumPy.

Every op is a ``name_forward``/``name_backward`` pair, read beside the lecture notes;
the public contract is docs/contract.md. All public names are importable from here.

The modules of this folder are the notes' topics (plus ``gradcheck.py`` and ``contract.py``);
the rest is machinery in subpackages: ``registry/`` (the list of ops and their example
cases), ``checking/`` (what ``check_gradients`` runs), ``run/`` (the command line, training,
checkpoints, data, the benchmark), ``grading/`` (the autograder) and ``fast/`` (fast code).
"""
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
from .run.hf import *  # noqa: F401,F403
from .run.bpe import *  # noqa: F401,F403
from .run.batches import *  # noqa: F401,F403
from .lora import *  # noqa: F401,F403
from .preference import *  # noqa: F401,F403
from .posttrain import *  # noqa: F401,F403
from .optim import *  # noqa: F401,F403
from .run.data import *  # noqa: F401,F403
from .classical import *  # noqa: F401,F403
from .cost import *  # noqa: F401,F403
