"""The notebooks' outputs for the reader: each notebook run top to bottom by nbclient in a
fresh kernel, its outputs cached under ``$XDG_CACHE_HOME/numpytfmr/notebooks`` (``~/.cache``)
keyed by a hash of the notebook and the package, so it runs again only when either changed.
"""
import hashlib
import json
import os
import pathlib
import secrets
import sys

__all__ = ["notebook_outputs", "can_execute", "cache_dir", "package_fingerprint"]

CELL_TIMEOUT = 600          # seconds a cell may take (the slowest trains a small model)


def can_execute():
    """Whether nbclient and a Python kernel are installed."""
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
        from jupyter_client.kernelspec import KernelSpecManager
        if "python3" not in KernelSpecManager().find_kernel_specs():
            import ipykernel  # noqa: F401
        return True
    except Exception:            # a broken Jupyter install is as good as none here
        return False


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "numpytfmr" / "notebooks"


def package_fingerprint():
    import numpytfmr
    h = hashlib.sha256()
    root = pathlib.Path(numpytfmr.__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def notebook_outputs(path, *, package_hash=None):
    """The outputs of every cell of the notebook at ``path`` after running it (a list, one
    list of nbformat output dicts per cell; markdown cells get ``[]``)."""
    import nbformat
    from nbclient import NotebookClient

    path = pathlib.Path(path)
    raw = path.read_bytes()
    key = hashlib.sha256(raw + (package_hash or package_fingerprint()).encode()).hexdigest()[:24]
    cached = cache_dir() / f"{path.stem}-{key}.json"
    if cached.is_file():
        try:
            return json.loads(cached.read_text(encoding="utf-8"))
        except ValueError:
            pass
    print(f"numpytfmr docs: running {path.name} for its outputs ...", file=sys.stderr, flush=True)
    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    # the kernel imports the numpytfmr that builds the site, installed or not
    import numpytfmr
    parent = str(pathlib.Path(numpytfmr.__file__).resolve().parents[1])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([parent] + ([saved] if saved else []))
    try:
        client.execute()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    outputs = [[dict(o) for o in c.get("outputs", [])] if c.cell_type == "code" else []
               for c in nb.cells]
    outputs = json.loads(json.dumps(outputs, default=dict))
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.parent / f".tmp-{secrets.token_hex(6)}"
    tmp.write_text(json.dumps(outputs), encoding="utf-8")
    os.replace(tmp, cached)
    return outputs
