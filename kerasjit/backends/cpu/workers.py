"""Processes that compile LLVM modules, one part each, while this one waits.

Two reasons: llvmlite runs every LLVM call under one process-wide lock, so
only other processes can put more cores to work; and LLVM as llvmlite ships
it has its assertions on, and a failed one aborts the process it runs in (its
loop vectoriser's cost models disagree on some short loops), which must not
be the training process. A worker is this file run by path, so it loads
llvmlite and engine.py alone, not TensorFlow. It reads (LLVM IR, unroll) on
stdin and writes the object code or the error on stdout, as length-prefixed
pickles; at a lower CPU priority than training. Workers start with the first
compile and end with this process. A
failed worker costs time, not the compile: its part is compiled here, by the
caller's fallback.
"""
import atexit
import importlib.util
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading

try:
    from ...cancel import checkpoint
except ImportError:         # (run by path as a worker, where it is not needed)
    def checkpoint():
        pass

_LENGTH = struct.Struct("<Q")

# Marks the threads whose compiles run beside training (beside_training()).
_thread = threading.local()


def beside_training():
    """Mark this thread's compiles as running beside training steps: they use
    half the workers (at least one). The steps want every core; on two cores
    the background compiles of ResNet50 and EfficientNetB0 finished sooner
    with one worker than with two (20.3 vs 21.6 s, 22.5 vs 27.7 s), the
    steps beside them losing less time too (reports/tuning-measurements.md)."""
    _thread.beside_training = True


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


class WorkerError(RuntimeError):
    """LLVM refused a module on a worker (the worker itself is sound)."""


class Worker:
    def __init__(self):
        # A session of its own: a Ctrl-C at the terminal is for the training
        # process, not for its workers. stderr is shared: an LLVM abort there
        # says why.
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        start_new_session=True)
        self._writer, self._write_error = None, None

    def alive(self):
        return self.process.poll() is None

    def submit(self, llvm_ir, unroll):
        """Send a module, from a thread: a pipe holds 64 kB, and a worker still
        starting up reads nothing yet, which must not hold up this process."""
        def write():
            try:
                _send(self.process.stdin, (llvm_ir, unroll))
            except OSError as e:
                self._write_error = e
        self._writer = threading.Thread(target=write, daemon=True)
        self._writer.start()

    def result(self):
        """The object code of the module submitted last."""
        self._writer.join()
        if self._write_error is not None:
            raise self._write_error
        status, value = _receive(self.process.stdout)
        if status != "ok":
            raise WorkerError(value)
        return value

    def close(self, grace=0.5):
        """Close its pipes and let it exit, killed after `grace` seconds (busy, or
        its stdin still open in a fork)."""
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Pool:
    """Up to `size` workers, started with the first compile; one compile at a
    time. A worker that dies, or whose reply went unread (the compile failed
    or was interrupted), is replaced, `size` times at most."""

    def __init__(self, size):
        self.size, self.workers = size, []
        self.starts_left = 2 * size         # the first workers and one replacement each
        self.lock = threading.Lock()
        self.owner = os.getpid()
        self.exit_hook = False

    def _start(self):
        """(With the lock held.) Drop dead workers, start missing ones."""
        if os.getpid() != self.owner:
            return
        for worker in [w for w in self.workers if not w.alive()]:
            self._drop(worker)
        while len(self.workers) < self.size and self.starts_left > 0:
            self.starts_left -= 1
            try:
                self.workers.append(Worker())
            except OSError:         # no process to be had: compile here
                self.starts_left = 0
        if not self.exit_hook:
            atexit.register(self.close)
            self.exit_hook = True

    def parallelism(self):
        """How many modules compile at once: one per worker this thread may
        use (one, here, without)."""
        with self.lock:
            self._start()
            return max(len(self._usable()), 1)

    def _owned(self):
        """The workers, in the process that started them. A forked child shares
        its parent's pipes: its requests would mix with the parent's, so it
        compiles everything itself, and its exit leaves them be."""
        return self.workers if os.getpid() == self.owner else []

    def _usable(self):
        """The workers this thread's compiles may use."""
        owned = self._owned()
        if getattr(_thread, "beside_training", False):
            return owned[:max(1, len(owned) // 2)]
        return owned

    def compile(self, texts, unroll, compile_here):
        """Object code of each module text, compiled by the workers, a text
        each at a time; by `compile_here(text)` where no worker takes it, its
        worker died (an LLVM abort), or LLVM refused it (raised here again)."""
        with self.lock:
            self._start()
            objects, pending, sent = [None] * len(texts), list(range(len(texts))), {}
            try:
                while pending:
                    for worker in self._usable():
                        if pending and worker not in sent.values():
                            sent[pending[0]] = worker
                            worker.submit(texts[pending.pop(0)], unroll)
                    if not sent:                   # no worker at all
                        i = pending.pop(0)
                        objects[i] = compile_here(texts[i])
                        continue
                    for i, worker in sorted(sent.items()):
                        checkpoint()
                        try:
                            objects[i] = worker.result()
                        except WorkerError:   # LLVM's verdict: here it raises it again
                            pass
                        except (EOFError, OSError, pickle.UnpicklingError):
                            self._drop(worker)
                        del sent[i]
                        if objects[i] is None:
                            objects[i] = compile_here(texts[i])
            finally:       # its reply would answer the next request; its work is unwanted
                for worker in sent.values():
                    self._drop(worker, grace=0)
            return objects

    def _drop(self, worker, grace=0.5):
        worker.close(grace)
        if worker in self.workers:
            self.workers.remove(worker)

    def close(self):
        with self.lock:
            for worker in self._owned():
                worker.close()
            self.workers = []


def default_size():
    """One worker per core (at least one: no LLVM runs in this process; at
    most 4: modules split finer than that gain little)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 4))


pool = Pool(default_size())


def _serve():
    # Replies go to the original stdout alone; anything else printed here
    # (by LLVM or Python) goes to stderr instead of into the replies.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below training's priority: a compile in the background (step.py) takes the
    # cores the steps leave; a compile the steps wait for has them all anyway.
    os.nice(10)
    # engine.py by its path: this folder is no package here, and on sys.path
    # its modules would shadow the standard library's (profile).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location("engine", os.path.join(here, "engine.py"))
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
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
