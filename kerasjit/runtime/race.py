"""Compiled or TensorFlow: whichever runs a cluster faster on this machine.

A compiled cluster is not always the faster one: on CPUs where oneDNN's
convolutions beat a patch matrix x sgemm several times over, TensorFlow's
own kernels win a CNN's step. The first calls of a compiled cluster
alternate between its executable and its TensorFlow function and time
both; TensorFlow takes the cluster over only when clearly faster. Both run
the same graph, so which one ran a call changes training by float rounding
at most.
"""
import contextlib
import threading
import time

from ..errors import warn

# Call order: compiled, TensorFlow (untimed: it traces), then timed calls in
# turn, MIN_TRIALS each, and more up to MAX_TRIALS while the two are too close
# to call (their ratio within BAND of MARGIN): a near tie must not decide the
# cluster one way in one run and the other in the next.
MIN_TRIALS, MAX_TRIALS = 3, 8
# TensorFlow must be this much faster to take over: timings move by tens of
# percent on a busy machine, and a wrong switch costs more than it saves.
MARGIN = 0.8
BAND = 0.1


class _Compiles:
    """Compiles running beside the training in this process, any model's or
    step's. A call timed while one ran shared the cores with it, and would
    let one step's compile decide another's race: no timing counts it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running = self.started = 0

    @contextlib.contextmanager
    def one(self):
        with self._lock:
            self.running += 1
            self.started += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1

    def mark(self):
        """Where the compiles stand, before a timed call."""
        return self.running, self.started

    def quiet_since(self, mark):
        """Whether no compile ran at any time since `mark`."""
        return mark[0] == 0 and self.mark() == mark


BACKGROUND_COMPILES = _Compiles()


class Race:
    """`contested()` says whether TensorFlow may win at all; asked at the
    first call, so that a cluster never raced (the single cluster of a step
    whose verdict is timed whole) is never looked into."""

    def __init__(self, name, contested=lambda: True):
        self.name, self.contested = name, contested
        self.times = {"compiled": [], "tensorflow": []}
        self.calls = 0
        self.winner = None          # "compiled" or "tensorflow" once decided

    def run(self, args, compiled, tensorflow):
        """Run one call of the race; decides after the last."""
        if self.calls == 0 and not self.contested():
            self.winner = "compiled"
            return compiled(args)
        contender = ("compiled", "tensorflow")[self.calls % 2]
        mark, start = BACKGROUND_COMPILES.mark(), time.perf_counter()
        outputs = (compiled if contender == "compiled" else tensorflow)(args)
        if self.calls >= 2 and BACKGROUND_COMPILES.quiet_since(mark):
            self.times[contender].append(time.perf_counter() - start)
        self.calls += 1
        trials = min(len(t) for t in self.times.values())
        if self.calls % 2 == 0 and trials >= MIN_TRIALS and (trials >= MAX_TRIALS
                                                              or self._clear()):
            self._decide()
        return outputs

    def _clear(self):
        ours, theirs = self._best()
        return abs(theirs / ours - MARGIN) > BAND if ours > 0 else True

    def _best(self):
        return min(self.times["compiled"]), min(self.times["tensorflow"])

    def _decide(self):
        ours, theirs = self._best()
        self.winner = "tensorflow" if theirs < MARGIN * ours else "compiled"
        if self.winner == "tensorflow":
            warn(f"kerasjit: cluster {self.name} now runs in TensorFlow: {self.reason}")

    def __str__(self):
        if self.winner is None:
            return f"racing TensorFlow ({self.calls} calls so far)"
        if not self.times["compiled"]:
            return "runs compiled: TensorFlow has no library kernel for it"
        ours, theirs = self._best()
        return (f"compiled {1000 * ours:.3f} ms vs TensorFlow {1000 * theirs:.3f} ms per "
                f"call: runs {self.winner}")

    @property
    def reason(self):
        ours, theirs = self._best()
        return (f"TensorFlow ran it faster here ({1000 * theirs:.2f} vs "
                f"{1000 * ours:.2f} ms per call compiled)")
