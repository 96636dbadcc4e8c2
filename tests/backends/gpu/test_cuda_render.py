"""The CUDA C renderer, without a GPU.

Compile: every loop kernel of real train steps goes through nvcc for sm_80
and sm_90 with warnings as errors, and through NVRTC (support/nvrtc.py) as the GPU
backend compiles them on the device. Numerics: the same kernel source, built
by g++ as C++ (support/cuda_host.py), is run on random inputs and compared with
the numpy evaluator: every elementwise opcode per dtype, and the structured
ops whose kernels are not GEMMs (dots and depthwise convolution as
reductions, convolutions as implicit GEMMs with and without epilogues,
select-and-scatter, variadic reductions, Philox bits).
"""
import dataclasses
import functools
import math
import subprocess

import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasjit import workloads
from kerasjit.backends.gpu import GpuBackend
from kerasjit.backends.gpu.cuda_ops import PRELUDE
from kerasjit.backends.gpu.cuda_render import kernel_names, render_program
from kerasjit.backends.gpu.executable import GpuExecutable
from kerasjit.frontend.bridge import hlo_module, literals_from_proto
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.hlo.shape import DTYPES
from kerasjit.kernels.ir import (ChunkIndex, ChunkLoop, GemmCall, ImplicitGemm, LoopKernel,
                                 Reduce, ScatterKernel, leaf_steps, walk)
from kerasjit.compiler import lower
from kerasjit.passes import optimize

from tests.support.cuda_host import HostDevice, Library, tool
from tests.support.nvrtc import compile_cuda
from tests.support.outputs import assert_outputs_match
from tests.support.structured_cases import (DOT_CONV_POOL, LOOP_ONLY, REVERSED_WINDOW,
                                            depthwise_and_grads, rand)
from tests.support.elementwise_cases import (FLOAT_BINARY, FLOAT_UNARY, INT_BINARY, INT_UNARY,
                                             elementwise_module, positive, result_type)

INTS = ["s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64"]


def program_of(module, implicit_gemm=True):
    """`module` lowered as the GPU backend lowers it (or with convolutions as
    patch matrices and GEMMs in ChunkLoops, the path of other layouts)."""
    optimize(module)
    return lower(module, dataclasses.replace(GpuBackend.target, implicit_gemm=implicit_gemm))


# ------------------------------------------------------------------ compile
def images(shape, classes):
    return lambda: workloads.classification_data(8, shape, classes)


MODELS = {
    "softmax_regression": (workloads.softmax_regression, images((784,), 10)),
    "mlp_dropout": (workloads.mlp, images((784,), 10)),
    "conv_bn": (workloads.conv_bn, images((28, 28, 1), 10)),
    "mnist_cnn": (workloads.mnist_cnn, images((28, 28, 1), 10)),
    "elephant_cnn": (lambda: workloads.elephant_cnn(image_size=40), images((40, 40, 3), 1)),
    "text_cnn": (lambda: workloads.text_cnn(vocab=50, length=12),
                 lambda: workloads.token_data(8, 12, 50)),
}


@functools.lru_cache(maxsize=None)     # traced once, shared by the tests below
def train_step_program(name, implicit_gemm=True):
    build, data = MODELS[name]
    keras.utils.set_random_seed(0)
    model = build()
    x, y = (tf.constant(a) for a in data())
    step = tf.function(lambda x, y: model.train_step((x, y)), jit_compile=True)
    ir = step.experimental_get_compiler_ir(x, y)
    constants = literals_from_proto(ir(stage="hlo_serialized"))
    return program_of(parse_module(ir(stage="hlo"), constants), implicit_gemm)


