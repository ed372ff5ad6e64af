"""Sub-commands of ``numpytfmr`` other than ``check``; each module defines ``add_command(sub)``."""
