"""HLO Module -> KernelProgram: decide fusion, then build each kernel's expressions.

Fusion is decided per (producer, consumer) edge and recorded with its reason
(fusion.py). The builders of each opcode's expression (expressions.py,
conv_implicit.py) read operands through this lowering's public context:
value_at, operand, in_kernel, key, combiner, materialized, temp; a materialised
value may join a recent loop of its shape as one more store (joins.py, through
steps, latest_stores, kernel_state, loop_index_of, expr_in and buffer_for).
"""
import dataclasses

from ..errors import Unsupported
from ..hlo.gemm import dot_layout
from ..hlo.opcodes import ELEMENTWISE
from .conv_gemm import conv_as_gemm
from .conv_implicit import conv_as_implicit_gemm
from .dot_implicit import dot_as_implicit_gemm
from .expressions import EXPRESSIONS, elementwise, op_of, scatter_update, update_window
from .fusion import fusion_decisions, materialize_reasons, roots_a_kernel
from .ir import (S64, Buffer, Const, GemmCall, Index, KernelProgram, Load, LoopKernel, Op,
                 ScatterKernel, Var)
from .joins import NotInKernel, join_recent_loop
from .loops import leaves, lower_while, parts


def lower_module(module, target):
    """The KernelProgram of `module` for a backend's `target` (target.py),
    before the kernel-IR passes (compiler.py runs them)."""
    return _Lowering(module.entry, target).run()