@pytest.mark.parametrize("name", list(MODELS))
def test_train_step_kernels_compile_with_nvcc(name, tmp_path):
    nvcc = tool("nvcc")
    program = train_step_program(name)
    source, kernels = render_program(program, name)
    assert len(kernels) == sum(isinstance(s, (LoopKernel, ImplicitGemm))
                               for s in leaf_steps(program.steps))
    (tmp_path / "k.cu").write_text(source)
    done = subprocess.run(
        [nvcc, "-fatbin", "-Werror", "all-warnings", "-o", str(tmp_path / "k.fatbin"),
         "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
         str(tmp_path / "k.cu")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.parametrize("name", list(MODELS))
def test_train_step_kernels_compile_with_nvrtc(name):
    """As CuPy's RawModule compiles them on the device (NVRTC, the backend's options)."""
    source, kernels = render_program(train_step_program(name), name)
    for arch in ("sm_80", "sm_90"):
        ptx = compile_cuda(source, arch)
        assert all(f".entry {n}(" in ptx for n, _ in kernels)


def test_train_steps_cover_every_kernel_kind():
    """The models above exercise what the renderer has to get right."""
    kernels = [s for n in ("mlp_dropout", "conv_bn")
               for s in leaf_steps(train_step_program(n).steps) if isinstance(s, LoopKernel)]
    nodes = [node for k in kernels for _, e in k.stores for node in walk(e)]
    assert any(isinstance(n, Reduce) and len(n.accs) > 1 for n in nodes)    # variadic
    patches = leaf_steps(train_step_program("conv_bn", implicit_gemm=False).steps)
    assert any(isinstance(n, ChunkIndex) for s in patches if isinstance(s, LoopKernel)
               for _, e in s.stores for n in walk(e))                       # conv patches
    gemms = [s for s in leaf_steps(train_step_program("mnist_cnn").steps)
             if isinstance(s, ImplicitGemm)]
    assert len(gemms) >= 5 and any(s.epilogue is not None for s in gemms)  # convolutions
    assert any(len(k.stores) > 1 for k in kernels)                          # multi-output
    assert any(getattr(n, "opcode", None) == "shift-right-logical" and n.dtype == "u64"
               for n in nodes)                                              # Philox
    assert any(isinstance(s, ScatterKernel)                                 # embedding gradient
               for s in leaf_steps(train_step_program("text_cnn").steps))


def block_per_element(kernel):
    """A reduction of 1024+ terms: a block per output element, threads over the terms."""
    return any(isinstance(n, Reduce) and math.prod(n.extents) >= 1024
               for _, e in kernel.stores for n in walk(e, into_reductions=False))


def test_executable_launches_every_step_in_order(tmp_path):
    """ChunkLoops unrolled: each chunk runs its kernels and GEMMs with its index,
    on a thread per element or, for long reductions, a block per element."""
    program = train_step_program("conv_bn", implicit_gemm=False)
    names = {id(step): name for name, step in kernel_names(program, "m")}
    executable = GpuExecutable(program, HostDevice(tmp_path), names, [])

    def expected(steps, chunk=0):
        for step in steps:
            if isinstance(step, ChunkLoop):
                for c in range(step.count):
                    yield from expected(step.steps, c)
            elif isinstance(step, GemmCall):
                yield ("gemm", step, chunk)
            else:
                threads = math.prod(step.dims) * (256 if block_per_element(step) else 1)
                yield ("kernel", names[id(step)], threads, chunk)
    assert executable._launches == list(expected(program.steps))
    assert any(isinstance(s, ChunkLoop) for s in program.steps)
    assert any(block_per_element(s) for s in leaf_steps(program.steps)     # batch norm
               if isinstance(s, LoopKernel))


# ------------------------------------------------------------------ numerics
def edges(dtype):
    """The values where XLA and C disagree: NaN, infinities, INT_MIN, -1, shift widths."""
    np_type = DTYPES[dtype]
    if np_type.kind == "f":
        return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -2.5], np_type)
    info = np.iinfo(np_type)
    return np.array([0, 1, info.max, info.min, 31, 32, 33, 64, 7, 8, 16,
                     -1 if info.min < 0 else 63], np_type)


def values(dtype, dims, rng, positive=False, special=True):
    """Random values, the edge cases first."""
    np_type = DTYPES[dtype]
    if dtype == "pred":
        return rng.random(dims) < 0.5
    if np_type.kind == "f":
        x = rng.standard_normal(dims) * 3
        x = (np.abs(x) + 0.1 if positive else x).astype(np_type)
    else:
        info = np.iinfo(np_type)
        x = rng.integers(max(info.min, -100), min(info.max, 100), size=dims, endpoint=True)
        x = x.astype(np_type)
    if special:
        e = edges(dtype)
        x.reshape(-1)[:e.size] = e
    return x


def edge_pairs(dtype, rng, positive):
    """Two operands whose first elements pair every edge case with every other."""
    a, b = (values(dtype, DIMS, rng, positive) for _ in range(2))
    e = edges(dtype)
    a.reshape(-1)[:e.size ** 2] = np.repeat(e, e.size)
    b.reshape(-1)[:e.size ** 2] = np.tile(e, e.size)
    return [a, b]


DIMS = (3, 5, 17)


