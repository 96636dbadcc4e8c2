"""HLO IR: parse, print, verify and evaluate XLA's high-level operations."""
from .ir import Computation, Instruction, Module, NameUniquer, WindowDim
from .parser import HloParseError, parse_module
from .printer import print_module
from .shape import Shape
from .verifier import HloVerifyError, verify

__all__ = ["Computation", "Instruction", "Module", "NameUniquer", "WindowDim", "HloParseError",
           "parse_module", "print_module", "Shape", "HloVerifyError", "verify"]