class _Lowering:
    def __init__(self, comp, target, parent=None):
        """A lowering of computation `comp`; one of a called computation (a loop's
        body) shares its `parent`'s buffers."""
        self.comp = comp
        self.target = target
        self.order = self.comp.post_order()
        self.users = {i: [] for i in self.order}
        for inst in self.order:
            for op in inst.operands:
                self.users[op].append(inst)
        self.buffers, self.buffer_of, self.steps, self.decisions = [], {}, [], []
        # The kernel an expression is being built in: its values (instruction ->
        # Expr, inlined at its loop index), that index, and the buffers not yet
        # written when it runs (None: every existing buffer is ready).
        self.kernel_values, self.loop_index, self.unready, self.horizon = {}, None, None, None
        self.kernel_state = {}    # id(LoopKernel) -> (loop index, its kernel_values)
        # Steps seen, and buffer -> position of the latest LoopKernel storing it (joins.py).
        self.latest_stores = (0, {})
        self.memo = {}            # (instruction, index ids, horizon) -> (index, Expr)
        self.keys = {}            # id(reduce instruction) -> small int key
        self.bound = {}           # tuple-shaped instruction -> its parts (loops.parts)
        self.own_kernels = {}     # (instruction, role) -> the buffer a kernel of its own fills
        if parent is not None:
            self.buffers, self.keys = parent.buffers, parent.keys

    def run(self):
        root = self.comp.root
        outputs = list(root.operands) if root.opcode == "tuple" else [root]
        if any(o.shape.is_tuple for o in outputs):
            raise Unsupported("nested tuple outputs")
        materialized = materialize_reasons(self.order, self.users)
        self.decisions = fusion_decisions(self.order, materialized)
        params = [self.buffer_for(p, "param") for p in self.comp.parameters]
        for inst in self.order:     # (an output that is a constant is copied from one)
            if inst.opcode == "constant" and (materialized[inst] or inst in outputs):
                self.buffer_for(inst, "constant", inst.literal)
        for inst in outputs:
            materialized[inst] = materialized[inst] or "output"
        for inst in self.order:
            if materialized[inst] and inst not in self.buffer_of:
                self._emit(inst, "output" if inst in outputs else "temp")
        out_ids = []
        for inst in outputs:         # parameters, constants and repeats need a copy
            bid = self.buffer_of[inst]
            if self.buffers[bid].role != "output" or bid in out_ids:
                bid = self._copy(inst)
            out_ids.append(bid)
        return KernelProgram(self.buffers, self.steps, params, out_ids, self.decisions)

    def run_called(self, bound):
        """The steps of this called computation with its parameters' values in
        `bound` (parts per parameter), and the buffer id of each leaf of its result."""
        for param, value in zip(self.comp.parameters, bound):
            if isinstance(value, tuple):
                self.bound[param] = value
            else:
                self.buffer_of[param] = value
        results = leaves(parts(self.comp.root, self.bound))
        materialized = materialize_reasons(self.order, self.users)
        self.decisions = fusion_decisions(self.order, materialized)
        for inst in results:
            if not isinstance(inst, int):
                materialized[inst] = materialized[inst] or "a loop's next state"
        for inst in self.order:
            if materialized[inst] and inst not in self.buffer_of and inst not in self.bound:
                self._emit(inst, "temp")
        return self.steps, [r if isinstance(r, int) else self.materialized(r) for r in results]

    def lower_called(self, comp, bound):
        called = _Lowering(comp, self.target, parent=self)
        steps, results = called.run_called([bound])
        self.decisions += called.decisions
        return steps, results

    # ------------------------------------------------------------------ kernels
    def buffer_for(self, inst, role, data=None):
        buf = Buffer(len(self.buffers), inst.shape.dtype, inst.shape.dims, role, data, inst.name)
        self.buffers.append(buf)
        self.buffer_of[inst] = buf.id
        return buf.id

    def _copy(self, inst):
        buf = Buffer(len(self.buffers), inst.shape.dtype, inst.shape.dims, "output", None,
                     inst.name + ".copy")
        self.buffers.append(buf)
        index = tuple(Index(S64, d) for d in range(inst.shape.rank))
        self.steps.append(LoopKernel(f"copy_{inst.name}", inst.shape.dims,
                                     [(buf.id, self.value_at(inst, index))]))
        return buf.id

    def materialized(self, inst):
        """The buffer holding `inst`, computing it into a temp first if needed."""
        if inst.opcode == "constant" and inst not in self.buffer_of:   # a scalar a GEMM reads
            self.buffer_for(inst, "constant", inst.literal)
        if inst not in self.buffer_of:
            self._emit(inst, "temp")
        return self.buffer_of[inst]

    def in_place(self, inst):
        """A buffer holding `inst`'s elements in row-major order: a reshape's (or
        bitcast's) operand's, where it has one, since a reshape moves no element
        (a Flatten before a Dense layer, a Conv1D's operands). For steps that
        read a buffer by strides (GEMMs), which need the order, not the dims."""
        while inst.opcode in ("reshape", "bitcast") and inst not in self.buffer_of \
                and inst.operands[0].shape.size == inst.shape.size:
            inst = inst.operands[0]
        return self.materialized(inst)

    def temp(self, dtype, dims, name):
        buf = Buffer(len(self.buffers), dtype, tuple(dims), "temp", None, name)
        self.buffers.append(buf)
        return buf.id

    def own_kernel(self, inst, role, dtype, dims, value, transposes=False):
        """The buffer that a kernel of its own fills with value(loop index) for
        `inst`'s `role`: a value its readers would each compute many times
        over. Built once; a kernel kept alone, before the first reader's.
        `transposes`: a transposed copy (LoopKernel.transposes)."""
        if (inst, role) not in self.own_kernels:
            bid = self.temp(dtype, dims, f"{inst.name}.{role}")
            index = self.loop_index_of(len(dims))
            expr = self.in_kernel(index, {}, lambda: value(index))
            self.steps.append(LoopKernel(f"k{len(self.steps)}_{role}", tuple(dims),
                                         [(bid, expr)], [inst.name], reduction=True,
                                         transposes=transposes))
            self.own_kernels[inst, role] = bid
        return self.own_kernels[inst, role]

    def _emit(self, inst, role):
        if inst.opcode == "while":
            self.bound[inst] = lower_while(self, inst, self.lower_called)
            return
        if inst.shape.is_tuple and inst.opcode in ("parameter", "get-tuple-element"):
            self.bound[inst] = parts(inst, self.bound)
            return
        if inst.opcode == "get-tuple-element":
            element = parts(inst, self.bound)
            if element is not inst:       # an element of a loop's state
                self.buffer_of[inst] = element if isinstance(element, int) \
                    else self.materialized(element)
                return
        if inst.opcode == "convolution" and (
                self.target.implicit_gemm and conv_as_implicit_gemm(self, inst, role)
                or conv_as_gemm(self, inst, role)):
            return
        if inst.opcode == "scatter":
            self._scatter(inst, role)
            return
        if inst.opcode == "dynamic-update-slice":
            self._update_slice(inst, role)
            return
        if inst.opcode == "concatenate":
            self._concatenate(inst, role)
            return
        if inst.opcode == "dot" and self.target.implicit_dots \
                and dot_as_implicit_gemm(self, inst, role):
            return
        gemm = self._gemm(inst)
        if gemm is not None:
            bid = self.buffer_for(inst, role)
            gemm.out = bid
            self.steps.append(gemm)
            return
        if join_recent_loop(self, inst, role):
            return
        index, values = self.loop_index_of(inst.shape.rank), {}
        value = self.expr_in(inst, index, values)
        values[inst] = value
        kernel = LoopKernel(f"k{len(self.steps)}_{inst.opcode}", inst.shape.dims,
                            [(self.buffer_for(inst, role), value)], [inst.name],
                            reduction=roots_a_kernel(inst))
        self.kernel_state[id(kernel)] = (index, values)
        self.steps.append(kernel)

    def _scatter(self, inst, role):
        """The operand copied to the result, then the updates applied in order."""
        out = self.buffer_for(inst, role)
        index = self.loop_index_of(inst.shape.rank)
        start = self.in_kernel(index, {}, lambda: self.operand(inst, 0, index))
        self.steps.append(LoopKernel(f"k{len(self.steps)}_scatter_operand", inst.shape.dims,
                                     [(out, start)]))
        updates = inst.operands[2].shape.dims
        index = self.loop_index_of(len(updates))
        target, value, update, fits, adds = self.in_kernel(
            index, {}, lambda: scatter_update(self, inst, index, out))
        self.steps.append(ScatterKernel(f"k{len(self.steps)}_scatter", updates, [(out, value)],
                                        [inst.name], reduction=True, target=target,
                                        update=update, fits=fits, adds=adds))

    def _update_slice(self, inst, role):
        """The operand copied to the result, then the update stored in its
        window: a loop can drop the copy and write the window into its state
        (loops.py)."""
        out = self.buffer_for(inst, role)
        index = self.loop_index_of(inst.shape.rank)
        whole = self.in_kernel(index, {}, lambda: self.operand(inst, 0, index))
        self.steps.append(LoopKernel(f"k{len(self.steps)}_update_slice_operand",
                                     inst.shape.dims, [(out, whole)]))
        self._store_window(inst, out, inst.operands[1].shape.dims,
                           lambda index: update_window(self, inst, index))

    def _concatenate(self, inst, role):
        """Each operand stored in its window of the result: computed only there,
        not selected per element among all of them."""
        out, d = self.buffer_for(inst, role), inst.attrs["dimensions"][0]
        offset = 0
        for i, op in enumerate(inst.operands):
            def window(index, i=i, start=offset):
                target = tuple(Op(S64, "add", (x, Const(S64, start))) if k == d else x
                               for k, x in enumerate(index))
                return target, self.operand(inst, i, index)
            self._store_window(inst, out, op.shape.dims, window)
            offset += op.shape.dims[d]

    def _store_window(self, inst, out, dims, element):
        """A kernel over `dims` storing element(index) -> (target, value) into `out`."""
        index = self.loop_index_of(len(dims))
        target, value = self.in_kernel(index, {}, lambda: element(index))
        self.steps.append(ScatterKernel(f"k{len(self.steps)}_{inst.opcode}", dims,
                                        [(out, value)], [inst.name], reduction=True,
                                        target=target, ordered=False))

    @staticmethod
    def loop_index_of(rank):
        return tuple(Index(S64, d) for d in range(rank))

    def expr_in(self, inst, index, values, unready=None, horizon=None):
        """`inst`'s Expr at `index` in a kernel holding `values`."""
        return self.in_kernel(index, values, lambda: self._compute(inst, index),
                               unready, horizon)

    def in_kernel(self, index, values, build, unready=None, horizon=None):
        """build() in the context of a kernel holding `values` at `index`; restores
        the previous kernel context afterwards (success or not) so builds do not
        leak into each other."""
        saved = self.kernel_values, self.loop_index, self.unready, self.horizon
        self.kernel_values, self.loop_index, self.unready, self.horizon = \
            values, index, unready, horizon
        try:
            return build()
        finally:
            self.kernel_values, self.loop_index, self.unready, self.horizon = saved

    def value_at(self, inst, index):
        """`inst` at `index` in the kernel being built: its expression there, a
        load of its buffer, or a constant."""
        if inst in self.kernel_values:
            if index != self.loop_index:
                raise NotInKernel()
            return self.kernel_values[inst]
        bid = self.buffer_of.get(inst)
        if bid is not None and self.unready and bid in self.unready:
            # Joining an earlier kernel: this buffer is written only after it runs.
            # A scalar that is no reduction is cheap to compute again in place
            # (Adam's step count feeding the bias correction); anything else is not.
            if inst.shape.rank or roots_a_kernel(inst):
                raise NotInKernel()
            bid = None
        if bid is not None:
            buf = self.buffers[bid]
            return Load(buf.dtype, buf.id, tuple(index))
        if inst.opcode == "constant":
            return Const(inst.shape.dtype, inst.literal.item())
        # Entries built for a join can recompute what a load would read elsewhere,
        # so each join position keeps its own.
        key = (id(inst), self.horizon) + tuple(map(id, index))
        if key not in self.memo:      # keeps shared subexpressions shared (a DAG, not a tree)
            self.memo[key] = (index, self._compute(inst, index))
        return self.memo[key][1]

    # ----------------------------------------------------------- expressions
    def _compute(self, inst, index):
        impl = EXPRESSIONS.get(inst.opcode) or (elementwise if inst.kind == ELEMENTWISE else None)
        if impl is None:
            raise Unsupported(f"kerasjit has no code generation for HLO '{inst.opcode}'")
        return impl(self, inst, index)

    def operand(self, inst, i, index):
        return self.value_at(inst.operands[i], tuple(index))

    def key(self, inst, role=""):
        """A small int naming one reduction loop (per instruction and role)."""
        return self.keys.setdefault((id(inst), role), len(self.keys))

    def combiner(self, computation, n):
        """Vars of the first n and of the last n parameters of a scalar HLO
        computation, and its combined Exprs."""
        params = computation.parameters
        names = [f"{computation.name}.{p.parameter_number}" for p in params]
        vars_ = [Var(p.shape.dtype, name) for p, name in zip(params, names)]
        values = {p: v for p, v in zip(params, vars_)}
        for inst in computation.post_order():
            if inst in values:
                continue
            if inst.opcode == "constant":
                values[inst] = Const(inst.shape.dtype, inst.literal.item())
            elif inst.opcode == "tuple":
                values[inst] = tuple(values[o] for o in inst.operands)
            elif inst.opcode == "get-tuple-element":
                values[inst] = values[inst.operands[0]][inst.attrs["index"]]
            elif inst.kind == ELEMENTWISE:
                values[inst] = op_of(inst, [values[o] for o in inst.operands])
            else:
                raise Unsupported(f"reduction computation uses '{inst.opcode}'")
        combined = values[computation.root]
        combined = combined if isinstance(combined, tuple) else (combined,)
        return tuple(vars_[:n]), tuple(vars_[n:]), combined

    def _gemm(self, inst):
        """A GemmCall for an f32 dot whose operands read as matrices in place, else None."""
        layout = dot_layout(inst, self.target.min_batched_product)
        if layout is None:
            return None
        # (sgemm reads buffers: its operands are materialised)
        lhs, rhs = (self.in_place(op) for op in inst.operands)
        return GemmCall(f"gemm_{inst.name}", None, lhs, rhs, **dataclasses.asdict(layout))
