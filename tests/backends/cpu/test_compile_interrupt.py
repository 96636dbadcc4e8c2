"""Ctrl-C during a compile stops it at once, not when LLVM returns."""
import signal
import threading
import time

import pytest

import kerasjit.backends.cpu as cpu
from kerasjit.backends.cpu import engine, workers


def long_module(functions=150, terms=300):
    """LLVM IR that takes LLVM a second or more: loops of long chains of sums."""
    def function(f):
        body = "\n".join(f"  %x{i} = getelementptr float, ptr %p, i64 %i\n"
                         f"  %v{i} = load float, ptr %x{i}\n"
                         f"  %acc{i + 1} = fadd float %acc{i}, %v{i}" for i in range(terms))
        return f"""define void @f{f}(ptr %p, i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %acc0 = load float, ptr %p
{body}
  %out = getelementptr float, ptr %p, i64 %i
  store float %acc{terms}, ptr %out
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}"""
    return "\n".join(map(function, range(functions)))


def test_ctrl_c_during_llvm_takes_effect_before_llvm_returns(monkeypatch):
    finished = []

    def object_code(module):
        code = emit(module)
        finished.append(time.perf_counter())
        return code
    emit = engine.object_code
    monkeypatch.setattr(engine, "object_code", object_code)
    module, main, signalled = long_module(), threading.main_thread().ident, []

    def interrupt():
        signalled.append(time.perf_counter())
        signal.pthread_kill(main, signal.SIGINT)
    threading.Timer(0.2, interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        cpu._object_code(module, "interrupted", unroll=True)
    waited = time.perf_counter() - signalled[0]
    assert waited < 0.5, f"the interrupt waited {waited:.1f} s for LLVM"
    for _ in range(1200):     # (the module is dropped; its thread ends on its own)
        if finished:
            break
        time.sleep(0.05)
    assert finished[0] - signalled[0] > 0.5, "LLVM was done too soon to tell"


def test_a_compile_error_reaches_the_caller():
    with pytest.raises(RuntimeError):
        cpu._object_code("define void @f() { ret i32 0 }", "wrong", unroll=True)


def test_an_interrupted_compile_does_not_wait_for_busy_workers():
    """The compile workers' parts are unwanted once this process's part is
    interrupted: they are stopped, not waited for."""
    pool = workers.Pool(1)

    def interrupted(text):
        raise KeyboardInterrupt
    try:
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            pool.compile(["", long_module()], True, interrupted)
        assert time.perf_counter() - start < 0.3
        assert not pool.workers
    finally:
        pool.close()
