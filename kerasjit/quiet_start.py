"""TensorFlow's start-up without its routine log lines.

Loading TensorFlow writes lines to the process's stderr from C++ before its
log level applies (absl's notice that logging is not set up, oneDNN being
on, the CPU instructions it was not built for, and, on a machine without an
NVIDIA driver, "failed call to cuInit ... UNKNOWN ERROR (303)", which reads as
an error). Imported before TensorFlow, kerasjit loads it with stderr going
to a file, then writes back every line but those. KERASJIT_QUIET=0 keeps
them all; once TensorFlow is loaded there is nothing left to do.
"""
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


def load_tensorflow():
    """Import TensorFlow (and look for its devices, where cuInit reports),
    its routine start-up lines left out of stderr."""
    if "tensorflow" in sys.modules or os.environ.get("KERASJIT_QUIET") == "0":
        import tensorflow as tf
        return tf
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
            tf.config.list_physical_devices()   # (devices listed, none set up: still configurable)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(True)
                    if not routine(line)]
            sys.stderr.write("".join(kept))
    return tf
