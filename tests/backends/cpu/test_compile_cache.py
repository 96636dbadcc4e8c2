"""The persistent compile cache: hits skip code generation, bad entries rebuild,
and nothing another user could have planted or changed is ever run."""
import dataclasses
import functools
import glob
import os
import pickle
import shutil
import threading

import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit import workloads
import kerasjit.backends.cpu as cpu
from kerasjit.backends.cpu import cache
from kerasjit.frontend.bridge import hlo_module, subgraph_function


def fn(x, w):
    return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0


def other(x, w):
    return tf.nn.relu(tf.matmul(x, w)) * 3.0 - 1.0


def with_constants(x, w):
    table = tf.constant(np.arange(20, dtype=np.float32).reshape(5, 4))
    y = tf.nn.relu(tf.matmul(x, w) + table[:1]) * 2.0
    return tf.reduce_sum(y, axis=0), tf.cast(y > 1, tf.int32), w + table


ARGS = [np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32),
        np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)]
EXPECTED = fn(*ARGS).numpy()


@pytest.fixture
def builds(monkeypatch):
    """One item per compile that generated code rather than load it."""
    calls, build = [], cpu.CpuBackend.build

    def counted(*args, **kwargs):
        calls.append(None)
        return build(*args, **kwargs)
    monkeypatch.setattr(cpu.CpuBackend, "build", counted)
    return calls


def compile_fresh(function=fn, donate=None):
    """Compile `function` on ARGS in a fresh backend (nothing linked in this process
    yet): its cache key, the record the backend keeps and the executable."""
    backend = cpu.CpuBackend()
    executable = backend.compile(hlo_module(function, *ARGS), donate)
    ((key, (record, _)),) = backend.loaded.items()
    return key, record, executable


def result(function=fn):
    return compile_fresh(function)[2](ARGS)[0]


def contents(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_second_compile_is_a_cache_hit(compile_cache_dir, monkeypatch):
    np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert len(glob.glob(str(compile_cache_dir / "*.kjc"))) == 1

    def no_codegen(*_):
        raise AssertionError("code was generated despite a cache entry")
    monkeypatch.setattr(cpu.CpuBackend, "build", no_codegen)
    executable = compile_fresh()[2]
    np.testing.assert_allclose(executable(ARGS)[0], EXPECTED, rtol=1e-6)
    assert executable.kernels                 # explain() still shows the kernels


def renamed(x, w):
    with tf.name_scope("another_layer"):
        return fn(x, w)


def test_the_key_ignores_names_and_metadata_not_values():
    """A second copy of a model (layers named `dense_1` where the first had
    `dense`) finds the first one's code; another constant does not."""
    key = cache.fingerprint
    assert key(hlo_module(renamed, *ARGS)) == key(hlo_module(fn, *ARGS))
    assert "another_layer" in str(hlo_module(renamed, *ARGS))
    assert key(hlo_module(other, *ARGS)) != key(hlo_module(fn, *ARGS))


def test_the_bridge_key_ignores_names_not_the_graph():
    """The cached HLO of a graph serves the same graph with other names (a
    second copy of a model), never another graph."""
    def digest(function):
        graph = tf.function(function).get_concrete_function(
            *[tf.TensorSpec(a.shape, a.dtype) for a in ARGS]).graph
        graph_def = graph.as_graph_def()
        assert any("another_layer" in n.name for n in graph_def.node) == (function is renamed)
        return subgraph_function(list(graph_def.node), graph_def.library, [],
                                 [t.name for t in graph.outputs])[1]
    assert digest(renamed) == digest(fn) != digest(other)


def looped(x, w, scale=2.0):
    _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(y) * scale), [0, x])
    return tf.matmul(y, w)


