"""A wrapped model's compiled clusters saved to one file, and replayed on any backend.

    python -m kerasjit.capture record --workloads mnist_cnn ResNet50 --out captures/
    python -m kerasjit.capture replay captures/*.npz --backend gpu --repeats 20

`record` trains, evaluates and predicts one batch of each model through kerasjit and keeps
every cluster it compiles: the optimised HLO text, its donations and the arguments of its
first call. `replay` needs neither TensorFlow nor Keras: it compiles each cluster on the
backend asked for, runs it (three times: a GPU executable runs, captures, then replays a
CUDA graph) against the numpy evaluator, and times it. A bug report that ships a capture
reproduces on any machine; a GPU without TensorFlow checks whole train steps.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

from .arrays import host
from .compiler import Backend, Executable

# Float arguments past this size are saved as their shape, type, mean, spread and range and
# drawn anew on replay (the weights of a large model); integers are saved whole (labels,
# indices).
SAVED_FLOAT_BYTES = 1 << 18
RTOL, ATOL = 1e-3, 1e-6     # a whole step's outputs against the evaluator's
OFF_ALLOWED = 0.01          # elements of one output past the tolerance in a "close" step
NUDGE, SPREAD = 2.0 ** -14, 4.0     # the arguments' relative nudge; its spread's weight


class Recorder(Backend):
    """`inner`, keeping each module it compiles and the first arguments each executable gets."""

    def __init__(self, inner):
        self.inner, self.clusters = inner, []
        self.name, self.target, self.optimizes = inner.name, inner.target, inner.optimizes
        self.races_tensorflow, self.fallback = inner.races_tensorflow, inner.fallback

    def compile(self, module, donate=None, optimized=False, only_cached=False):
        entry = {"hlo": str(module), "donate": dict(donate or {}), "optimized": optimized}
        executable = self.inner.compile(module, donate, optimized, only_cached)
        self.clusters.append(entry)
        return _FirstCall(executable, entry)


class _FirstCall(Executable):
    multi_step = False          # (one call at a time, so the arguments are seen)

    def __init__(self, inner, entry):
        self.inner, self.entry = inner, entry
        self.program, self.kernels = inner.program, inner.kernels
        self.buffer_bytes, self.cache_key = inner.buffer_bytes, inner.cache_key

    def __call__(self, args):
        if "args" not in self.entry:    # (before the call: a donated argument is written over)
            self.entry["args"] = [np.array(host(a)) for a in args]
        return self.inner(args)


def save(path, clusters, meta=None):
    """The recorded clusters (those that ran) to one .npz file."""
    arrays, index = {}, []
    for c, cluster in enumerate(c for c in clusters if "args" in c):
        drawn = []
        for a, value in enumerate(cluster["args"]):
            if value.dtype.kind == "f" and value.nbytes > SAVED_FLOAT_BYTES:
                wide = value.astype(np.float64)
                drawn.append([a, *(float(f(wide)) for f in (np.mean, np.std, np.min, np.max))])
                arrays[f"c{c}_a{a}"] = np.zeros(value.shape, np.dtype([]))    # shape alone
                arrays[f"c{c}_t{a}"] = np.array(value.dtype.str)
            else:
                arrays[f"c{c}_a{a}"] = value
        index.append({"hlo": cluster["hlo"], "optimized": cluster["optimized"],
                      "donate": {str(k): v for k, v in cluster["donate"].items()},
                      "args": len(cluster["args"]), "drawn": drawn})
    arrays["index"] = np.array(json.dumps({"meta": meta or {}, "clusters": index}))
    np.savez_compressed(path, **arrays)
    return len(index)


def load(path):
    """[(cluster dict with 'args' filled in)], meta; drawn arguments are drawn with a fixed seed."""
    data = np.load(path)
    index = json.loads(str(data["index"]))
    rng = np.random.default_rng(0)
    clusters = []
    for c, cluster in enumerate(index["clusters"]):
        drawn = {a: moments for a, *moments in cluster["drawn"]}
        args = []
        for a in range(cluster["args"]):
            value = data[f"c{c}_a{a}"]
            if a in drawn:
                mean, std, low, high = drawn[a]     # (clipped: a variance stays >= 0)
                value = np.clip(rng.normal(mean, std, value.shape), low, high)
                value = value.astype(str(data[f"c{c}_t{a}"]))
            args.append(value)
        clusters.append({**cluster, "donate": {int(k): v for k, v in cluster["donate"].items()},
                         "args": args})
    return clusters, index["meta"]


# ------------------------------------------------------------------------ record

@contextlib.contextmanager
def recording(model, backend="cpu"):
    """`model` wrapped on a Recorder of `backend` (compiled in the foreground, never raced);
    yields the Recorder, and writes the variables back to Keras after."""
    from .backends import get_backend
    from .wrap import wrap
    recorder = Recorder(get_backend(backend))
    wrap(model, backend=recorder, race=False, background=False)
    try:
        yield recorder
    finally:
        model._kerasjit.store.flush()


def record_workload(name, image_size=150):
    """The clusters of one batch of `fit`, `evaluate` and `predict` of the benchmark's
    workload `name` (bench_suite.py: its model, data and batch size), or of Keras
    application `name` (bench_startup.py's models: 32x32 images, batch 8)."""
    import types
    import keras
    from . import bench_startup
    from .bench_suite import build_model, suite
    sizes = types.SimpleNamespace(softmax_steps=1, steps=1, mnist_steps=1, cnn_steps=1,
                                  image_size=image_size)
    workloads = suite(sizes)
    keras.utils.set_random_seed(0)
    if name in workloads:
        work = workloads[name]
        model, batch = build_model(work.build, jit_compile=False), work.batch
        x, y = work.data(batch)
    elif name in bench_startup.MODELS:
        model, batch = bench_startup.application(name), 8
        x, y = bench_startup.application_data(batch)
    else:
        raise SystemExit(f"no workload {name!r}; choose from "
                         f"{', '.join([*workloads, *bench_startup.MODELS])}")
    with recording(model) as recorder:
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        model.evaluate(x, y, batch_size=batch, verbose=0)
        model.predict(x, batch_size=batch, verbose=0)
    return recorder.clusters


# ------------------------------------------------------------------------ replay

def _fresh(args):
    return [np.array(a) for a in args]      # (a donated argument is written over)


def _reference(cluster):
    """The evaluator's outputs of `cluster`, and how far each element moves when the float
    arguments move by a few units in their last place: where rounding alone decides an
    output (Adam's first update of a gradient that is zero but for rounding, as a bias
    before batch normalisation's, moves by the learning rate one way or the other), a
    compiled result may differ as much."""
    from .hlo import parse_module
    from .hlo.evaluator import evaluate
    module = parse_module(cluster["hlo"])      # (the evaluator leaves it as it is)

    def run(args):
        outputs = evaluate(module, args)
        return [np.asarray(o) for o in (outputs if isinstance(outputs, tuple) else [outputs])]
    want = run(_fresh(cluster["args"]))
    rng = np.random.default_rng(1)
    nudged = [a * (1 + rng.uniform(-NUDGE, NUDGE, a.shape)).astype(a.dtype)
              if a.dtype.kind == "f" else np.array(a) for a in cluster["args"]]
    spread = [np.abs(n.astype(np.float64) - w) if w.dtype.kind == "f" else None
              for n, w in zip(run(nudged), want)]
    return want, spread


def _error(got, want, spread=None):
    """(worst, off): the worst |got - want| over (atol + RTOL |want|), and the fraction of
    elements past 1. atol is the most of: RTOL of the output's largest magnitude, ATOL (a
    gradient that is zero but for rounding, as a key bias's in attention, is all noise),
    and SPREAD times the most an element of `want` moves when the arguments do (`spread`,
    see _reference: an output that rounding can move is checked no closer than that).
    Integers and shapes match exactly."""
    got = np.asarray(host(got))
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf"), 1.0
    if want.dtype.kind != "f":
        return (0.0, 0.0) if np.array_equal(got, want) else (float("inf"), 1.0)
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    g, w = np.where(both_nan, 0, g), np.where(both_nan, 0, w)
    moved = 0.0 if spread is None else float(np.max(np.nan_to_num(spread), initial=0.0))
    scale = max(RTOL * float(np.max(np.abs(w), initial=0.0)), ATOL, SPREAD * moved) \
        + RTOL * np.abs(w)
    off = np.nan_to_num(np.abs(g - w) / scale, nan=np.inf)
    return float(np.max(off, initial=0.0)), float(np.mean(off > 1)) if off.size else 0.0


def verdict(row):
    """"ok" (every element within tolerance), "close" (a few elements past it: a step
    whose outputs rounding can flip, as Adam's first update of a gradient near zero, which
    moves by the learning rate one way or the other), "MISMATCH" or "FAILED"."""
    if "failed" in row:
        return "FAILED"
    if row["error"] <= 1:
        return "ok"
    return "close" if row["off"] <= OFF_ALLOWED else "MISMATCH"


def replay_cluster(cluster, backend, repeats=0, peer=None):
    """{error, kernels, compile_s, ms, peer_ms}: `cluster` compiled on `backend`, run three
    times against the evaluator (error: the worst over its outputs, see _error), then timed
    over `repeats` more calls on arguments already on the device, as are a step's variables
    (so is `peer`'s executable of the same HLO, if given: see xla_peer)."""
    from .hlo import parse_module
    want, spread = _reference(cluster)
    start = time.perf_counter()
    executable = backend.compile(parse_module(cluster["hlo"]), cluster["donate"],
                                 cluster["optimized"])
    row = {"compile_s": time.perf_counter() - start, "kernels": len(executable.kernels),
           "on": type(executable).__name__}
    errors = []
    for _ in range(3):
        got = executable(_fresh(cluster["args"]))
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} outputs, the evaluator gives {len(want)}")
        errors += [_error(g, w, d) for g, w, d in zip(got, want, spread)]
    row["error"], row["off"] = (max(e) for e in zip(*errors))
    if repeats:
        device = getattr(backend, "device", None)
        args = _fresh(cluster["args"])
        if device is not None:
            args = [device.upload(a, a.dtype) for a in args]
        row["ms"] = _timed(lambda: executable(args), repeats,
                           device and (lambda outputs: device.synchronize()))
    if repeats and peer is not None:
        run, wait = peer(cluster["hlo"], _fresh(cluster["args"]))
        row["peer_ms"] = _timed(run, repeats, wait)
    return row


