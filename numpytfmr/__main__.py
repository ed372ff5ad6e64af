"""``python -m numpytfmr`` is the same program as the ``numpytfmr`` command."""
import sys

from numpytfmr.cli import main

sys.exit(main())
