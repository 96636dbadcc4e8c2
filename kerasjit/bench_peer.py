"""The benchmark's Keras-on-JAX contender, in a process of its own.

Keras picks its backend once per process, so `python -m kerasjit.bench` runs
Keras on JAX in a peer, `python -m kerasjit.bench_peer` (KERAS_BACKEND=jax;
no TensorFlow), and drives it call by call through `JaxPeer`: one JSON
command a line on the peer's stdin, one JSON answer a line on its stdout.
The benchmark waits for each answer, so the peer's calls have the cores to
themselves, as every contender's do. Commands: {"op": "start"} (answers JAX's
version and platform), {"op": "load", "workload": name, "args": the
benchmark's arguments}, {"op": "first_calls", "mode": mode}, {"op": "round",
"mode": mode}, {"op": "quit"}; an answer is {"error": traceback} where the
command failed, and every answer says whether TensorFlow is loaded in the peer.
"""
import contextlib
import importlib.abc
import json
import os
import subprocess
import sys
import traceback
import types


class JaxPeer:
    """The benchmark's side: a Keras-on-JAX contender with `first_calls(mode)`
    and `round(mode)` as `bench_suite.Contender`'s, for the workload `load`
    named last; a context manager that ends the peer process."""

    def __init__(self):
        # stderr inherited: the peer's warnings join the benchmark's (no pipe to drain)
        self._process = subprocess.Popen([sys.executable, "-m", "kerasjit.bench_peer"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env=dict(os.environ, KERAS_BACKEND="jax"))
        self.tensorflow_loaded = None
        try:
            started = self._ask("start")
        except BaseException:
            self.close()
            raise
        self.description = f"JAX {started['jax']} on {started['platform']}"

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.close()

    def load(self, workload, args):
        """Builds `workload` of `bench_suite.suite(args)` (`args` a dict) in the peer."""
        self._ask("load", workload=workload, args=args)

    def first_calls(self, mode):
        answer = self._ask("first_calls", mode=mode)
        return answer["first_s"], answer["again_s"], answer["rss_growth_mb"]

    def round(self, mode):
        return self._ask("round", mode=mode)["seconds"]

    def close(self):
        if self._process.poll() is None:
            try:
                self._send("quit")
                self._process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        with contextlib.suppress(BrokenPipeError):      # (a command the peer never read)
            self._process.stdin.close()
        self._process.stdout.close()

    def _send(self, op, **fields):
        self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._process.stdin.flush()

    def _ask(self, op, **fields):
        try:
            self._send(op, **fields)
        except BrokenPipeError:
            pass        # the peer is gone: said below, with its exit code
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the Keras-on-JAX peer exited (code {self._process.wait()}) "
                               f"before answering {op!r}; its stderr is above")
        answer = json.loads(line)
        self.tensorflow_loaded = answer.pop("tensorflow_loaded")
        if "error" in answer:
            raise RuntimeError(f"the Keras-on-JAX peer failed at {op!r}:\n{answer['error']}")
        return answer


class _WithoutTensorFlow(importlib.abc.MetaPathFinder):
    """Keeps TensorFlow out of the peer, as if it were not installed: Keras on
    JAX would load it all the same, to seed it in `set_random_seed`."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"{name}: the Keras-on-JAX peer runs without TensorFlow",
                                      name=name)
        return None


class _KerasOnJax:
    """The peer's side: the commands' work, on the workload loaded last."""

    COMMANDS = ("start", "load", "first_calls", "round")

    def start(self):
        os.environ["KERAS_BACKEND"] = "jax"     # (Keras reads it once, on its import)
        sys.meta_path.insert(0, _WithoutTensorFlow())
        import jax
        import keras

        from kerasjit import bench_suite
        if keras.backend.backend() != "jax":
            raise RuntimeError(f"Keras loaded its {keras.backend.backend()} backend, not JAX")
        self.jax, self.suite, self.contender = jax, bench_suite, None
        # (jax.devices() starts JAX's runtime: the first model's compile time leaves it out)
        return {"jax": jax.__version__, "platform": jax.devices()[0].platform}

    def load(self, workload, args):
        # One peer serves the whole run, as the benchmark's process does for the others:
        # JAX starts once, and the last workload's models and JAX's executables for them
        # go before the next is built, so memory stays that of one workload.
        self.contender = None
        self.jax.clear_caches()
        work = self.suite.suite(types.SimpleNamespace(**args))[workload]
        x, y = work.data(work.steps * work.batch)
        # jit_compile=True: what Keras on JAX does by default (False would run eager JAX)
        self.contender = self.suite.Contender(
            work, x, y, lambda spe: self.suite.build_model(work.build, True, spe))
        return {}

    def first_calls(self, mode):
        first, again, growth = self.contender.first_calls(mode)
        return {"first_s": first, "again_s": again, "rss_growth_mb": growth}

    def round(self, mode):
        return {"seconds": self.contender.round(mode)}


def main():
    answers = os.fdopen(os.dup(1), "w")     # the protocol's own copy of stdout
    os.dup2(2, 1)           # so that whatever Keras, JAX or XLA print goes to stderr
    peer = _KerasOnJax()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "quit":
            return
        try:
            if op not in peer.COMMANDS:
                raise ValueError(f"no command {op!r}; commands: {', '.join(peer.COMMANDS)}, quit")
            answer = getattr(peer, op)(**command)
        except Exception:
            answer = {"error": traceback.format_exc()}
        answer["tensorflow_loaded"] = "tensorflow" in sys.modules
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
