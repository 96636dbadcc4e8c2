"""Hand-blocked vector code: what the generated GEMM kernels (narrow_gemm.py,
implicit_gemm.py) are built from.

Those kernels keep a block of their output in vector registers while a loop
streams the operands, which LLVM's loop vectoriser does not arrive at by
itself: accumulators are allocas (LLVM promotes them to registers), loads
and stores past a row's end are masked, and scalars reach every lane by a
broadcast.
"""
from llvmlite import ir

from .llvm_types import I1, I32, I64, PTR, linear

F32 = ir.FloatType()


def declare(module, name, result, args):
    """An intrinsic's declaration, once per module."""
    if name in module.globals:
        return module.globals[name]
    return ir.Function(module, ir.FunctionType(result, args), name)


def blocks(total, size):
    """(start, count) of consecutive blocks of `size` covering `total`; the last may be short."""
    return [(s, min(size, total - s)) for s in range(0, total, size)]


class VectorCode:
    """An internal function `void name(args...)` under construction, with
    vectors of `lanes` f32 and helpers for blocked vector code."""

    def __init__(self, module, name, args, lanes):
        self.lanes = lanes
        self.vec = ir.VectorType(F32, lanes)
        self.registers = 32 if lanes >= 16 else 16     # AVX-512's vector registers, AVX's
        self.acc_budget = 3 * self.registers // 4       # for accumulators; the rest for operands
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name)
        self.fn.linkage = "internal"
        self.fn.attributes.add("noinline")      # (as loop kernels: codegen.py)
        for arg in self.fn.args:
            if isinstance(arg.type, ir.PointerType):
                arg.add_attribute("noalias")
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.alloca_block = entry
        self.mask_type = ir.VectorType(I1, lanes)
        suffix = f"v{lanes}f32"
        self.fma = declare(module, f"llvm.fma.{suffix}", self.vec, [self.vec] * 3)
        self.masked_load = declare(module, f"llvm.masked.load.{suffix}.p0", self.vec,
                                   [PTR, I32, self.mask_type, self.vec])
        self.masked_store = declare(module, f"llvm.masked.store.{suffix}.p0", ir.VoidType(),
                                    [self.vec, PTR, I32, self.mask_type])
        self.scatter = declare(module, f"llvm.masked.scatter.{suffix}.v{lanes}p0", ir.VoidType(),
                               [self.vec, ir.VectorType(PTR, lanes), I32, self.mask_type])

    def _offset(self, *terms):
        """The sum, as an i64, of terms: (i64 value, python int) products, i64
        values and python ints."""
        return linear(self.b, *terms)

    def _at(self, pointer, offset):
        return self.b.gep(pointer, [offset], inbounds=True, source_etype=F32)

    def _mask(self, count):
        return ir.Constant(self.mask_type, [ir.Constant(I1, int(i < count))
                                            for i in range(self.lanes)])

    def load_vector(self, pointer, offset, count):
        """`count` floats from pointer[offset], zeros in the lanes past them."""
        where = self._at(pointer, offset)
        if count == self.lanes:
            return self.b.load(where, typ=self.vec, align=4)
        return self.b.call(self.masked_load, [where, ir.Constant(I32, 4), self._mask(count),
                                              ir.Constant(self.vec, None)])

    def store_vector(self, pointer, offset, stride, vector, count):
        """The first `count` lanes to pointer[offset + lane * stride]."""
        b = self.b
        if stride == 1 and count == self.lanes:
            b.store(vector, self._at(pointer, offset), align=4)
        elif stride == 1:
            b.call(self.masked_store, [vector, self._at(pointer, offset), ir.Constant(I32, 4),
                                       self._mask(count)])
        else:       # one scatter (a lane per store would be code LLVM spends long on)
            base = b.ptrtoint(self._at(pointer, offset), I64)
            byte_offsets = ir.Constant(ir.VectorType(I64, self.lanes),
                                       [4 * stride * lane for lane in range(self.lanes)])
            where = b.inttoptr(b.add(self.broadcast(base, I64), byte_offsets),
                               ir.VectorType(PTR, self.lanes))
            b.call(self.scatter, [vector, where, ir.Constant(I32, 4), self._mask(count)])

    def load_scalar(self, pointer, offset):
        return self.b.load(self._at(pointer, offset), typ=F32)

    def broadcast(self, scalar, element=F32):
        b, vec = self.b, ir.VectorType(element, self.lanes)
        one = b.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes))

    def lane_sum(self, vector):
        """The sum of a vector's lanes: halves added until one lane is left."""
        b, lanes = self.b, self.lanes
        while lanes > 1:
            lanes //= 2
            halves = [b.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined), ir.Constant(
                ir.VectorType(I32, lanes), list(range(start, start + lanes))))
                for start in (0, lanes)]
            vector = b.fadd(*halves)
        return b.extract_element(vector, ir.Constant(I32, 0))

    def vector_of(self, scalars):
        """A vector holding `scalars` in its first lanes (the rest undefined)."""
        vector = ir.Constant(self.vec, ir.Undefined)
        for lane, scalar in enumerate(scalars):
            vector = self.b.insert_element(vector, scalar, ir.Constant(I32, lane))
        return vector

    def accumulators(self, count):
        """Zeroed vector accumulators (allocas LLVM keeps in registers)."""
        b = self.b
        with b.goto_block(self.alloca_block):
            b.position_at_start(self.alloca_block)
            slots = [b.alloca(self.vec) for _ in range(count)]
        for slot in slots:
            b.store(ir.Constant(self.vec, None), slot)
        return slots

    def fma_into(self, slot, x, y):
        b = self.b
        b.store(b.call(self.fma, [x, y, b.load(slot, typ=self.vec)]), slot)
