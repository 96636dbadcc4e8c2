"""Every check that needs a GPU, in one run of a few minutes.

On a machine with a CUDA GPU, CuPy with the CUDA libraries
(`pip install -e ".[gpu,test]"`) and TensorFlow:

    python examples/gpu_check.py [--out reports] [--quick]

1. opens the GPU backend (or says exactly why it cannot, and stops);
2. runs the GPU tests, failing rather than skipping them: every structured
   op against the numpy evaluator, in-place variables, CUDA graph replay, and
   the softmax regression and MLP trained through `wrap(backend="gpu")` against
   plain Keras (tests/backends/gpu/test_gpu_runtime.py, marker `gpu`);
3. says how many of a training step's clusters replay a captured CUDA graph;
4. benchmarks plain Keras, Keras+XLA and kerasjit on the GPU
   (`python -m kerasjit.bench --backend gpu`), writing OUT/gpu_benchmark.md/.csv.

The test log goes to OUT/gpu_tests.log. Exits non-zero if any step fails.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(command, log=None, **env):
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print(done.stdout[-6000:], flush=True)
    if log:
        with open(log, "w") as f:
            f.write(done.stdout)
    print(f"({time.perf_counter() - start:.0f} s, exit {done.returncode})", flush=True)
    return done.returncode


def graphs_captured():
    """How many of an MLP train step's compiled clusters replay a CUDA graph (those
    without GEMMs: CuPy's cuBLAS calls refuse a capturing stream)."""
    import keras
    import kerasjit
    from kerasjit import workloads
    keras.utils.set_random_seed(0)
    model = kerasjit.wrap(workloads.mlp(), backend="gpu")
    x, y = workloads.classification_data(640, (784,), 10)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    executables = model._kerasjit.train.executables()
    graphs = sum(getattr(e, "_graph", None) is not None for e in executables)
    return graphs, len(executables)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "reports"))
    parser.add_argument("--quick", action="store_true", help="fewer benchmark rounds and steps")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    from kerasjit.backends import gpu
    try:
        backend = gpu.open_backend()
    except gpu.GpuUnavailable as e:
        print(f"kerasjit cannot use a GPU here: {e}")
        return 2
    print(f"GPU backend on {backend.device}", flush=True)

    failures = 0
    failures += run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs",
                     "tests/backends/gpu/test_gpu_runtime.py"], os.path.join(args.out, "gpu_tests.log"),
                    KERASJIT_REQUIRE_GPU="1") != 0
    graphs, clusters = graphs_captured()
    print(f"CUDA graphs: {graphs} of {clusters} compiled clusters of the MLP's train step "
          "replay a captured graph", flush=True)
    # (--no-jax: the Keras-on-JAX peer runs on the CPU here, no GPU contender)
    bench = [sys.executable, "-m", "kerasjit.bench", "--backend", "gpu", "--out", args.out,
             "--name", "gpu_benchmark", "--no-jax"]
    if args.quick:
        bench += ["--rounds", "3", "--softmax-steps", "200", "--steps", "30", "--mnist-steps", "10",
                  "--cnn-steps", "2"]
    failures += run(bench) != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
