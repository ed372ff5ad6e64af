"""``python -m numpytfmr`` is the same program as the ``numpytfmr`` command."""
import sys

from numpytfmr.run.cli import main

sys.exit(main())
