"""KERASJIT_CPU: code for an x86-64 level below the host's (an AVX2-only
machine's code, run here), and a clear error for a level this CPU lacks or
a name it does not know."""
import subprocess
import sys

import llvmlite.binding as llvm
import pytest

_SCRIPT = """
import numpy as np, tensorflow as tf
import llvmlite.binding as llvm
from kerasjit.backends.cpu import CpuBackend, engine
from kerasjit.hlo.evaluator import evaluate
from tests.support.bridge import bridge
from tests.support.structured_cases import rand

args = [rand(64, 256), rand(64, 256, seed=1)]
module = bridge(lambda a, b: (tf.tanh(a) * b + 1.0, tf.reduce_sum(a * b, axis=1)), *args)
executable = CpuBackend().compile(module)
for got, want in zip(executable(args), evaluate(module, args)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
# a loop the vectoriser widens, in the engine's machine code: the registers it uses
loop = '''
define void @add_one(ptr noalias %x) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%j, %loop]
  %p = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %p
  %w = fadd float %v, 1.0
  store float %w, ptr %p
  %j = add i64 %i, 1
  %more = icmp slt i64 %j, 4096
  br i1 %more, label %loop, label %done
done:
  ret void
}'''
assembly = engine._jit()["machine"].emit_assembly(engine.optimize(loop))
print(engine.host_isa()[0], engine.vector_lanes(), engine.host_description().split(":")[0],
      *(f"{r}={r in assembly}" for r in ("ymm", "zmm")))
"""


def _run(level, tmp_path):
    return subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "KERASJIT_CPU": level,
                                            "KERASJIT_CACHE_DIR": str(tmp_path)})


def test_avx2_code_runs_here_and_says_so(tmp_path):
    assert llvm.get_host_cpu_features().get("avx2"), "the x86-64 machines kerasjit targets"
    done = _run("avx2", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["AVX2", "8", "x86-64-v3", "ymm=True",
                                    "zmm=False"]


def test_a_level_the_cpu_lacks_or_an_unknown_one_is_refused(monkeypatch):
    from kerasjit.backends.cpu import engine
    monkeypatch.setenv("KERASJIT_CPU", "sse9")
    with pytest.raises(ValueError, match="KERASJIT_CPU='sse9': expected one of avx2, avx512"):
        engine.host_isa()
    if not llvm.get_host_cpu_features().get("avx512f"):
        monkeypatch.setenv("KERASJIT_CPU", "avx512")
        with pytest.raises(ValueError, match="this CPU has no AVX-512"):
            engine.host_isa()
