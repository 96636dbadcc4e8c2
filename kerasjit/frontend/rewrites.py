"""TensorFlow-graph rewrites that make compiled results match plain TensorFlow.

XLA's lowering of `StatelessRandomUniformV2` draws the same Philox bits as
TensorFlow's CPU kernel but turns them into floats differently (XLA keeps the
high 23 bits, TensorFlow the low 23), so dropout masks differ and a model
trained under XLA drifts from the unwrapped one. We ask the bridge for the raw
bits (`StatelessRandomUniformFullIntV2`, identical in both) and convert them
the way TensorFlow's kernel does: `bitcast((bits & 0x7fffff) | 0x3f800000) - 1`
(for f16 and bf16, a word's low 10 or 7 bits in a 16-bit 1.0). Normals
(`StatelessRandomNormalV2`: GaussianNoise, GaussianDropout) likewise:
TensorFlow's Box-Muller on the same bits, words 2k and 2k+1 making elements
2k (a sine) and 2k+1 (a cosine).
"""
import math

import numpy as np
import tensorflow as tf

from .nodes import Builder, tensor_name


# dtype -> (bits its uniforms are built in, mantissa mask, the exponent of 1.0):
# TensorFlow's Uint32ToFloat, Uint16ToHalf, Uint16ToGfloat16 (a word's low bits).
_UNIFORM_BITS = {tf.float32: (tf.uint32, 0x7FFFFF, 0x3F800000),
                 tf.float16: (tf.uint16, 0x3FF, 0x3C00),
                 tf.bfloat16: (tf.uint16, 0x7F, 0x3F80)}


def _uniform_as_tf_does(uniform, specs):
    """Nodes replacing one StatelessRandomUniformV2 (same output name)."""
    spec = specs.get(tensor_name(uniform.name))
    shape = spec.shape if spec is not None else None
    b = Builder(uniform.name + "/kerasjit", specs)
    bits = b.op("bits", "StatelessRandomUniformFullIntV2", list(uniform.input), shape, tf.uint32,
                dtype=tf.uint32, Tshape=uniform.attr["Tshape"].type)
    _uniform_from_bits(b, "float", bits, shape, tf.as_dtype(uniform.attr["dtype"].type),
                       out=uniform.name)
    return b.nodes


def _uniform_from_bits(b, name, bits, shape, dtype=tf.float32, out=None):
    """TensorFlow's `dtype` float in [0, 1) of uint32 `bits` (from a word's low
    bits, a 1.0 with a random mantissa, minus 1), named `out` if given."""
    word, mask, one = _UNIFORM_BITS[dtype]
    if word != tf.uint32:
        bits = b.op(f"{name}/word", "Cast", [bits], shape, word, SrcT=tf.uint32, DstT=word)
    numpy_word = word.as_numpy_dtype
    masked = b.op(f"{name}/masked", "BitwiseAnd", [bits, b.const(f"{name}/mask",
                                                                  numpy_word(mask))],
                  shape, word, T=word)
    in_one_two = b.op(f"{name}/in_1_2", "BitwiseOr",
                      [masked, b.const(f"{name}/one_exponent", numpy_word(one))],
                      shape, word, T=word)
    as_float = b.op(f"{name}/as_float", "Bitcast", [in_one_two], shape, dtype, T=word, type=dtype)
    return b.op(f"{name}/uniform", "Sub",
                [as_float, b.const(f"{name}/one", np.asarray(1, dtype.as_numpy_dtype))],
                shape, dtype, full_name=out, T=dtype)


