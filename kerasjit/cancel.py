"""A compile running beside training stops when the program ends.

step.py compiles on a thread of its own while TensorFlow runs the steps. As a
daemon, such a thread dies at exit wherever it is, and inside TensorFlow's or
LLVM's C++ that aborts the process; as an ordinary thread it would hold the
ending program until its compile finished. So the compile's stages call
`checkpoint()` between their parts, and it ends the compile once the main
thread has finished (the interpreter is waiting for this thread to exit).
"""
import threading


class CompileCancelled(BaseException):
    """The program ended while this compile ran in the background (no compile
    error: it passes the handlers that send a failed cluster to TensorFlow)."""


def checkpoint():
    """Raise CompileCancelled on a background thread whose program is ending."""
    main = threading.main_thread()
    if threading.current_thread() is not main and not main.is_alive():
        raise CompileCancelled("the program is ending")
