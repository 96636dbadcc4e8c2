"""A cluster's LLVM module compiled in parts on the compile workers: the same
results, every call resolved, and a failed worker's part compiled here."""
import re
import threading

import numpy as np
import pytest
import tensorflow as tf

import kerasjit.backends.cpu as cpu
from kerasjit.backends.cpu import engine, workers
from kerasjit.backends.cpu.codegen import render_program
from kerasjit.backends.cpu.module_split import split_module, top_level
from kerasjit.frontend.bridge import hlo_module
from kerasjit.compiler import lower
from kerasjit.passes import optimize
from tests.support.targets import CPU


def fn(x, k, w):
    """A convolution with its epilogue, a reduction, a narrow GEMM, and an
    elementwise loop large enough to run on several threads."""
    y = tf.nn.relu(tf.nn.conv2d(x, k, 1, "SAME") + 0.5)
    pooled = tf.reduce_mean(y, axis=[1, 2])
    return tf.matmul(pooled, w), tf.tanh(y) * 2.0, tf.reduce_max(y)


rng = np.random.default_rng(0)
ARGS = [rng.standard_normal((8, 40, 40, 3)).astype(np.float32),
        rng.standard_normal((3, 3, 3, 32)).astype(np.float32),
        rng.standard_normal((32, 10)).astype(np.float32)]
EXPECTED = [t.numpy() for t in fn(*ARGS)]


def _module_text(timed=False):
    program = lower(optimize(hlo_module(fn, *ARGS)), CPU)
    text, _, _ = render_program(program, "split_case", lanes=engine.vector_lanes(),
                                x86=engine.is_x86(), timed=timed)
    return text


def _called(definition):
    return set(re.findall(r'@"?([^"(\s]+)"?', definition.split("\n", 1)[1]))


@pytest.mark.parametrize("timed", [False, True])
def test_parts_define_each_function_once_and_declare_what_they_call(timed):
    text = _module_text(timed)
    whole, _ = top_level(text)
    parts = split_module(text, "split_case_", "split_case_entry", 2)
    assert len(parts) == 2
    defined = [top_level(part)[0] for part in parts]
    assert "split_case_entry" in defined[0]
    names = [n.split(".")[0] for d in defined for n in d]
    assert sorted(names) == sorted(whole)            # each function once, none lost
    for part, definitions in zip(parts, defined):
        declared = set(re.findall(r'^declare [^@]*@"?([^"(\s]+)"?', part, flags=re.M))
        for name, definition in definitions.items():
            assert _called(definition) <= definitions.keys() | declared | _called(text)
    # The thread pool is the process's (thread_pool.py): declared where called, never defined.
    assert all("kerasjit_split" not in d for d in defined)
    if timed:   # the counters' global is defined once, in the entry's part
        assert sum(bool(re.search(r'^@"split_case_kernel_ns" = global', p, flags=re.M))
                   for p in parts) == 1


def test_one_part_where_nothing_can_move():
    text = _module_text()
    assert split_module(text, "no_such_prefix_", "split_case_entry", 4) == [text]
    assert split_module(text, "split_case_", "split_case_entry", 1) == [text]


def test_a_function_calling_one_that_stays_stays_too():
    def function(name, calls=(), linkage="internal "):
        body = "".join(f'  call void @"{c}"()\n' for c in calls)
        return f'define {linkage}void @"{name}"()\n{{\nentry:\n{body}  ret void\n}}'
    text = "\n".join([function("p_entry", ["p_k1", "p_k2"], ""), function("p_k1", ["helper"]),
                      function("p_k2"), function("helper")]) + "\n"
    first, second = (top_level(part)[0] for part in split_module(text, "p_", "p_entry", 2))
    assert set(first) == {"p_entry", "p_k1", "helper"}
    (moved, definition), = second.items()           # called from the entry's part:
    assert moved.startswith("p_k2.") and definition.startswith("define void")   # exported


def _compiled_in_parts(monkeypatch, pool):
    monkeypatch.setattr(cpu, "SPLIT_FROM_CHARS", 0)
    monkeypatch.setattr(workers, "pool", pool)
    backend = cpu.CpuBackend()
    executable = backend.compile(hlo_module(fn, *ARGS))
    (record, _), = backend.loaded.values()
    return executable, record


