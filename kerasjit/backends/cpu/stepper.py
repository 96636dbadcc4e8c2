"""Several steps in one native call: a loop that re-points a cluster's buffer
table between calls of its entry.

Everything that changes from step to step is a buffer pointer: the batch
(a row of a stacked array), the variables (the previous step's outputs) and
the outputs (alternating between two sets, or rows of a stacked array). The
caller precomputes those pointers as a [slots, steps] matrix with numpy, so
n steps cost one ctypes call and no Python per step.
"""
import ctypes

from llvmlite import ir

from . import engine

_NAME = "kerasjit_run_steps"
_I64 = ir.IntType(64)
_PTR = ir.PointerType()
_driver = None


def _driver_ir():
    """void run_steps(entry, table, n, k, slots, pointers):
    for s < n: for j < k: table[slots[j]] = pointers[j * n + s]; entry(table)"""
    module = ir.Module(name=_NAME)
    # A typed pointer: llvmlite takes an indirect call's signature from its callee's type.
    entry_type = ir.FunctionType(ir.VoidType(), [_PTR]).as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(),
                                             [entry_type, _PTR, _I64, _I64, _PTR, _PTR]), _NAME)
    entry, table, n, k, slots, pointers = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    step_head, patch_head, patch_done, done = (fn.append_basic_block(x) for x in
                                               ("step", "patch", "call", "done"))
    b.cbranch(b.icmp_signed(">", n, ir.Constant(_I64, 0)), step_head, done)

    b.position_at_end(step_head)
    s = b.phi(_I64)
    s.add_incoming(ir.Constant(_I64, 0), fn.entry_basic_block)
    b.cbranch(b.icmp_signed(">", k, ir.Constant(_I64, 0)), patch_head, patch_done)

    b.position_at_end(patch_head)
    j = b.phi(_I64)
    j.add_incoming(ir.Constant(_I64, 0), step_head)
    slot = b.load(b.gep(slots, [j], source_etype=_I64), typ=_I64)
    value = b.load(b.gep(pointers, [b.add(b.mul(j, n), s)], source_etype=_PTR), typ=_PTR)
    b.store(value, b.gep(table, [slot], source_etype=_PTR))
    j_next = b.add(j, ir.Constant(_I64, 1))
    j.add_incoming(j_next, patch_head)
    b.cbranch(b.icmp_signed("<", j_next, k), patch_head, patch_done)

    b.position_at_end(patch_done)
    b.call(entry, [table])
    s_next = b.add(s, ir.Constant(_I64, 1))
    s.add_incoming(s_next, patch_done)
    b.cbranch(b.icmp_signed("<", s_next, n), step_head, done)

    b.position_at_end(done)
    b.ret_void()
    return module


_DRIVER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


def run_steps():
    """The driver as a ctypes function (built and linked once per process)."""
    global _driver
    if _driver is None:
        module = engine.optimize(_driver_ir())
        _driver = _DRIVER(engine.load_object(engine.object_code(module), _NAME))
    return _driver
