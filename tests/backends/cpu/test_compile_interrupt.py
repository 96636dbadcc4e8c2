"""Ctrl-C during a compile stops it at once, not when LLVM returns."""
import signal
import threading
import time

import pytest

import kerasjit.backends.cpu as cpu
from kerasjit.backends.cpu import workers


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
    """LLVM runs in a compile worker while this process waits: the wait takes
    the Ctrl-C at once, and the busy worker is stopped, not waited for."""
    pool = workers.Pool(1)
    monkeypatch.setattr(workers, "pool", pool)
    # Python's own Ctrl-C handler, whatever this process inherited (a shell's
    # background job starts with SIGINT ignored, and Python then installs none).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main, signalled, submitted = threading.main_thread().ident, [], threading.Event()
    submit = workers.Worker.submit
    monkeypatch.setattr(workers.Worker, "submit",
                        lambda worker, *a: (submit(worker, *a), submitted.set()))

    def interrupt():        # (once the worker has the module: LLVM takes a second on it)
        submitted.wait()
        time.sleep(0.2)
        signalled.append(time.perf_counter())
        signal.pthread_kill(main, signal.SIGINT)
    try:
        pool.parallelism()                  # (its worker started)
        busy = pool.workers[0]
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            cpu._object_code(long_module(), "interrupted", unroll=True)
        waited = time.perf_counter() - signalled[0]
        assert waited < 0.5, f"the interrupt waited {waited:.1f} s for LLVM"
        assert not pool.workers and busy.process.poll() is not None
    finally:
        signal.signal(signal.SIGINT, previous)
        pool.close()


def test_a_compile_error_reaches_the_caller():
    with pytest.raises(RuntimeError):
        cpu._object_code("define void @f() { ret i32 0 }", "wrong", unroll=True)
