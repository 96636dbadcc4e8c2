"""ImplicitGemm steps (convolutions without a patch matrix) as generated vector code.

A block of output rows by up to four vectors of features (two on AVX2) stays
in vector registers while the contraction streams through the operands, read
where they lie (ImplicitGemm's strides): nothing is written but the output.

`void name(ptr c, ptr a, ptr b, ptr extra..., i64 chunk, i64 lo, i64 hi)`
runs row blocks [lo, hi) of the flattened (outer rows, row block) x feature
block space, so parallel.call_split can share them out. A long contraction is
cut into slices whose part of B fits in L2 (in L1 where C is small or the
blocks read B fast), and a thread's blocks run in groups whose part of C
fits in L2: all of a group's blocks take one slice before the next (partial
sums kept in C), so B streams from memory once per group, not once per
block, and the partial sums wait in L2. An epilogue (epilogues.py) runs over
each block's rows after their last slice, in place.

A contraction cut into runs (ImplicitGemm.parts: a filter gradient, few sums
over a long contraction) adds the run to the outermost index of the block
space, so that each thread takes whole runs, and runs them one after
another: each streams its runs of A and B, not all of them.

Where B holds its features at a stride (ImplicitGemm.b_feature_stride: an
input gradient's weights as they lie, the contraction contiguous in A and B),
a block is a few rows by a few features of dot products instead: an
accumulator each, a vector of the contraction at a time from both operands,
its lanes summed at the end. Copying such weights features-innermost first
read and wrote each of them once more, twice the product's own time where the
rows are few (ResNet50's late stages at batch 8).
"""
import math

from llvmlite import ir

from . import engine
from .llvm_types import I64, PTR, counted_loop, run_time_loop, unflatten
from .vector_code import VectorCode, blocks