def _timed(call, repeats, wait=None):
    """Milliseconds a call of `call`, over `repeats` calls after one untimed; `wait()` waits
    for the device to finish what was asked of it."""
    outputs = call()
    if wait:
        wait(outputs)
    start = time.perf_counter()
    for _ in range(repeats):
        outputs = call()
    if wait:
        wait(outputs)
    return 1e3 * (time.perf_counter() - start) / repeats


def xla_peer(hlo, args):
    """XLA's executable of HLO text `hlo` (through jaxlib, on JAX's default device) on `args`
    put there: (run, wait) for _timed."""
    import jax
    jax.config.update("jax_enable_x64", True)      # (the HLO's s64 stays s64)
    from jax._src import xla_bridge
    from jax._src.lib import _jax, xla_client
    module = xla_client.hlo.hlo_module_from_text(hlo)
    mlir = _jax.mlir.xla_computation_to_mlir_module(
        xla_client.XlaComputation(module.as_serialized_hlo_module_proto()))
    client = xla_bridge.get_backend()
    device = client.devices()[0]
    executable = client.compile_and_load(mlir, xla_client.DeviceList((device,)),
                                         xla_client.CompileOptions())
    on_device = [jax.device_put(a, device) for a in args]
    return (lambda: executable.execute(on_device),
            lambda outputs: [o.block_until_ready() for o in outputs])


