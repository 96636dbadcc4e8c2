"""Backends turn an HLO Module into an executable: list of arrays -> list of arrays.

Registered by name and imported lazily, so a CPU-only install never imports
a GPU toolkit.
"""
import importlib

_BACKENDS = {"reference": "kerasjit.backends.reference", "cpu": "kerasjit.backends.cpu"}


def available():
    return sorted(_BACKENDS)


def get_backend(name):
    """A backend object from its name (a backend object passes through)."""
    if not isinstance(name, str):
        return name
    if name == "auto":
        name = "cpu"
    if name not in _BACKENDS:
        raise ValueError(f"unknown kerasjit backend {name!r}; choose one of "
                         f"{', '.join(['auto', *available()])}")
    return importlib.import_module(_BACKENDS[name]).BACKEND
