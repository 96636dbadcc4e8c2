"""Narrow GEMMs as generated vector code instead of sgemm.

When one side of a product is narrow (a classifier's 10 outputs, or its
weight gradient), OpenBLAS's small-matrix kernels leave much of the vector
unit idle. These kernels keep a block of C in vector registers while one
loop over K streams the operands, in one of two forms:

- "rows": A's rows along K, B's rows along N. Vectors run along a row of C;
  each A element is broadcast to it.
- "columns": A stored transposed (contiguous along M). Vectors run along a
  column of C; each B element is broadcast to it.

- "packed": A @ B^T with B's rows along K (attention's queries times keys):
  B^T copied to the stack as [K, N] first, then the "rows" form on it, for
  an N of PACKED_N or less (a few vectors) and a copy of PACKED_BYTES or
  less. sgemm spent ~4x as long on each of attention's 40x40x16 products.

A product narrow in M is computed as C^T = B^T A^T; a strided column of C is
stored with one masked scatter. Other A @ B^T, products from
blas.SINGLE_THREAD_MNK up and chunked GEMMs (convolutions) stay with sgemm
(reports/tuning-measurements.md).
"""
import dataclasses
from dataclasses import dataclass

from llvmlite import ir

from .blas import SINGLE_THREAD_MNK
from .llvm_types import I64, PTR, counted_loop
from .vector_code import VectorCode, blocks

NARROW = 16         # the widest N (or M) these kernels take
PACKED_N = 64       # the widest N of the "packed" form
PACKED_BYTES = 16 << 10     # its copy of B^T on the stack
_FORM_ORDER = ("columns", "rows", "packed")   # "rows" idles the lanes past N


@dataclass(frozen=True)
class NarrowGemm:
    """C[i, j] = sum_k A(i, k) B(k, j) for i < m, j < n (n is the narrow side).

    A is [m, k] row-major, or [k, m] with a_transposed, its rows `a_ld`
    elements apart; B is [k, n], or [n, k] with b_transposed, its rows `b_ld`
    apart; C's element (i, j) lies at i * c_strides[0] + j * c_strides[1].
    `swapped`: A is the GemmCall's rhs and B its lhs. A batched GemmCall runs
    the function once per batch index (codegen.py)."""
    form: str
    m: int
    n: int
    k: int
    a_transposed: bool
    b_transposed: bool
    c_strides: tuple
    swapped: bool
    a_ld: int
    b_ld: int


def _form(a_transposed, b_transposed):
    """The form for these layouts, or None where sgemm does better."""
    if a_transposed:
        return "columns"
    return None if b_transposed else "rows"


def plan(call):
    """How to run GemmCall `call` (each product of a batched one) as a narrow
    GEMM, or None to use sgemm."""
    if call.accumulate or call.out_rows_per_chunk or call.rhs_rows_per_chunk:
        return None
    if not 0 < call.m * call.n * call.k < SINGLE_THREAD_MNK:
        return None
    # Rows of each operand as stored: A [M, K] (or [K, M]), B [K, N] (or [N, K]).
    lda = call.lda or (call.m if call.lhs_transposed else call.k)
    ldb = call.ldb or (call.k if call.rhs_transposed else call.n)
    options = []
    if call.n <= NARROW:
        options.append(NarrowGemm(_form(call.lhs_transposed, call.rhs_transposed),
                                  call.m, call.n, call.k, call.lhs_transposed,
                                  call.rhs_transposed, (call.n, 1), False, lda, ldb))
    if call.m <= NARROW:      # C^T = B^T A^T: B^T is stored transposed iff B is not
        options.append(NarrowGemm(_form(not call.rhs_transposed, not call.lhs_transposed),
                                  call.n, call.m, call.k, not call.rhs_transposed,
                                  not call.lhs_transposed, (1, call.n), True, ldb, lda))
    options = [g for g in options if g.form]
    if not options and not call.lhs_transposed and call.rhs_transposed \
            and call.n <= PACKED_N and 4 * call.k * call.n <= PACKED_BYTES:
        options.append(NarrowGemm("packed", call.m, call.n, call.k, False, True,
                                  (call.n, 1), False, lda, ldb))
    return min(options, key=lambda g: _FORM_ORDER.index(g.form)) if options else None


