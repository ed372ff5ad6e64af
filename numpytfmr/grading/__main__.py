"""``python -m numpytfmr.grading --check``: can submission processes start here, and how are
they isolated? (Gradescope's setup.sh runs it at build time; see sandbox.py.)"""
import sys

from .sandbox import main

sys.exit(main())
