"""TensorFlow's own TF->HLO bridge, asked one cluster at a time.

A cluster is a set of nodes of a FunctionalGraph. We rebuild it as a
tf.function (importing just its nodes, with placeholders for what flows in)
and ask `experimental_get_compiler_ir(...)(stage="hlo")` for its HLO. When the
bridge rejects a node, the error names it; the caller moves that node to
TensorFlow and partitions again.
"""
import contextlib
import functools
import hashlib
import os
import re

import numpy as np
import tensorflow as tf
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import control_flow_ops

from ..backends.cpu import cache
from ..errors import HloParseError, NotCached
from ..hlo import parse_module, print_module
from ..hlo.shape import DTYPES
from ..passes import configured_passes, optimize_as_configured
from .collectives import COLLECTIVES
from .nodes import attribute_types, graph_digest, library_for

# Ops whose output shape depends on input values: the bridge can only give
# them bounded dynamic shapes, which kerasjit does not compile.
DYNAMIC_SHAPE_OPS = {"Where": "output shape depends on the values (1-argument tf.where)",
                     "Unique": "output shape depends on the values",
                     "UniqueV2": "output shape depends on the values",
                     "ListDiff": "output shape depends on the values",
                     "Bincount": "output shape depends on the values"}
PYTHON_OPS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}
BRANCH_OPS = {"If", "StatelessIf", "Case", "StatelessCase"}
# Stateful generators: TensorFlow keeps their stream; XLA's `rng` would not.
STATEFUL_RANDOM_OPS = {"RandomUniform", "RandomUniformInt", "RandomStandardNormal",
                       "TruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
                       "RandomPoisson", "RandomPoissonV2"}
# Stateless generators whose XLA kernel draws other numbers than TensorFlow's
# from the same seed (an inverse-CDF truncated normal, not TensorFlow's rejection).
OTHER_STREAM_OPS = {"StatelessTruncatedNormal", "StatelessTruncatedNormalV2"}
_REJECTED_NODE = re.compile(r"\{\{node ([^}]+)\}\}|node `([^`]+)`")


@contextlib.contextmanager
def traced_for_xla():
    """Trace in an XLA context, as tf.function(jit_compile=True) does: TensorFlow
    then builds control flow the bridge can lower (a loop's gradient keeps its
    per-iteration values in lists sized by the trip count, not by run-time
    lengths)."""
    context = control_flow_ops.XLAControlFlowContext()
    context.Enter()
    try:
        yield
    finally:
        context.Exit()


class BridgeRejected(Exception):
    def __init__(self, nodes, message):
        super().__init__(message)
        self.nodes, self.message = nodes, message


def static_reason(node):
    """Why a node can never be compiled, or '' (decided without the bridge)."""
    if node.op in PYTHON_OPS:
        return "tf.py_function runs Python"
    if node.op in COLLECTIVES:
        return "a collective across replicas: TensorFlow runs it"
    if node.op in STATEFUL_RANDOM_OPS:
        return "stateful random op: its stream is TensorFlow's own"
    if node.op in OTHER_STREAM_OPS:
        return "XLA's kernel draws other numbers than TensorFlow's from the same seed"
    if node.op in DYNAMIC_SHAPE_OPS:
        return DYNAMIC_SHAPE_OPS[node.op]
    if node.op in BRANCH_OPS:       # (the others were if-converted: functional.py)
        return "a branch whose results have no static shape"
    if tf.string.as_datatype_enum in attribute_types(node) or _makes_strings(node.op):
        return "string tensors have no XLA representation"
    return ""


@functools.cache
def _makes_strings(op):
    """Whether op `op` makes strings whatever its attributes (AsString)."""
    op_def = op_def_registry.get(op)
    return op_def is not None and any(a.type == tf.string.as_datatype_enum
                                      for a in op_def.output_arg)


def subgraph_function(nodes, library, inputs, outputs):
    """A Python function of `inputs` tensors computing `outputs` via `nodes`,
    and a digest of all that decides it (the bridge's cache key, with the specs)."""
    graph_def = _graph_def(nodes, library)
    return (_importing(lambda: graph_def, inputs, outputs),
            graph_digest(nodes, inputs, outputs, graph_def.library))


def graph_function(make_graph_def, inputs, outputs):
    """A Python function of `inputs` tensors computing `outputs` by the
    GraphDef make_graph_def() makes when first called."""
    return _importing(functools.cache(make_graph_def), inputs, outputs)


def lazy_subgraph_function(make_nodes, library, inputs, outputs):
    """subgraph_function's function alone, its graph made from make_nodes() when
    first called: a cluster whose HLO is in the compile cache may never be."""
    return graph_function(lambda: _graph_def(make_nodes(), library), inputs, outputs)


def _graph_def(nodes, library):
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend(nodes)
    graph_def.library.CopyFrom(library_for(nodes, library))
    return graph_def


def _importing(graph_def, inputs, outputs):
    def run(*args):
        return tf.graph_util.import_graph_def(
            graph_def(), input_map=dict(zip(inputs, args)), return_elements=outputs, name="")
    run.graph_def = graph_def
    return run


def literals_from_proto(serialized):
    """Constant name -> ndarray for every constant of a serialized HloModuleProto."""
    proto = hlo_pb2.HloModuleProto()
    proto.ParseFromString(serialized)
    out = {}
    for comp in proto.computations:
        for inst in comp.instructions:
            if inst.opcode == "constant":
                out[inst.name] = _literal_values(inst.literal)
    return out


