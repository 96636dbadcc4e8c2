"""The reference backend: runs HLO on the numpy evaluator (the oracle)."""
from ..compiler import Backend, Executable
from ..hlo.evaluator import evaluate


class ReferenceExecutable(Executable):
    def __init__(self, module):
        self.module = module

    def __call__(self, args):
        out = evaluate(self.module, list(args))
        return list(out) if self.module.entry.root.shape.is_tuple else [out]


class ReferenceBackend(Backend):
    name = "reference"
    optimizes = False

    def compile(self, module, donate=None, optimized=False, only_cached=False):
        """The module as given (the oracle runs no passes); donate is ignored:
        the evaluator's outputs are always new arrays."""
        return ReferenceExecutable(module)


BACKEND = ReferenceBackend()