class _Emitter(VectorCode):
    """Builds `void name(ptr c, ptr a, ptr b)` for one NarrowGemm."""

    def __init__(self, module, gemm, name, lanes):
        super().__init__(module, name, [PTR] * 3, lanes)
        self.g = gemm
        self.c_ptr, self.a_ptr, self.b_ptr = self.fn.args

    def row_loop(self, total, size, body):
        """body(first row: i64, rows) over blocks of `size` rows: a loop over
        the full blocks, then the short one."""
        full, rest = divmod(total, size)
        if full:
            counted_loop(self.b, self.fn, full,
                         lambda block: body(self.b.mul(block, ir.Constant(I64, size)), size))
        if rest:
            body(ir.Constant(I64, full * size), rest)

    # ------------------------------------------------------------- the forms
    def emit(self):
        getattr(self, f"_{self.g.form}")()
        self.b.ret_void()
        return self.fn

    def _rows(self):
        g, lanes = self.g, self.lanes
        pieces = blocks(g.n, lanes)
        rows = max(1, self.acc_budget // len(pieces))

        def block(i0, count):
            accs = self.accumulators(count * len(pieces))

            def step(k):
                bv = [self.load_vector(self.b_ptr, self._offset((k, g.b_ld), j0), width)
                      for j0, width in pieces]
                for r in range(count):
                    a = self.broadcast(self.load_scalar(self.a_ptr, self._offset(
                        (i0, g.a_ld), (k, 1), r * g.a_ld)))
                    for p, v in enumerate(bv):
                        self.fma_into(accs[r * len(pieces) + p], a, v)
            counted_loop(self.b, self.fn, g.k, step)
            for r in range(count):
                for p, (j0, width) in enumerate(pieces):
                    vector = self.b.load(accs[r * len(pieces) + p], typ=self.vec)
                    self.store_vector(self.c_ptr, self._offset(
                        (i0, g.c_strides[0]), r * g.c_strides[0] + j0 * g.c_strides[1]),
                        g.c_strides[1], vector, width)
        self.row_loop(g.m, rows, block)

    def _packed(self):
        g, b = self.g, self.b
        with b.goto_block(self.alloca_block):
            b.position_at_start(self.alloca_block)
            packed = b.alloca(ir.FloatType(), size=ir.Constant(I64, g.k * g.n))

        def copy_row(j):         # B's row j (along K) to column j of the copy
            counted_loop(b, self.fn, g.k, lambda k: b.store(
                self.load_scalar(self.b_ptr, self._offset((j, g.b_ld), k)),
                self._at(packed, self._offset((k, g.n), j))))
        counted_loop(b, self.fn, g.n, copy_row)
        self.b_ptr = packed
        self.g = dataclasses.replace(g, b_transposed=False, b_ld=g.n)
        self._rows()

    def _columns(self):
        g, lanes = self.g, self.lanes
        for j0, width in blocks(g.n, min(g.n, self.acc_budget)):
            vectors = max(1, self.acc_budget // width)

            def block(i0, count, j0=j0, width=width):
                pieces = blocks(count, lanes)           # (first row, rows) per vector
                accs = self.accumulators(len(pieces) * width)

                def step(k):
                    a = [self.load_vector(self.a_ptr, self._offset((i0, 1), (k, g.a_ld), start),
                                          rows) for start, rows in pieces]
                    for j in range(width):
                        terms = ((k, 1), (j0 + j) * g.b_ld) if g.b_transposed \
                            else ((k, g.b_ld), j0 + j)
                        bj = self.broadcast(self.load_scalar(self.b_ptr, self._offset(*terms)))
                        for p, v in enumerate(a):
                            self.fma_into(accs[p * width + j], v, bj)
                counted_loop(self.b, self.fn, g.k, step)
                for p, (start, rows) in enumerate(pieces):
                    for j in range(width):
                        vector = self.b.load(accs[p * width + j], typ=self.vec)
                        self.store_vector(self.c_ptr, self._offset(
                            (i0, g.c_strides[0]),
                            start * g.c_strides[0] + (j0 + j) * g.c_strides[1]),
                            g.c_strides[0], vector, rows)
            self.row_loop(g.m, vectors * lanes, block)


def emit(module, gemm, name, lanes):
    """The LLVM function `void name(ptr c, ptr a, ptr b)` computing `gemm`
    with vectors of `lanes` floats."""
    return _Emitter(module, gemm, name, lanes).emit()