def replay(path, backend, repeats=0, peer=None, out=sys.stdout):
    """Rows of replay_cluster for every cluster in capture `path`; a cluster that fails to
    compile or run gets its exception as its row's `failed`."""
    clusters, meta = load(path)
    rows = []
    for i, cluster in enumerate(clusters):
        row = {"capture": os.path.basename(path), "cluster": i, **meta}
        try:
            row.update(replay_cluster(cluster, backend, repeats, peer))
        except Exception as e:          # (the next cluster still runs: a report, not a stop)
            row["failed"] = f"{type(e).__name__}: {str(e).strip()[:400]}"
        rows.append(row)
        print(_describe(row), file=out, flush=True)
    return rows


def _describe(row):
    where = f"{row['capture']} #{row['cluster']}"
    if "failed" in row:
        return f"FAILED   {where}: {row['failed']}"
    timing = f", {row['ms']:.3f} ms a call" if "ms" in row else ""
    if "peer_ms" in row:
        timing += f" (XLA {row['peer_ms']:.3f} ms)"
    return (f"{verdict(row):8s} {where}: {row['kernels']} kernels ({row['on']}), error "
            f"{row['error']:.3g} ({100 * row['off']:.2g}% off), compiled in "
            f"{row['compile_s']:.2f} s{timing}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="capture workloads' clusters (needs TensorFlow)")
    rec.add_argument("--workloads", nargs="+", required=True)
    rec.add_argument("--out", required=True, help="folder for one <workload>.npz each")
    rep = commands.add_parser("replay", help="run captures on a backend against the evaluator")
    rep.add_argument("captures", nargs="+")
    rep.add_argument("--backend", default="cpu")
    rep.add_argument("--repeats", type=int, default=0, help="timed calls per cluster")
    rep.add_argument("--xla", action="store_true",
                     help="time XLA on the same HLO too (jaxlib, on JAX's default device)")
    rep.add_argument("--csv", help="write the rows here too")
    args = parser.parse_args(argv)
    if args.command == "record":
        os.makedirs(args.out, exist_ok=True)
        for name in args.workloads:
            path = os.path.join(args.out, f"{name}.npz")
            count = save(path, record_workload(name), {"workload": name})
            print(f"{path}: {count} clusters ({os.path.getsize(path) / 1e6:.1f} MB)")
        return 0
    from .backends import get_backend
    if args.backend == "gpu":       # (no quiet fallback to the CPU: the GPU is what is checked)
        from .backends import gpu
        try:
            backend = gpu.open_backend()
        except gpu.GpuUnavailable as e:
            print(f"no GPU backend: {e}")
            return 2
    else:
        backend = get_backend(args.backend)
    print(f"replaying on the {backend.name} backend"
          + (f" ({backend.device})" if hasattr(backend, "device") else ""), flush=True)
    rows = [row for path in args.captures for row in replay(path, backend, args.repeats,
                                                              xla_peer if args.xla else None)]
    if args.csv:
        import pandas as pd
        pd.DataFrame(rows).to_csv(args.csv, index=False)
    verdicts = [verdict(r) for r in rows]
    print(", ".join(f"{verdicts.count(v)} {v}" for v in ("ok", "close", "MISMATCH", "FAILED"))
          + f" of {len(rows)} clusters against the evaluator")
    bad = [v for v in verdicts if v in ("MISMATCH", "FAILED")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
