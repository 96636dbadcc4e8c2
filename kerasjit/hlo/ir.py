"""HLO IR: modules of computations of instructions, as in XLA.

Instructions are small and printable; attributes are stored typed (tuples of
ints, slice/window/padding records, called computations) so passes and
backends never re-parse strings. `printer.py` writes XLA's text format back.
"""
import itertools
from dataclasses import dataclass, field

import numpy as np

from .attributes import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS
from .opcodes import opcode
from .printer import print_module
from .shape import Shape

@dataclass(frozen=True)
class WindowDim:
    size: int = 1
    stride: int = 1
    pad_lo: int = 0
    pad_hi: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1
    rhs_reversal: bool = False


@dataclass(eq=False)
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: list = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    literal: np.ndarray = None        # constants only
    parameter_number: int = None      # parameters only

    def __post_init__(self):
        opcode(self.opcode)   # unknown opcodes fail here, with their name

    @property
    def kind(self):
        return opcode(self.opcode).kind

    @property
    def called_computations(self):
        called = []
        for k, v in self.attrs.items():
            called += [v] if k in COMPUTATION_ATTRS else list(v) if k in COMPUTATION_LIST_ATTRS \
                else []
        return called

    def __repr__(self):
        return f"%{self.name} = {self.shape} {self.opcode}(...)"


@dataclass(eq=False)
class Computation:
    name: str
    instructions: list          # in a valid (def-before-use) order
    root: Instruction

    @property
    def parameters(self):
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number)

    def users(self):
        """instruction -> list of instructions that use it."""
        out = {i: [] for i in self.instructions}
        for inst in self.instructions:
            for op in inst.operands:
                out[op].append(inst)
        return out

    def post_order(self):
        """Instructions reachable from the root, operands first."""
        seen, order = set(), []
        stack = [(self.root, False)]
        while stack:
            inst, expanded = stack.pop()
            if expanded:
                order.append(inst)
                continue
            if inst in seen:
                continue
            seen.add(inst)
            stack.append((inst, True))
            stack.extend((op, False) for op in reversed(inst.operands) if op not in seen)
        return order


@dataclass(eq=False)
class Module:
    name: str
    computations: list          # callees before callers; entry last
    entry: Computation
    # output index (tuple of ints) -> (parameter number, parameter index)
    input_output_alias: dict = field(default_factory=dict)
    header_attrs: dict = field(default_factory=dict)   # other HloModule attributes, raw

    def computation(self, name):
        for c in self.computations:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self):
        return print_module(self)


class NameUniquer:
    """Fresh instruction names (`add.3`) that do not clash with existing ones."""

    def __init__(self, module=None):
        self.used = set()
        if module is not None:
            for comp in module.computations:
                self.used.update(i.name for i in comp.instructions)
        self.counter = itertools.count()

    def __call__(self, base):
        while True:
            name = f"{base}.{next(self.counter)}"
            if name not in self.used:
                self.used.add(name)
                return name
