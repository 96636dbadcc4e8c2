"""Processes that compile LLVM modules while this one compiles its own part.

llvmlite runs every LLVM call under one process-wide lock, so threads cannot
put a second core to work on a compile; another process can. A worker is
this file run by path (not as part of the package), so it loads llvmlite
and engine.py alone (~0.13 s), not TensorFlow. It reads requests (LLVM IR
text, whether to unroll) on stdin and writes the object code, or the error,
on stdout: pickles, each after its length. Workers start with the first
compile (in the background, while the module is lowered) and end with this
process (their stdin closes).

A worker that fails costs nothing but time: its part is compiled here.
"""
import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading

_LENGTH = struct.Struct("<Q")


def _send(stream, value):
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("compile worker ended")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("compile worker ended")
    return pickle.loads(data)


class Worker:
    def __init__(self):
        # stderr is kept: an LLVM abort in the worker says why there.
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def submit(self, llvm_ir, unroll):
        _send(self.process.stdin, (llvm_ir, unroll))

    def result(self):
        """The object code of the module submitted last."""
        status, value = _receive(self.process.stdout)
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


class Pool:
    """Up to `size` workers, started by `start` (or the first compile); one
    compile at a time. A worker that fails is dropped, not replaced."""

    def __init__(self, size):
        self.size, self.workers, self.started = size, [], False
        self.lock = threading.Lock()
        self.owner = os.getpid()

    def start(self):
        with self.lock:
            if self.started:
                return
            self.started = True
            try:
                self.workers = [Worker() for _ in range(self.size)]
            except OSError:           # no process to be had: everything compiles here
                self.workers = []
            atexit.register(self.close)

    def parallelism(self):
        """How many modules compile at once: the workers and this process."""
        self.start()
        return len(self._usable()) + 1

    def _usable(self):
        # A forked child shares its parent's pipes: its requests would mix
        # with the parent's. It compiles everything itself.
        return self.workers if os.getpid() == self.owner else []

    def compile(self, texts, unroll, compile_here):
        """Object code of each module text: the first compiled here by
        `compile_here(text)` while the workers compile the others (or here,
        where no worker takes one)."""
        self.start()
        with self.lock:
            sent = []
            for worker, text in zip(list(self._usable()), texts[1:]):
                try:
                    worker.submit(text, unroll)
                    sent.append(worker)
                except OSError:
                    self._drop(worker)
            objects = [compile_here(texts[0])]
            for i, text in enumerate(texts[1:]):
                try:
                    if i >= len(sent):
                        raise EOFError("no worker")
                    objects.append(sent[i].result())
                except (EOFError, OSError, RuntimeError, pickle.UnpicklingError):
                    if i < len(sent):
                        self._drop(sent[i])
                    objects.append(compile_here(text))
            return objects

    def _drop(self, worker):
        worker.close()
        if worker in self.workers:
            self.workers.remove(worker)

    def close(self):
        with self.lock:
            for worker in self._usable():     # (a forked child's exit leaves them be)
                worker.close()
            self.workers = []


def default_size():
    """One worker per core but this process's (at most 3: modules split finer
    than that gain little)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min((cores or 1) - 1, 3))


pool = Pool(default_size())


def _serve():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import engine
    # Replies go to the original stdout alone; anything else printed here
    # (by LLVM or Python) goes to stderr instead of into the replies.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    while True:
        try:
            llvm_ir, unroll = _receive(stdin)
        except EOFError:
            return
        try:
            reply = ("ok", engine.object_code(engine.optimize(llvm_ir, unroll)))
        except Exception as e:        # (its message goes back to the caller)
            reply = ("error", f"{type(e).__name__}: {e}")
        _send(stdout, reply)


if __name__ == "__main__":
    _serve()