def test_the_bridge_key_ignores_function_names_not_their_bodies():
    """TensorFlow names a loop's body by a per-process counter: the same loop
    traced again (a second copy of a model, or after other functions) finds
    the first one's HLO; a loop with another body does not."""
    def digest(function):
        graph_def = tf.function(function).get_concrete_function(
            *[tf.TensorSpec(a.shape, a.dtype) for a in ARGS]).graph.as_graph_def()
        names = {f.signature.name for f in graph_def.library.function}
        return names, subgraph_function(list(graph_def.node), graph_def.library, [],
                                        ["MatMul:0"])[1]
    (names, first), (other_names, again) = digest(looped), digest(looped)
    assert names and names.isdisjoint(other_names)
    assert first == again != digest(functools.partial(looped, scale=3.0))[1]


def test_a_second_copy_of_a_model_with_a_loop_compiles_nothing(compile_cache_dir, monkeypatch,
                                                               builds):
    """An LSTM's second copy in the same process (its loops' functions named
    anew) takes the first copy's HLO and code from the cache, and trains as
    the first did."""
    import keras
    from kerasjit.frontend import bridge
    bridged, bridge_hlo = [], bridge.hlo_module
    monkeypatch.setattr(bridge, "hlo_module", lambda *a: bridged.append(None) or bridge_hlo(*a))
    x, y = workloads.token_data(32, 6, 50)

    def trained():
        keras.utils.set_random_seed(3)
        model = kerasjit.wrap(workloads.text_rnn("LSTM", vocab=50, length=6, units=8),
                              backend="cpu", race=False, background=False)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()
    first = trained()
    assert bridged and builds
    del bridged[:], builds[:]
    for got, want in zip(trained(), first, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not bridged and not builds


@pytest.mark.parametrize("profiled", ["", "1"])
def test_a_loaded_record_is_the_built_one(compile_cache_dir, monkeypatch, builds, profiled):
    monkeypatch.setenv("KERASJIT_PROFILE_KERNELS", profiled)    # counters: None, or a tuple
    _, built, _ = compile_fresh(with_constants, donate={1: 2})
    _, loaded, executable = compile_fresh(with_constants, donate={1: 2})
    assert len(builds) == 1 and loaded.keys() == built.keys()
    for name in built.keys() - {"program"}:
        assert loaded[name] == built[name] and type(loaded[name]) is type(built[name]), name
    programs = loaded["program"], built["program"]
    for field in dataclasses.fields(programs[1]):
        if field.name != "buffers":
            assert getattr(programs[0], field.name) == getattr(programs[1], field.name)
    constants = 0
    for got, want in zip(*(p.buffers for p in programs), strict=True):
        assert dataclasses.replace(got, data=None) == dataclasses.replace(want, data=None)
        if want.data is not None:
            np.testing.assert_array_equal(got.data, want.data, strict=True)
            constants += 1
    assert constants and programs[1].aliases    # the case exercises both
    want = with_constants(*ARGS)
    donated = [a.copy() for a in ARGS]         # parameter 1 is overwritten by output 2
    for got, expected in zip(executable(donated), want):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("damage", [b"", b"not an entry", None])
def test_corrupt_entry_is_rebuilt(compile_cache_dir, damage):
    result()
    (entry,) = glob.glob(str(compile_cache_dir / "*.kjc"))
    if damage is None:                         # flip bytes inside: checksum mismatch
        data = bytearray(open(entry, "rb").read())
        data[len(data) // 2] ^= 0xFF
        damage = bytes(data)
    with open(entry, "wb") as f:
        f.write(damage)
    np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert os.path.getsize(entry) > 1000      # rewritten with a good entry


def test_empty_cache_dir_disables_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASJIT_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert not os.listdir(tmp_path)


class Payload:
    """Unpickling it runs code: it creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_planted_pickle_is_never_run(compile_cache_dir, tmp_path, builds):
    key = compile_fresh()[0]
    marker = tmp_path / "payload-ran"
    planted = pickle.dumps(Payload(marker))
    for suffix in (".pkl", ".kjc"):            # the old entry name and the current one
        (compile_cache_dir / (key + suffix)).write_bytes(planted)
    np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert not marker.exists()
    assert (compile_cache_dir / (key + ".kjc")).read_bytes() != planted     # rebuilt over it
    result()
    assert len(builds) == 2                    # and the rebuilt entry is a hit


def test_entry_that_is_a_symlink_is_not_followed(compile_cache_dir, tmp_path, monkeypatch, builds):
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(elsewhere))
    key = compile_fresh()[0]
    target = elsewhere / (key + ".kjc")
    valid = target.read_bytes()
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(compile_cache_dir))
    compile_cache_dir.mkdir(mode=0o700)
    (compile_cache_dir / target.name).symlink_to(target)
    np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert len(builds) == 2                    # rebuilt, not loaded through the link
    assert target.read_bytes() == valid and not target.is_symlink()
    assert not (compile_cache_dir / target.name).is_symlink()   # replaced by an entry of its own


def test_fifo_at_an_entry_path_does_not_block(compile_cache_dir):
    key = compile_fresh()[0]
    entry = compile_cache_dir / (key + ".kjc")
    entry.unlink()
    os.mkfifo(entry)
    results = []
    thread = threading.Thread(target=lambda: results.append(result()), daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the compile blocked opening the FIFO"
    np.testing.assert_allclose(results[0], EXPECTED, rtol=1e-6)
    assert entry.is_file()


def test_directory_at_an_entry_path_leaves_no_temp_files(compile_cache_dir):
    key = compile_fresh()[0]
    entry = compile_cache_dir / (key + ".kjc")
    entry.unlink()
    entry.mkdir()
    for _ in range(2):
        np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    assert os.listdir(compile_cache_dir) == [entry.name]


def assert_bypassed(cache_path, builds, reason):
    """A valid entry in `cache_path` is neither read nor rewritten, compiles still
    work, and one warning says why."""
    before = contents(cache_path)
    with pytest.warns(RuntimeWarning) as warned:
        for _ in range(2):
            np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    (warning,) = [w for w in warned if issubclass(w.category, RuntimeWarning)]
    message = str(warning.message)
    assert str(cache_path) in message and reason in message and "KERASJIT_CACHE_DIR" in message
    assert len(builds) == 3                    # the first compile, then two without the cache
    assert contents(cache_path) == before


def test_directory_others_can_write_is_not_used(compile_cache_dir, builds):
    compile_fresh()
    compile_cache_dir.chmod(0o777)
    assert_bypassed(compile_cache_dir, builds, "writable by group or others")


def test_directory_of_another_user_is_not_used(compile_cache_dir, builds, monkeypatch):
    compile_fresh()
    someone_else = os.geteuid() + 1
    monkeypatch.setattr(cache.os, "geteuid", lambda: someone_else)
    assert_bypassed(compile_cache_dir, builds, f"not by you (uid {someone_else})")


def test_directory_below_one_others_can_write_is_not_used(tmp_path, monkeypatch, builds):
    shared = tmp_path / "shared"
    shared.mkdir()
    cache_path = shared / "cache"
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(cache_path))
    compile_fresh()
    shared.chmod(0o777)                        # not sticky: anyone can swap our directory
    assert_bypassed(cache_path, builds, f"{shared} above it is writable by group or others")


@pytest.mark.parametrize("umask", [0, 0o277])
def test_new_directory_is_private_whatever_the_umask(compile_cache_dir, umask):
    previous = os.umask(umask)
    try:
        np.testing.assert_allclose(result(), EXPECTED, rtol=1e-6)
    finally:
        os.umask(previous)
    assert compile_cache_dir.stat().st_mode & 0o777 == 0o700
    assert len(glob.glob(str(compile_cache_dir / "*.kjc"))) == 1


def test_entry_holding_another_key_is_ignored(compile_cache_dir):
    key = compile_fresh(fn)[0]
    other_key = compile_fresh(other)[0]
    shutil.copy(compile_cache_dir / (key + ".kjc"), compile_cache_dir / (other_key + ".kjc"))
    np.testing.assert_allclose(result(other), other(*ARGS).numpy(), rtol=1e-6)


def test_a_warm_start_skips_the_bridge_and_the_passes(compile_cache_dir, monkeypatch):
    """A warm start runs neither TensorFlow's bridge nor the HLO passes: the
    optimised HLO for a graph and specs is cached text, and so is the bridge's
    (what a changed compiler starts from); a damaged text is made again."""
    from kerasjit.frontend import bridge
    first = kerasjit.jit(with_constants, backend="cpu")(*ARGS)
    (bridged,) = compile_cache_dir.glob("bridge-*.kjt")
    (optimized,) = compile_cache_dir.glob("optimized-*.kjt")
    made, passes = [], []
    original, optimize = bridge.hlo_module, bridge.optimize_as_configured
    monkeypatch.setattr(bridge, "hlo_module", lambda *args: made.append(1) or original(*args))
    monkeypatch.setattr(bridge, "optimize_as_configured",
                        lambda module: passes.append(1) or optimize(module))

    def run_again(bridge_runs, pass_runs):
        again = kerasjit.jit(with_constants, backend="cpu")(*ARGS)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
        assert (len(made), len(passes)) == (bridge_runs, pass_runs)
    run_again(0, 0)
    run_again(0, 0)
    optimized.write_bytes(optimized.read_bytes().replace(b"multiply", b"multiplx"))
    run_again(0, 1)
    for entry in (optimized, bridged):
        entry.write_bytes(entry.read_bytes().replace(b"multiply", b"multiplx"))
    run_again(1, 2)


def test_skipped_passes_are_part_of_the_optimised_module_key(compile_cache_dir, monkeypatch):
    first = kerasjit.jit(with_constants, backend="cpu")(*ARGS)
    monkeypatch.setenv("KERASJIT_SKIP_PASSES", "constant_folding")
    again = kerasjit.jit(with_constants, backend="cpu")(*ARGS)
    assert len(list(compile_cache_dir.glob("optimized-*.kjt"))) == 2
    for a, b in zip(first, again):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _accumulating_mlp():
    import keras
    model = workloads.mlp(dropout=0.2)
    model.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2),
                  loss=model.loss, metrics=["accuracy"])
    return model


WARM_START_CASES = {   # (model, data, whether a warm start traces it for the compiler alone)
    "mnist_cnn": (lambda: workloads.mnist_cnn(dropout=0.25),
                  lambda: workloads.classification_data(32, (28, 28, 1), 10), True),
    # (a loop's body is a function, whose body a trace without automatic control
    # dependencies has without them too: traced as TensorFlow runs it)
    "text_lstm": (lambda: workloads.text_rnn("LSTM", vocab=50, length=6, units=8),
                  lambda: workloads.token_data(32, 6, 50), False),
    "mixed_float16": (lambda: workloads.under_policy("mixed_float16", workloads.mlp)(dropout=0.2),
                      lambda: workloads.classification_data(32, (784,), 10), True),
    "gradient_accumulation": (_accumulating_mlp,
                              lambda: workloads.classification_data(32, (784,), 10), True),
}


@pytest.mark.parametrize("case", WARM_START_CASES)
def test_a_warm_start_trains_exactly_as_the_cold_one(compile_cache_dir, case):
    """The optimised module and the code come from the cache on a warm start;
    it trains bit for bit as the cold start did (convolutions, a while loop,
    16-bit floats and dropout's random bits through the cached text, branches
    of an optimizer). A step without loops is traced once, without
    TensorFlow's automatic control dependencies: its graph is the one
    compiled before."""
    import keras
    build, data, unordered = WARM_START_CASES[case]
    x, y = data()

    def trained(background):
        keras.utils.set_random_seed(3)
        model = kerasjit.wrap(build(), backend="cpu", race=False, background=background)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        (run,) = model._kerasjit.train.programs.values()
        (cluster,) = run.program.clusters
        return model.get_weights(), cache.fingerprint(cluster.specializer.module), run.trace
    cold_weights, cold_module, cold_trace = trained(background=False)
    assert list(compile_cache_dir.glob("optimized-*.kjt")) and not cold_trace.unordered
    warm_weights, warm_module, warm_trace = trained(background=unordered)
    assert warm_module == cold_module
    assert (warm_trace.unordered, warm_trace.traces) == (unordered, 1)
    for cold, warm in zip(cold_weights, warm_weights, strict=True):
        np.testing.assert_array_equal(cold, warm)
