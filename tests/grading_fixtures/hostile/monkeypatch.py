# Hostile (appended to the correct submission): monkeypatching NumPy and builtins so that any
# comparison passes, then returning wrong answers.
import builtins
import io
import json

np.allclose = lambda *a, **k: True
np.array_equal = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
np.isclose = lambda a, b, *r, **k: np.ones(np.shape(a), dtype=bool)
np.savez = lambda *a, **k: None
np.load = lambda *a, **k: {"__meta__": np.frombuffer(b'{"ok": true}', dtype=np.uint8)}
json.dumps = lambda *a, **k: '{"ok": true, "passed": true}'
io.BytesIO = None
builtins.isinstance = lambda *a: True
builtins.len = lambda x: 0
builtins.abs = lambda x: 0


def softmax_forward(x, *, axis=-1):
    builtins.type = lambda *a: int
    np.asarray = lambda *a, **k: None
    return np.zeros(x.shape), {"y": np.zeros(x.shape), "axis": axis}
