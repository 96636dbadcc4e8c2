"""HLO shapes: element type plus dimensions, or a tuple of shapes."""
import functools
from dataclasses import dataclass

import ml_dtypes
import numpy as np

# HLO primitive type name -> numpy dtype.
DTYPES = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8), "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32), "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8), "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32), "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "c64": np.dtype(np.complex64), "c128": np.dtype(np.complex128),
}
HLO_TYPE = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Shape:
    """An array shape (`dtype` set, `tuple_shapes` None) or a tuple shape."""
    dtype: str = None
    dims: tuple = ()
    tuple_shapes: tuple = None

    @staticmethod
    def array(dtype, dims):
        dtype = dtype if isinstance(dtype, str) else HLO_TYPE[np.dtype(dtype)]
        if dtype not in DTYPES:
            raise ValueError(f"unknown HLO element type '{dtype}'")
        return Shape(dtype, tuple(int(d) for d in dims))

    @staticmethod
    def tuple(shapes):
        return Shape(tuple_shapes=tuple(shapes))

    @property
    def is_tuple(self):
        return self.tuple_shapes is not None

    @property
    def rank(self):
        return len(self.dims)

    @property
    def numpy_dtype(self):
        return DTYPES[self.dtype]

    @property
    def size(self):
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def nbytes(self):
        if self.is_tuple:
            return sum(s.nbytes for s in self.tuple_shapes)
        return self.size * self.numpy_dtype.itemsize

    def __str__(self):
        return self._text

    def with_layout(self):
        """The text form with XLA's default (row-major) layout, as dumps print it."""
        return self._text_with_layout

    # Texts made once per shape (cached_property writes the instance's __dict__,
    # which a frozen dataclass allows): a module is printed for every pipeline
    # round and every cache key, each instruction with its operands' shapes.
    @functools.cached_property
    def _text(self):
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"

    @functools.cached_property
    def _text_with_layout(self):
        if self.is_tuple:
            return "(" + ", ".join(s.with_layout() for s in self.tuple_shapes) + ")"
        if not self.dims:
            return str(self)
        return f"{self}{{{','.join(str(d) for d in reversed(range(self.rank)))}}}"


def row_major_strides(dims):
    """Elements between consecutive indices of each dim, laid out row-major."""
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= d
    return strides[::-1]