def _check(executable):
    for got, want in zip(executable(ARGS), EXPECTED):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_parts_compiled_by_workers_link_and_compute_the_same(monkeypatch, compile_cache_dir):
    pool = workers.Pool(2)
    try:
        executable, record = _compiled_in_parts(monkeypatch, pool)
        assert len(record["objects"]) == 2 and len(pool.workers) == 2
        _check(executable)
    finally:
        pool.close()


def test_a_worker_dying_mid_compile_costs_only_time(monkeypatch, compile_cache_dir):
    """As when LLVM aborts on a worker: its part is compiled here instead."""
    pool = workers.Pool(2)
    submit = workers.Worker.submit

    def die_first(worker, *args):     # (dead before it could reply: no race with its reply)
        worker.process.kill()
        worker.process.wait()
        return submit(worker, *args)
    monkeypatch.setattr(workers.Worker, "submit", die_first)
    try:
        executable, record = _compiled_in_parts(monkeypatch, pool)
        assert len(record["objects"]) == 2       # the parts compiled here instead
        assert not pool.workers                   # and the workers dropped
        _check(executable)
    finally:
        pool.close()


def _function(name):
    return f'define i64 @"{name}"() {{\n  ret i64 1\n}}\n'


def _here(text):
    return engine.object_code(engine.optimize(text))


def test_a_reply_left_unread_never_answers_the_next_compile(monkeypatch):
    """A compile interrupted while a worker compiles: that worker's reply must
    not be taken for the next compile's."""
    pool = workers.Pool(1)
    result = workers.Worker.result

    def interrupted(worker):
        monkeypatch.setattr(workers.Worker, "result", result)    # (once)
        raise KeyboardInterrupt
    monkeypatch.setattr(workers.Worker, "result", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.compile([_function("first")], True, _here)
        objects = pool.compile([_function("second")], True, _here)
        assert b"second" in objects[0] and b"first" not in objects[0]
        assert len(pool.workers) == 1 and pool.workers[0].alive()   # a fresh worker
    finally:
        pool.close()


def test_a_compile_beside_training_uses_half_the_workers(monkeypatch):
    """A background compile (its thread marked beside_training) splits its
    module for, and sends it to, half the workers, at least one: the training
    steps beside it keep the other cores. The training thread's own compiles
    use them all."""
    pool, used = workers.Pool(2), []
    submit = workers.Worker.submit

    def recorded(worker, *args):
        used.append(worker)
        return submit(worker, *args)
    monkeypatch.setattr(workers.Worker, "submit", recorded)
    seen = {}

    def background():
        workers.beside_training()
        seen["parallelism"] = pool.parallelism()
        seen["objects"] = pool.compile([_function("b_one"), _function("b_two")], True, _here)
    try:
        assert pool.parallelism() == 2
        thread = threading.Thread(target=background)
        thread.start()
        thread.join()
        assert seen["parallelism"] == 1
        assert b"b_one" in seen["objects"][0] and b"b_two" in seen["objects"][1]
        assert len(used) == 2 and len(set(used)) == 1
        used.clear()
        pool.compile([_function("f_one"), _function("f_two")], True, _here)
        assert len(set(used)) == 2
    finally:
        pool.close()


def test_dead_workers_are_replaced_a_bounded_number_of_times():
    pool = workers.Pool(1)
    try:
        for _ in range(3):
            assert pool.parallelism() in (1, 2)
            for worker in pool.workers:
                worker.process.kill()
                worker.process.wait()
        assert pool.parallelism() == 1 and not pool.workers    # (the first, one spare)
        objects = pool.compile([_function("a_here"), _function("a_there")], True, _here)
        assert b"a_there" in objects[1]                         # all compiled here
    finally:
        pool.close()


def test_a_worker_sends_back_llvm_errors_and_serves_on():
    worker = workers.Worker()
    try:
        worker.submit("this is not LLVM IR", True)
        with pytest.raises(RuntimeError, match="LLVM IR parsing error"):
            worker.result()
        worker.submit("define i64 @one() {\n  ret i64 1\n}\n", True)
        assert worker.result()
    finally:
        worker.close()