# B's part per contraction slice: a quarter of L2 and at most 256 KB
# (reports/tuning-measurements.md), where B is read from L2 well enough ...
SLICE_BYTES = min(256 << 10, engine.l2_cache_bytes() // 4)
# ... and within L1 where C fits in half of L2 (a filter gradient: a long
# contraction into few sums: each slice of A and B serves every block from
# L1, the partial sums revisited from L2 cost little), or where the blocks
# have few rows for their vectors of features (a vector of B per few FMAs)
# and B does not fit in half of L1 whole: there the blocks run in groups
# whose part of C is a quarter of L2.
L1_SLICE_BYTES = 16 << 10
B_IN_L1_BYTES = engine.l1_cache_bytes() // 2
SMALL_C_BYTES = engine.l2_cache_bytes() // 2
GROUP_C_BYTES = engine.l2_cache_bytes() // 4
# Multiply-adds from which a second thread pays (reports/tuning-measurements.md).
SPLIT_WORK = 1 << 22


class Blocking:
    """How an ImplicitGemm is cut: feature blocks, rows per block, slices."""

    def __init__(self, step, code):
        lanes, acc_budget = code.lanes, code.acc_budget
        # The contraction one run covers (all of it where there is one run): the
        # emitter's loops run over these extents, never over step.depth's.
        self.parts = step.parts
        (outermost, a, b), *inner = step.depth
        self.depth = [(outermost // step.parts, a, b), *inner]
        self.dots = step.b_feature_stride != 1
        if self.dots:
            # Rows x features accumulators, a vector of each row of A and one of B
            # in registers: 4x6 + 4 + 1 of AVX-512's 32, 2x6 + 2 + 1 of AVX2's 16.
            most = 4 if code.registers == 32 else 2
            self.width = width = min(step.n, acc_budget // most)
        else:
            # Feature vectors per block: B's vectors, the accumulators and a
            # broadcast all live in registers: 4 + 6x4 + 1 of AVX-512's 32, 2 + 6x2
            # + 1 of AVX2's 16 (4 + 3x4 + 1 there spill, at half the speed).
            self.width = width = min(step.n, code.registers // 8 * lanes)
            most = max(1, acc_budget // math.ceil(width / lanes))    # rows a block can hold
        self.feature_blocks = blocks(step.n, width)
        # Rows cut evenly: `wide` blocks of `rows` + 1 rows, then blocks of `rows`
        # (13 rows in blocks of at most 12: 7 + 6, not 12 + 1, whose one row
        # would leave most of the vector unit idle).
        self.per_outer = math.ceil(step.rows[0] / most)
        self.rows, self.wide = divmod(step.rows[0], self.per_outer)
        self.outer_total = math.prod(e for e, _, _ in step.outer)
        self.per_part = len(self.feature_blocks) * self.outer_total * self.per_outer
        self.total = self.per_part * self.parts
        if self.dots:
            # No slices (a block's rows of A and of B fit L1 whole); the smaller operand
            # is the one read again: A's rows stay in L1 while every feature block
            # passes them where B is the smaller, else B's rows while every row block does.
            self.slices, self.features_inner = 1, step.n <= step.m
            return
        # Slices: the outermost contraction level whose every iteration reads less
        # of B than the budget is cut into runs of `slice` iterations; each slice
        # is one such run at one index of the levels outside it.
        extents = [e for e, _, _ in self.depth]
        small_c = step.m * step.n * 4 <= SMALL_C_BYTES
        b_bytes = math.prod(extents) * width * 4        # B's part for one feature block
        hungry = lanes >= 2 * most and b_bytes > B_IN_L1_BYTES
        budget = L1_SLICE_BYTES if small_c or hungry else SLICE_BYTES
        self.level = next(lv for lv in range(len(extents))
                          if math.prod(extents[lv + 1:]) * width * 4 <= budget)
        panel = math.prod(extents[self.level + 1:]) * width * 4
        self.slice = min(extents[self.level], max(1, budget // panel))
        self.cuts = math.ceil(extents[self.level] / self.slice)
        self.slices = math.prod(extents[:self.level]) * self.cuts
        # Where all of B fits a slice, a row block's feature blocks run one after
        # another: its output rows are written whole, in order, and its part of A
        # is read once (the elephant CNN's first convolution, K = 75: 70 -> 90
        # GFLOP/s on Zen 3); else each feature block's part of B stays cached
        # while the rows stream past it.
        self.features_inner = math.prod(extents) * step.n * 4 <= SLICE_BYTES
        # Blocks per group: their sums within GROUP_C_BYTES (C whole where small).
        block_bytes = (self.rows + 1) * width * 4
        self.group = self.total if small_c else max(1, GROUP_C_BYTES // block_bytes)


class _Emitter(VectorCode):
    def __init__(self, module, step, name, lanes, extra=0, epilogue=None):
        super().__init__(module, name, [PTR] * (3 + extra) + [I64] * 3, lanes)
        self.s, self.epilogue = step, epilogue
        self.c_ptr, self.a_ptr, self.b_ptr = self.fn.args[:3]
        self.extra = self.fn.args[3:3 + extra]
        self.chunk, self.lo, self.hi = self.fn.args[3 + extra:]
        self.plan = Blocking(step, self)
        self.run = None     # the contraction run being emitted (an i64), if cut into runs

    def const(self, value):
        return ir.Constant(I64, value)

    def emit(self):
        plan, b = self.plan, self.b
        if plan.parts == 1:
            self._slices(self.lo, self.hi)
        else:         # blocks [lo, hi) run by run: each run's part of them, all its slices
            per = self.const(plan.per_part)
            first = b.udiv(self.lo, per)
            end = b.udiv(b.add(self.hi, self.const(plan.per_part - 1)), per)

            def run(r):
                self.run = r
                start = b.mul(r, per)
                lo, hi = b.sub(self.lo, start), b.sub(self.hi, start)
                self._slices(b.select(b.icmp_signed(">", lo, self.const(0)), lo, self.const(0)),
                             b.select(b.icmp_signed("<", hi, per), hi, per))
            run_time_loop(b, self.fn, first, end, run, unroll=False)
        b.ret_void()
        return self.fn

    def _slices(self, lo, hi):
        """Blocks [lo, hi) (of one run), group after group, each slice after slice."""
        plan, b = self.plan, self.b
        if plan.slices == 1:
            self._blocks(None, lo, hi)
            return
        group = self.const(plan.group)

        def slices(g):
            first = b.add(lo, b.mul(g, group))
            end = b.add(first, group)
            end = b.select(b.icmp_signed("<", end, hi), end, hi)
            counted_loop(b, self.fn, plan.slices, lambda part: self._blocks(part, first, end))
        groups = b.udiv(b.add(b.sub(hi, lo), self.const(plan.group - 1)), group)
        run_time_loop(b, self.fn, self.const(0), groups, slices, unroll=False)

    def _run_terms(self, operand):
        """The offset of the current run in A (0), B (1) or C (2): none for one run."""
        if self.run is None:
            return []
        run, *strides = self.plan.depth[0]
        stride = self.s.part_stride if operand == 2 else run * strides[operand]
        return [(self.run, stride)]

    def _blocks(self, part, lo, hi):
        """Blocks [lo, hi) for contraction slice `part` (None: the whole)."""
        plan, b = self.plan, self.b
        sliced = None
        if part is not None:    # the slice's indices outside its level, and its run
            *fixed, cut = unflatten(b, part, [e for e, _, _ in plan.depth[:plan.level]]
                                    + [plan.cuts])
            lo_k = b.mul(cut, self.const(plan.slice))
            hi_k = b.add(lo_k, self.const(plan.slice))
            end = self.const(plan.depth[plan.level][0])
            sliced = fixed, lo_k, b.select(b.icmp_signed("<", hi_k, end), hi_k, end)

        def block(index):
            # (the outer levels' indices, row block), feature block inside or outside
            rows = [e for e, _, _ in self.s.outer] + [plan.per_outer]
            features = [len(plan.feature_blocks)]
            if plan.features_inner:
                *at, rb, fb = unflatten(b, index, rows + features)
            else:
                fb, *at, rb = unflatten(b, index, features + rows)
            # Row block rb starts at row rb * (rows + 1) among the wide blocks, past
            # them at rb * rows + wide.
            wide = b.icmp_unsigned("<", rb, self.const(plan.wide))
            row0 = b.add(b.mul(rb, self.const(plan.rows)),
                         b.select(wide, rb, self.const(plan.wide)))

            def bodies(j0, width):
                if plan.wide and plan.rows:
                    with b.if_else(wide) as (more, fewer):
                        with more:
                            self._body(j0, width, plan.rows + 1, part, sliced, at, row0)
                        with fewer:
                            self._body(j0, width, plan.rows, part, sliced, at, row0)
                else:
                    self._body(j0, width, plan.rows + (plan.wide > 0), part, sliced, at, row0)
            # One body for all the full feature blocks, their first feature a run-time
            # value, and one for a short last block: code for each block apiece made
            # a 2048-feature convolution's function 32 times as long, and LLVM's time
            # with it (DenseNet121's module: 37 MB of IR, 90% of it these bodies).
            full, last = divmod(self.s.n, plan.width)
            if not last:
                bodies(0 if full == 1 else b.mul(fb, self.const(plan.width)), plan.width)
            elif not full:
                bodies(0, last)
            else:
                with b.if_else(b.icmp_unsigned("<", fb, self.const(full))) as (whole, short):
                    with whole:
                        bodies(b.mul(fb, self.const(plan.width)), plan.width)
                    with short:
                        bodies(full * plan.width, last)
        run_time_loop(b, self.fn, lo, hi, block)

    def _body(self, j0, width, count, part, sliced, at, row0):
        """One block: `count` rows from row `row0` by features [j0, j0 + width)
        (j0 an int or an i64 value), over contraction slice `part` (`sliced`:
        its fixed indices and its run)."""
        s, plan, b = self.s, self.plan, self.b
        if plan.dots:
            self._dots(j0, width, count, at, row0)
            return
        pieces = blocks(width, self.lanes)
        _, a_row, c_row = s.rows
        a_base = self._offset(*[(i, a) for i, (_, a, _) in zip(at, s.outer)], (row0, a_row),
                              *self._run_terms(0))
        c_base = self._offset(*[(i, c) for i, (_, _, c) in zip(at, s.outer)], (row0, c_row), j0,
                              *self._run_terms(2))
        accs = self.accumulators(count * len(pieces))
        if part is not None:      # later slices add to what the earlier ones left in C
            later = b.icmp_unsigned("!=", part, self.const(0))
            for r in range(count):
                for p, (p0, pw) in enumerate(pieces):
                    kept = self.load_vector(self.c_ptr, self._offset(c_base, r * c_row + p0), pw)
                    b.store(b.select(later, kept, ir.Constant(self.vec, None)),
                            accs[r * len(pieces) + p])

        def step(k):
            a_off = self._offset(a_base, *[(i, a) for i, (_, a, _) in zip(k, self.plan.depth)])
            b_off = self._offset(*[(i, bs) for i, (_, _, bs) in zip(k, self.plan.depth)],
                                 s.b_offset, j0, *self._run_terms(1))
            vectors = [self.load_vector(self.b_ptr, self._offset(b_off, p0), pw)
                       for p0, pw in pieces]
            for r in range(count):
                x = self.broadcast(self.load_scalar(self.a_ptr, self._offset(a_off, r * a_row)))
                for p, v in enumerate(vectors):
                    self.fma_into(accs[r * len(pieces) + p], x, v)
        self._depth(0, [], sliced, step)
        for r in range(count):
            for p, (p0, pw) in enumerate(pieces):
                vector = b.load(accs[r * len(pieces) + p], typ=self.vec)
                self.store_vector(self.c_ptr, self._offset(c_base, r * c_row + p0), 1, vector, pw)
        if self.epilogue is None:
            return
        starts = [self._offset(c_base, r * c_row) for r in range(count)]
        if part is None:
            self.epilogue(self, starts, j0, width)
        else:                     # the sums are whole only after the last slice
            with b.if_then(b.icmp_unsigned("==", part, self.const(plan.slices - 1))):
                self.epilogue(self, starts, j0, width)

    def _dots(self, j0, width, count, at, row0):
        """One block of dot products (B's features at a stride): `count` rows from
        row `row0` by features [j0, j0 + width)."""
        s, b = self.s, self.b
        stride = s.b_feature_stride
        _, a_row, c_row = s.rows
        a_base = self._offset(*[(i, a) for i, (_, a, _) in zip(at, s.outer)], (row0, a_row),
                              *self._run_terms(0))
        c_base = self._offset(*[(i, c) for i, (_, _, c) in zip(at, s.outer)], (row0, c_row), j0,
                              *self._run_terms(2))
        b_base = self._offset((j0, stride), s.b_offset, *self._run_terms(1))
        accs = self.accumulators(count * width)
        contiguous = self.plan.depth[-1][0]     # the innermost level: stride 1 in A and B

        def step(k):
            a_off = self._offset(a_base, *[(i, a) for i, (_, a, _) in zip(k, self.plan.depth)])
            b_off = self._offset(b_base, *[(i, bs) for i, (_, _, bs) in zip(k, self.plan.depth)])

            def vector(at_k, lanes):
                xs = [self.load_vector(self.a_ptr, self._offset(a_off, at_k, r * a_row), lanes)
                      for r in range(count)]
                for f in range(width):
                    w = self.load_vector(self.b_ptr, self._offset(b_off, at_k, f * stride), lanes)
                    for r, x in enumerate(xs):
                        self.fma_into(accs[r * width + f], x, w)
            whole, rest = divmod(contiguous, self.lanes)
            if whole:
                counted_loop(b, self.fn, whole, lambda t: vector((t, self.lanes), self.lanes),
                             unroll=False)
            if rest:
                vector(whole * self.lanes, rest)
        self._depth(0, [], None, step, len(self.plan.depth) - 1)
        for r in range(count):
            sums = [self.lane_sum(b.load(accs[r * width + f], typ=self.vec)) for f in range(width)]
            self.store_vector(self.c_ptr, self._offset(c_base, r * c_row), 1,
                              self.vector_of(sums), width)
        if self.epilogue is not None:
            self.epilogue(self, [self._offset(c_base, r * c_row) for r in range(count)],
                          j0, width)

    def _depth(self, level, prefix, sliced, step, levels=None):
        """The contraction's loops, outermost first (the first `levels` of them);
        with a slice, only its indices outside the sliced level and its run of
        that level."""
        if level == (len(self.plan.depth) if levels is None else levels):
            step(prefix)
            return

        def inner(i):
            self._depth(level + 1, prefix + [i], sliced, step, levels)
        if sliced is not None and level < self.plan.level:
            inner(sliced[0][level])
        elif sliced is not None and level == self.plan.level:
            run_time_loop(self.b, self.fn, *sliced[1:], inner, unroll=False)
        else:
            counted_loop(self.b, self.fn, self.plan.depth[level][0], inner, unroll=False)


def emit(module, step, name, lanes, extra=0, epilogue=None):
    """The function computing ImplicitGemm `step`, and its count of row blocks.
    It takes `extra` more buffers after C, A and B (what the epilogue reads);
    `epilogue(emitter, row starts, first feature, features)`, if given, emits
    the epilogue over a block's rows (their offsets in C) once they are final."""
    assert step.parts == 1 or epilogue is None, "a run's sums are partial: no epilogue"
    emitter = _Emitter(module, step, name, lanes, extra, epilogue)
    return emitter.emit(), emitter.plan.total


def worth_splitting(step, blocks_total):
    return blocks_total > 1 and step.m * step.n * step.k >= SPLIT_WORK
