"""Persistent compile cache: object code per (HLO, host CPU, versions).

An entry holds the native objects (a module's parts) and the buffer table
its entry point expects. A corrupt or stale entry (unreadable, wrong key,
checksum mismatch) is ignored and rebuilt. KERASJIT_CACHE_DIR moves the
cache; an empty value turns it off.
"""
import functools
import hashlib
import os
import pathlib
import pickle
import re
import tempfile

import llvmlite

from ...hlo import print_module

FORMAT = 3     # bump when what an entry holds changes


def cache_dir():
    path = os.environ.get("KERASJIT_CACHE_DIR", os.path.join(
        os.path.expanduser("~"), ".cache", "kerasjit"))
    return path or None


def fingerprint(module):
    """The module's text with its own and its computations' names made positional:
    TensorFlow numbers every trace anew, which must not defeat the cache."""
    text = print_module(module).replace(f"HloModule {module.name}", "HloModule m", 1)
    for i, comp in enumerate(module.computations):
        text = re.sub(rf"%{re.escape(comp.name)}\b(?![.\w])", f"%computation{i}", text)
    return text


@functools.cache
def compiler_fingerprint():
    """A hash of kerasjit's own source: a changed compiler (even at the same
    version, e.g. an editable install) never reuses code an older one built."""
    digest = hashlib.sha256()
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(module, host, version, donate=None):
    text = (f"{FORMAT}\n{version} {compiler_fingerprint()}\nllvmlite {llvmlite.__version__}\n"
            f"{host}\ndonated {sorted((donate or {}).items())}\n{fingerprint(module)}")
    return hashlib.sha256(text.encode()).hexdigest()


def _checksum(objects):
    digest = hashlib.sha256()
    for code in objects:
        digest.update(hashlib.sha256(code).digest())
    return digest.hexdigest()


def load(key):
    """The cached record for `key`, or None (missing, corrupt or stale)."""
    directory = cache_dir()
    if not directory:
        return None
    try:
        with open(os.path.join(directory, key + ".pkl"), "rb") as f:
            record = pickle.load(f)
        if record["key"] != key or record["checksum"] != _checksum(record["objects"]):
            return None
        return record
    except Exception:       # unreadable, truncated, from another format: rebuild
        return None


def store(key, record):
    directory = cache_dir()
    if not directory:
        return
    record = dict(record, key=key, checksum=_checksum(record["objects"]))
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, delete=False) as f:
            pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, os.path.join(directory, key + ".pkl"))   # atomic: no torn entries
    except OSError:
        pass                # a read-only or full disk only costs the next compile