def _normal_as_tf_does(normal, specs):
    """Nodes replacing one StatelessRandomNormalV2 of static shape (same
    output name), or None when its shape is not known."""
    spec = specs.get(tensor_name(normal.name))
    if spec is None or not spec.shape.is_fully_defined():
        return None
    count = spec.shape.num_elements()
    pairs = (count + 1) // 2          # (an odd count draws one word more, unused)
    b = Builder(normal.name + "/kerasjit", specs)
    f32 = tf.float32
    bits = b.op("bits", "StatelessRandomUniformFullIntV2",
                [b.const("count", np.array([2 * pairs], np.int32)), *normal.input[1:]],
                [2 * pairs], tf.uint32, dtype=tf.uint32, Tshape=tf.int32)
    by_pair = b.op("by_pair", "Reshape", [bits, b.const("pair_shape",
                                                        np.array([pairs, 2], np.int32))],
                   [pairs, 2], tf.uint32, T=tf.uint32, Tshape=tf.int32)
    words = b.op("words", "Unpack", [by_pair], [pairs], tf.uint32, outputs=2, T=tf.uint32)
    words.attr["num"].i, words.attr["axis"].i = 2, 1
    u1 = b.op("u1", "Maximum", [_uniform_from_bits(b, "x0", f"{words.name}:0", [pairs]),
                                b.const("epsilon", np.float32(1e-7))], [pairs], f32, T=f32)
    # v1 = 2 pi u, in double as C++'s `2.0f * M_PI * u` is, then rounded to float.
    wide = b.op("u_wide", "Cast", [_uniform_from_bits(b, "x1", f"{words.name}:1", [pairs])],
                [pairs], tf.float64, SrcT=f32, DstT=tf.float64)
    turn = b.op("turn", "Mul", [wide, b.const("two_pi", np.float64(2 * math.pi))], [pairs],
                tf.float64, T=tf.float64)
    v1 = b.op("v1", "Cast", [turn], [pairs], f32, SrcT=tf.float64, DstT=f32)
    log = b.op("log_u1", "Log", [u1], [pairs], f32, T=f32)
    u2 = b.op("u2", "Sqrt", [b.op("minus_two_log", "Mul", [b.const("minus_two", np.float32(-2)),
                                                           log], [pairs], f32, T=f32)],
              [pairs], f32, T=f32)
    sine = b.op("f0", "Mul", [b.op("sin", "Sin", [v1], [pairs], f32, T=f32), u2], [pairs], f32,
                T=f32)
    cosine = b.op("f1", "Mul", [b.op("cos", "Cos", [v1], [pairs], f32, T=f32), u2], [pairs], f32,
                  T=f32)
    both = b.op("both", "Pack", [sine, cosine], [pairs, 2], f32, T=f32)
    both.attr["N"].i, both.attr["axis"].i = 2, 1
    flat = b.op("flat", "Reshape", [both, b.const("flat_shape", np.array([2 * pairs], np.int32))],
                [2 * pairs], f32, T=f32, Tshape=tf.int32)
    taken = b.op("taken", "Slice", [flat, b.const("begin", np.array([0], np.int32)),
                                    b.const("size", np.array([count], np.int32))],
                 [count], f32, T=f32, Index=tf.int32)
    dtype = tf.as_dtype(normal.attr["dtype"].type)   # (16 bits: the float normal, rounded)
    shaped = b.op("shaped", "Reshape", [taken, normal.input[0]], spec.shape, f32,
                  full_name=None if dtype != f32 else normal.name, T=f32,
                  Tshape=normal.attr["Tshape"].type)
    if dtype != f32:
        b.op("", "Cast", [shaped], spec.shape, dtype, full_name=normal.name, SrcT=f32, DstT=dtype)
    return b.nodes


def rewrite_for_tf_parity(fg):
    nodes = []
    for n in fg.nodes:
        dtype = tf.as_dtype(n.attr["dtype"].type) if "dtype" in n.attr else None
        if n.op == "StatelessRandomUniformV2" and dtype in _UNIFORM_BITS:
            nodes.extend(_uniform_as_tf_does(n, fg.specs))
        elif n.op == "StatelessRandomNormalV2" and dtype in _UNIFORM_BITS \
                and (made := _normal_as_tf_does(n, fg.specs)) is not None:
            nodes.extend(made)
        else:
            nodes.append(n)
    fg.nodes = nodes
    return fg
