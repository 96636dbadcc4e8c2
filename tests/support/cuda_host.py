"""CUDA kernels on the CPU: the GPU backend's code paths without a GPU.

`build` compiles kerasjit's CUDA C with g++ as C++, the CUDA names defined by
a small harness (a launch runs the blocks one after another, each block's
threads as coroutines that take turns at every __syncthreads(), so block
reductions in shared memory run as on a device, and a barrier that not
every thread reaches fails the launch). `HostDevice` is the device interface of
kerasjit/backends/gpu/device.py on top of it: numpy memory, these kernels,
GEMMs by numpy, and "graphs" that replay the recorded launches.
"""
import contextlib
import ctypes
import itertools
import shutil
import subprocess

import numpy as np
import pytest

HARNESS = r"""
#include <cmath>
#include <cstring>
#include <ucontext.h>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct kj_uint3 { unsigned x, y, z; };
static kj_uint3 blockIdx, threadIdx, blockDim, gridDim;
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
template <typename T> static inline T atomicAdd(T* at, T value) {   // one OS thread: plain
    T old = *at;
    *at = old + value;
    return old;
}

// A block's threads are coroutines on this one OS thread: each runs until it
// reaches __syncthreads() or returns, then the next one runs; a round over all
// of them takes every thread through the same barrier. A round in which some
// threads wait at a barrier while others returned is a barrier not every
// thread reaches (on a GPU, a hang or worse): kj_launch then returns 1.
static ucontext_t kj_scheduler;
static std::vector<ucontext_t> kj_contexts;
static void (*kj_kernel)(void**, long long);
static void** kj_buffers;
static long long kj_chunk;
static bool kj_returned;
static inline void __syncthreads() {
    swapcontext(&kj_contexts[threadIdx.x], &kj_scheduler);
}
static void kj_thread() {
    kj_kernel(kj_buffers, kj_chunk);
    kj_returned = true;     // then back to the scheduler (uc_link)
}
extern "C" int kj_launch(void (*kernel)(void**, long long), void** buffers, long long chunk,
                         unsigned blocks, unsigned threads) {
    kj_kernel = kernel, kj_buffers = buffers, kj_chunk = chunk;
    gridDim.x = blocks;
    blockDim.x = threads;
    kj_contexts.assign(threads, ucontext_t());
    std::vector<std::vector<char>> stacks(threads, std::vector<char>(1 << 16));
    std::vector<char> running(threads);
    for (blockIdx.x = 0; blockIdx.x < blocks; ++blockIdx.x) {
        for (unsigned t = 0; t < threads; ++t) {
            getcontext(&kj_contexts[t]);
            kj_contexts[t].uc_stack.ss_sp = stacks[t].data();
            kj_contexts[t].uc_stack.ss_size = stacks[t].size();
            kj_contexts[t].uc_link = &kj_scheduler;
            makecontext(&kj_contexts[t], kj_thread, 0);
            running[t] = 1;
        }
        for (unsigned left = threads; left;) {
            unsigned returned = 0;
            for (unsigned t = 0; t < threads; ++t) {
                if (!running[t]) continue;
                threadIdx.x = t;
                kj_returned = false;
                swapcontext(&kj_scheduler, &kj_contexts[t]);
                if (kj_returned) running[t] = 0, --left, ++returned;
            }
            if (returned && left) return 1;
        }
    }
    return 0;
}
"""
# Fewer threads than most iteration spaces: the grid-stride loop goes round.
GRID = (3, 32)
_builds = itertools.count()


def tool(name):
    path = shutil.which(name) or shutil.which(f"/usr/local/bin/{name}")
    if path is None:
        pytest.fail(f"{name} not found on PATH: the CUDA renderer's tests need it")
    return path


class Library:
    """Kernels of one CUDA C source, built for the host."""

    def __init__(self, source, tmp):
        n = next(_builds)
        (tmp / "harness.h").write_text(HARNESS)
        (tmp / f"k{n}.cpp").write_text(source)
        done = subprocess.run([tool("g++"), "-std=c++17", "-O1", "-shared", "-fPIC", "-include",
                               str(tmp / "harness.h"), "-o", str(tmp / f"k{n}.so"),
                               str(tmp / f"k{n}.cpp")], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-4000:])
        self.lib = ctypes.CDLL(str(tmp / f"k{n}.so"))
        self.lib.kj_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong,
                                       ctypes.c_uint, ctypes.c_uint]
        self.lib.kj_launch.restype = ctypes.c_int

    def launch(self, name, table_address, chunk):
        if self.lib.kj_launch(ctypes.cast(self.lib[name], ctypes.c_void_p), table_address,
                              chunk, *GRID):
            raise AssertionError(f"{name}: a __syncthreads() that not every thread reaches")


class HostDevice:
    xp = np

    def __init__(self, tmp):
        self.tmp = tmp
        self.launches = 0           # kernel launches and GEMMs run, replays included

    def synchronize(self):
        pass            # (every launch ran when it was made)

    def upload(self, data, dtype):
        return np.array(data, dtype)

    @staticmethod
    def pointer(array):
        return array.ctypes.data

    def copy_into(self, target, value, staging):
        np.copyto(target, np.asarray(value), casting="same_kind")

    def ordered(self):
        return contextlib.nullcontext()

    def build(self, source, names):
        library = Library(source, self.tmp)
        return {n: (library, n) for n in names}

    def launch(self, kernel, threads, table, chunk):
        library, name = kernel
        library.launch(name, table.ctypes.data, chunk)
        self.launches += 1

    def gemm(self, call, out, lhs, rhs, chunk):
        m, n, k = call.m, call.n, call.k
        ld_b, ld_a = call.column_major()[5:7]
        out_start, rhs_start = (chunk * s for s in call.chunk_strides())
        for a_at, b_at, c_at in call.batch_offsets():
            a = _matrix(lhs, a_at, m, k, ld_a, call.lhs_transposed)
            b = _matrix(rhs, rhs_start + b_at, k, n, ld_b, call.rhs_transposed)
            c = out[out_start + c_at:out_start + c_at + m * n].reshape((m, n))
            if call.beta(chunk):
                c += a @ b
            else:
                c[...] = a @ b
        self.launches += 1

    def capture(self, launches):
        return launches

    def replay(self, graph):
        graph()


def _matrix(flat, start, rows, columns, lead, transposed):
    """The rows x columns matrix at flat[start]: rows `lead` elements apart, or
    (transposed) stored as columns x rows with its columns `lead` apart."""
    item = flat.itemsize
    strides = (item, lead * item) if transposed else (lead * item, item)
    return np.lib.stride_tricks.as_strided(flat[start:], (rows, columns), strides)
