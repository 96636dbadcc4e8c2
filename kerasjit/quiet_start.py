"""TensorFlow's start-up without its routine log lines.

Loading TensorFlow writes lines to the process's stderr from C++ before its
log level applies (absl's notice that logging is not set up, oneDNN being
on, the CPU instructions it was not built for, and, on a machine without an
NVIDIA driver, "failed call to cuInit ... UNKNOWN ERROR (303)", which reads as
an error). Once kerasjit is imported, TensorFlow (whoever imports it next:
kerasjit itself, Keras, the user) loads with stderr going to a file, which
is then written back but for those lines. KERASJIT_QUIET=0 keeps them all;
where TensorFlow is loaded already there is nothing left to do.
"""
import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile

_ROUTINE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|^I\d{4} .*\] oneDNN custom operations are on"
    r"|^I\d{4} .*\] Could not find cuda drivers on your machine"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|^To enable the following instructions: .*rebuild TensorFlow")
_NO_DRIVER = re.compile(r"failed call to cuInit: .*(UNKNOWN ERROR \(303\)|CUDA_ERROR_NO_DEVICE)")


def routine(line, driver=None):
    """Whether a start-up line is TensorFlow's routine noise here (a cuInit
    failure is, where the machine has no NVIDIA driver)."""
    if driver is None:
        driver = os.path.exists("/proc/driver/nvidia")
    return bool(_ROUTINE.search(line)) or not driver and bool(_NO_DRIVER.search(line))


@contextlib.contextmanager
def _filtered_stderr():
    """Stderr (the file descriptor: C++ writes there) into a file meanwhile,
    written back at the end without the routine lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            sys.stderr.write("".join(
                line for line in captured.read().decode(errors="replace").splitlines(True)
                if not routine(line)))


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with stderr filtered; its devices are
    listed meanwhile (where cuInit reports; none is set up, so they can
    still be configured)."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):           # (resources and the like: TensorFlow's loader's)
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with _filtered_stderr():
            self.loader.exec_module(module)
            module.config.list_physical_devices()


class _QuietTensorFlow(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the other finders do, with _QuietLoader; once."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install():
    """TensorFlow's next load (if it is not loaded yet) leaves its routine lines out."""
    if "tensorflow" not in sys.modules and os.environ.get("KERASJIT_QUIET") != "0" \
            and not any(isinstance(f, _QuietTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())