def elementwise_cases():
    """name -> (HLO module builder, rng -> arguments)."""
    cases = {}

    def add(name, build, dtypes, positive=False):
        cases[name] = (build, lambda rng: edge_pairs(dtypes[0], rng, positive)
                       if len(dtypes) == 2 and dtypes[0] != "pred"
                       else [values(d, DIMS, rng, positive) for d in dtypes])
    for dtype in ("f32", "f64"):
        for opcode in FLOAT_UNARY + FLOAT_BINARY:
            arity = 2 if opcode in FLOAT_BINARY else 1
            add(f"{opcode}-{dtype}",
                lambda o=opcode, d=dtype, a=arity: elementwise_module(o, d, DIMS, a,
                                                                      result_type(o)),
                [dtype] * arity, positive(opcode))
    for dtype in INTS:
        for opcode in INT_UNARY + INT_BINARY:
            arity = 2 if opcode in INT_BINARY else 1
            add(f"{opcode}-{dtype}",
                lambda o=opcode, d=dtype, a=arity: elementwise_module(o, d, DIMS, a),
                [dtype] * arity)
    for dtype in ("f32", "f64", "s8", "s32", "u32", "u64", "pred"):
        for direction in ("EQ", "NE", "LT", "LE", "GT", "GE"):
            add(f"compare-{direction}-{dtype}",
                lambda d=dtype, dr=direction: elementwise_module(
                    "compare", d, DIMS, 2, "pred", f", direction={dr}"), [dtype] * 2)
    types = ("f32", "f64", "s8", "u8", "s32", "s64", "u32", "u64", "pred")
    for src in types:
        for dst in types:
            add(f"convert-{src}-{dst}",
                lambda s=src, d=dst: elementwise_module("convert", s, DIMS, 1, d), [src])
    for src, dst in (("f32", "s32"), ("u32", "f32"), ("f64", "u64"), ("s64", "f64")):
        add(f"bitcast-{src}-{dst}",
            lambda s=src, d=dst: elementwise_module("bitcast-convert", s, DIMS, 1, d), [src])
    for dtype in ("f32", "s32", "u8"):
        # No NaN bounds: clamp compares like the CPU backend, not like np.maximum.
        cases[f"select-clamp-{dtype}"] = (lambda d=dtype: parse_module(f"""HloModule sel
ENTRY %e (p: pred[4,5], a: {d}[4,5], b: {d}[4,5]) -> ({d}[4,5], {d}[4,5]) {{
  %p = pred[4,5] parameter(0)
  %a = {d}[4,5] parameter(1)
  %b = {d}[4,5] parameter(2)
  %s = {d}[4,5] select(pred[4,5] %p, {d}[4,5] %a, {d}[4,5] %b)
  %c = {d}[4,5] clamp({d}[4,5] %b, {d}[4,5] %a, {d}[4,5] %s)
  ROOT %t = ({d}[4,5], {d}[4,5]) tuple({d}[4,5] %s, {d}[4,5] %c)
}}
"""), lambda rng, d=dtype: [values("pred", (4, 5), rng),
                             *(values(d, (4, 5), rng, special=False) for _ in range(2))])
    return cases


# Convolutions (implicit GEMMs), with epilogues: bias and relu; Conv1D's reshape on the way.
CONVOLUTIONS = {
    **{name: DOT_CONV_POOL[name] for name in
       ("conv_same_stride1", "conv_valid_stride2", "conv_dilated")},
    "conv_bias_relu": (lambda x, w, b: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + b),
                       (rand(2, 6, 5, 3), rand(3, 3, 3, 6, seed=1), rand(6, seed=2))),
    "conv1d_bias_relu": (lambda x, w, b: tf.nn.relu(tf.nn.conv1d(x, w, 1, "VALID") + b),
                         (rand(3, 9, 5), rand(3, 5, 7, seed=1), rand(7, seed=2))),
}

# Dots that become batched and strided GEMMs (cuBLAS's part: numpy's on the host).
GEMMS = {name: DOT_CONV_POOL[name] for name in ("dense_on_sequence", "attention_einsums",
                                                "batch_matmul_transposed")}
# Structured ops run by the executable on the host: its kernels compiled as C++.
STRUCTURED = {
    **GEMMS,
    "batch_matmul": (lambda a, b: tf.matmul(a, b), (rand(2, 5, 7), rand(2, 7, 3, seed=1))),
    **LOOP_ONLY,
    **CONVOLUTIONS,
    "int_matmul": (lambda a, b: tf.matmul(a, b),
                   (np.arange(12, dtype=np.int32).reshape(3, 4) - 5,
                    np.arange(8, dtype=np.int32).reshape(4, 2))),
    "depthwise_and_grads": (depthwise_and_grads(1), (rand(2, 5, 6, 3), rand(3, 3, 3, 2, seed=1))),
    "depthwise": (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 2, 2, 1], "SAME"),
                  (rand(2, 7, 6, 3), rand(3, 3, 3, 2, seed=1))),
    "maxpool_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.max_pool2d(x, 3, 2, "SAME") ** 2), x)[0], (rand(2, 7, 8, 2),)),
    # Disjoint windows: the pooling gradient is computed inside the relu
    # gradient's loop (ties: the first maximum takes it).
    "relu_maxpool_grad": (lambda x: tf.gradients(tf.reduce_sum(tf.nn.max_pool2d(
        tf.nn.relu(x), 2, 2, "SAME") ** 2), x)[0], (np.round(rand(2, 7, 8, 3) * 2),)),
}