def _literal_values(literal):
    type_name = xla_data_pb2.PrimitiveType.Name(literal.shape.element_type).lower()
    dtype = DTYPES.get(type_name)
    dims = tuple(literal.shape.dimensions)
    if dtype is None:
        return None
    field = {"pred": "preds", "s32": "s32s", "s64": "s64s", "u32": "u32s", "u64": "u64s",
             "f32": "f32s", "f64": "f64s"}.get(type_name)
    if field is not None:
        return np.array(getattr(literal, field), dtype=dtype).reshape(dims)
    raw = {"s8": literal.s8s, "u8": literal.u8s, "f16": literal.f16s, "bf16": literal.bf16s,
           "s16": literal.s16s, "u16": literal.u16s}[type_name]
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def cached_hlo_module(fn, digest, specs, optimized, only_cached=False):
    """hlo_module(fn, *specs), with `optimized` after the HLO passes (what a
    backend that runs them compiles), from the compile cache where this graph
    (its subgraph_function digest) met the bridge and this compiler's passes
    before with these specs: the bridge, parsing its text and the passes were
    most of a warm start's compile. With KERASJIT_DEBUG or KERASJIT_DUMP_DIR
    the passes always run (to check or show them). `only_cached`: NotCached
    unless the optimised module comes from the cache."""
    key = bridge_key(digest, specs)
    if not optimized:
        return _cached_module(key) or _stored(key, hlo_module(fn, *specs))
    passes = " ".join(p.__name__ for p in configured_passes())
    optimized_key = "optimized-" + hashlib.sha256(
        f"{key}\n{cache.compiler_fingerprint()}\n{passes}".encode()).hexdigest()
    rerun = os.environ.get("KERASJIT_DEBUG") or os.environ.get("KERASJIT_DUMP_DIR")
    if only_cached and not rerun:
        stored = _StoredModule.load(optimized_key)
        if stored is None:
            raise NotCached(f"no optimised HLO under {optimized_key}")
        return stored
    module = None if rerun else _cached_module(optimized_key)
    if module is None:
        module = optimize_as_configured(_cached_module(key) or _stored(key, hlo_module(fn, *specs)))
        _stored(optimized_key, module)
        cache.store_text(_StoredModule.fingerprint_key(optimized_key), cache.fingerprint(module))
    return module


class _StoredModule:
    """An optimised module from the compile cache, parsed when first looked
    into: a lookup of its code needs only its fingerprint (the backend's key),
    kept beside it, and the parse was a fifth of a warm start's lookups
    (reports/tuning-measurements.md)."""

    def __init__(self, text, fingerprint):
        self.text, self.fingerprint, self.parsed = text, fingerprint, None

    @staticmethod
    def fingerprint_key(key):
        return "fingerprint-" + key

    @classmethod
    def load(cls, key):
        """The module stored under `key` with its fingerprint, else None."""
        fingerprint = cache.load_text(cls.fingerprint_key(key))
        text = fingerprint and cache.load_text(key)
        return cls(text, fingerprint) if text else None

    def __str__(self):                  # (the HLO text, as a parsed module prints it)
        return self.text

    def __getattr__(self, name):        # (what the module holds: parsed now)
        if self.parsed is None:
            self.parsed = parse_module(self.text)
        return getattr(self.parsed, name)


def bridge_key(digest, specs=()):
    """What decides the bridge's HLO of a graph (and so which of its nodes it
    rejects): its digest, the specs, the TensorFlow version, XLA's flags and
    the devices."""
    key = hashlib.sha256(repr((digest, [(tuple(s.shape), s.dtype.name) for s in specs],
                               tf.__version__, os.environ.get("TF_XLA_FLAGS"),
                               os.environ.get("XLA_FLAGS"),
                               [d.name for d in tf.config.list_logical_devices()])).encode())
    return "bridge-" + key.hexdigest()


def _cached_module(key):
    text = cache.load_text(key)
    if text is not None:
        try:
            return parse_module(text)
        except HloParseError:
            pass                   # (not what we stored: made again)
    return None


def _stored(key, module):
    cache.store_text(key, print_module(module))
    return module


def hlo_module(fn, *args):
    """The HLO Module TensorFlow's bridge makes of `fn` for these args or TensorSpecs."""
    compiled = tf.function(fn, jit_compile=True, autograph=False)
    ir = compiled.experimental_get_compiler_ir(*args)
    try:
        text = ir(stage="hlo")
    except Exception as e:    # the bridge reports rejected nodes by name
        message = str(e)
        names = [a or b for a, b in _REJECTED_NODE.findall(message)]
        raise BridgeRejected(list(dict.fromkeys(names)), _rejection_reason(message)) from None
    if "<=" in text.splitlines()[0]:
        raise BridgeRejected([], "the bridge produced dynamic shapes")
    # Large constants are printed elided, `{...}`: only then is the serialized
    # module (a second bridge run: reports/tuning-measurements.md) worth asking for.
    elided = "{...}" in text
    return parse_module(text, literals_from_proto(ir(stage="hlo_serialized")) if elided else None)


_NO_XLA_KERNEL = re.compile(r"No registered '(\w+)' OpKernel for (XLA_\w+_JIT) devices")


def _rejection_reason(message):
    """The bridge's error as a cluster's reason: that an op has no XLA kernel
    where that is what it says, else its first paragraph without the node
    markers (the reason is given beside the node's name) and TensorFlow's
    advice on dumping graphs."""
    missing = _NO_XLA_KERNEL.search(message)
    if missing:
        return f"{missing[1]} has no XLA kernel ({missing[2]})"
    message = message.replace("Failed getting HLO text: '", "").split("\nThe op is created at")[0]
    return _REJECTED_NODE.sub("", message.split("\n\n")[0].split(" | ")[0]).strip()
