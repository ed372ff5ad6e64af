# Hostile: sys.exit(0) while the module loads.
import sys

sys.exit(0)