class Harness:
    """Every numerics case's kernels in one g++-built library (one compiler run)."""

    def __init__(self, tmp):
        rng = np.random.default_rng(0)
        self.cases = {}
        for name, (build, make_args) in elementwise_cases().items():
            self.cases[name] = (build(), make_args(rng))
        for name, (fn, args) in STRUCTURED.items():
            self.cases[name] = (hlo_module(fn, *[tf.constant(a) for a in args]), list(args))
        self.cases["reversed_window"] = (parse_module(REVERSED_WINDOW[0]),
                                         list(REVERSED_WINDOW[1]))
        sources, self.programs = [PRELUDE], {}
        for i, (name, (module, _)) in enumerate(self.cases.items()):
            want = evaluate(module, self.cases[name][1])     # before the passes change it
            program = program_of(module)
            self.programs[name] = (program, f"case{i}", want)
            sources += [src for _, src in render_program(program, f"case{i}")[1]]
        self.library = Library("\n".join(sources), tmp)
        self.device = HostDevice(tmp)

    def run(self, name):
        """(outputs from the compiled kernels, outputs from the evaluator)."""
        program, prefix, want = self.programs[name]
        kernels = {id(step): (self.library, n) for n, step in kernel_names(program, prefix)}
        got = GpuExecutable(program, self.device, kernels, [])(self.cases[name][1])
        return got, list(want) if isinstance(want, tuple) else [want]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return Harness(tmp_path_factory.mktemp("harness"))


def test_numerics_cases_are_kernels_only(harness):
    """(No GEMM, which the host device would compute with numpy, but in GEMMS.)"""
    for name, (program, _, _) in harness.programs.items():
        steps = leaf_steps(program.steps)
        if name in GEMMS:
            assert any(isinstance(s, GemmCall) for s in steps), name
        else:
            assert all(isinstance(s, (LoopKernel, ImplicitGemm)) for s in steps), name


@pytest.mark.parametrize("name", [*elementwise_cases(), *STRUCTURED, "reversed_window"])
def test_kernels_match_evaluator(harness, name):
    got, want = harness.run(name)
    # (A convolution's gradients and the GEMMs sum float terms in another order
    # than the evaluator: the CPU backend's tolerance for them.)
    rtol, atol = (1e-4, 1e-4) if name in CONVOLUTIONS or name in GEMMS else (1e-5, 1e-6)
    assert_outputs_match(got, want, rtol, atol)


@pytest.mark.parametrize("name", ["philox_u32", "philox_u64", "philox_u32_carry",
                                  "philox_u64_carry"])
def test_philox_bits_match_tensorflow_exactly(harness, name):
    fn, args = STRUCTURED[name]
    got, _ = harness.run(name)
    np.testing.assert_array_equal(got[0], fn(*[tf.constant(a) for a in args]).numpy())


def test_adding_scatters_are_atomic_and_others_run_in_order(harness):
    program, prefix, _ = harness.programs["scatter"]
    kernels = dict(render_program(program, prefix)[1])
    scatters = [n for n, s in kernel_names(program, prefix) if isinstance(s, ScatterKernel)]
    atomic = [n for n in scatters if "atomicAdd(" in kernels[n]]
    in_order = [n for n in scatters if "if (blockIdx.x == 0 && threadIdx.x == 0)" in kernels[n]]
    assert len(atomic) == 2 and len(in_order) == 1    # the two adds; tensor_scatter_nd_max


def test_the_emulation_fails_a_barrier_that_some_threads_skip(tmp_path):
    body = "{ %s __syncthreads(); }"
    source = PRELUDE + "".join(
        f'extern "C" __global__ void {name}(void** buffers, long long chunk) {body % cond}\n'
        for name, cond in (("uniform", ""), ("divergent", "if (threadIdx.x < 5)")))
    library = Library(source, tmp_path)
    library.launch("uniform", 0, 0)
    with pytest.raises(AssertionError, match="not every thread reaches"):
        library.launch("divergent", 0, 0)
