"""`kerasjit.explain`: what was compiled, what runs in TensorFlow, and why."""
from collections import Counter
from dataclasses import dataclass, field

import keras
import numpy as np

from .runtime.distribute import replicated, split_batch, strategy_of
from .hlo import print_module
from .step import CompiledStep


@dataclass
class ClusterInfo:
    kind: str            # "compiled" or "tensorflow"
    ops: list            # TF op types, in order
    reason: str          # why it runs in TensorFlow ("" when compiled)
    hlo: str = ""        # HLO text of its first compiled specialisation
    specialized: str = ""  # "static" or "per run-time shape"
    kernels: list = field(default_factory=list)     # (name, generated source)
    fusion: list = field(default_factory=list)      # (producer, consumer, "fused" or reason)
    in_place: int = 0    # outputs written over a donated input (variable updates in place)
    race: str = ""       # how it fared against TensorFlow on its first calls ("" if no race)


class Explanation:
    """How a step is split and compiled; str() summarises it (with `verbose`,
    each compiled cluster's fusion and in-place updates too)."""

    def __init__(self, name, program, verbose=False):
        self.name, self.verbose = name, verbose
        self.clusters = []
        for c in program.clusters:
            module = c.specializer.module if c.specializer else None
            executable = next(iter(c.specializer.cache.values()), None) if c.specializer else None
            compiled = getattr(executable, "program", None)
            self.clusters.append(ClusterInfo(
                c.kind, [op for _, op in c.ops], c.reason,
                print_module(module, elide_constants_over=16) if module else "",
                "" if c.kind != "compiled" else
                "static" if module else "per run-time shape (none compiled yet)",
                list(getattr(executable, "kernels", [])),
                list(compiled.decisions) if compiled else [],
                len(getattr(compiled, "aliases", {})), str(c.race) if c.race else ""))

    @property
    def kernels(self):
        """(name, source) of every generated kernel (none on the reference backend)."""
        return [k for c in self.clusters for k in c.kernels]

    @property
    def hlo(self):
        return "\n".join(c.hlo for c in self.clusters if c.hlo)

    def __str__(self):
        compiled = sum(len(c.ops) for c in self.clusters if c.kind == "compiled")
        total = sum(len(c.ops) for c in self.clusters)
        fallbacks = sum(c.kind != "compiled" for c in self.clusters)
        lines = [f"kerasjit: {self.name}: {compiled} of {total} ops run compiled "
                 f"({100 * compiled / max(total, 1):.0f}%), in "
                 f"{sum(c.kind == 'compiled' for c in self.clusters)} compiled cluster(s)"
                 + (f"; {fallbacks} part(s) in TensorFlow, each with why" if fallbacks else "")]
        for i, c in enumerate(self.clusters):
            ops = ", ".join(c.ops[:8]) + (f", ... ({len(c.ops)} ops)" if len(c.ops) > 8 else "")
            if c.kind != "compiled":
                lines.append(f"  [{i}] TensorFlow: {ops}\n        why: {c.reason}")
                continue
            lines.append(f"  [{i}] compiled ({c.specialized}): {ops}")
            if c.race:
                lines.append(f"        race against TensorFlow: {c.race}")
            if self.verbose:
                lines += self._details(c)
        return "\n".join(lines)

    @staticmethod
    def _details(c):
        """The compiler's account of a compiled cluster."""
        lines = []
        if c.fusion:
            fused = sum(why == "fused" for _, _, why in c.fusion)
            reasons = Counter(why for _, _, why in c.fusion if why != "fused")
            kept = "; ".join(f"{n}x {why}" for why, n in reasons.most_common(4))
            lines.append(f"        fusion: {fused} of {len(c.fusion)} producer->consumer "
                         f"edges fused, {len(c.kernels) - 1} kernels"
                         + (f"; unfused: {kept}" if kept else ""))
        if c.in_place:
            lines.append(f"        {c.in_place} variable update(s) written in place")
        return lines

    __repr__ = __str__


def explain(model_or_fn, *example_inputs, backend="auto", verbose=False):
    """Explain how a model's train step (or a function) is split and compiled.

    For a model, `example_inputs` are (x, y[, sample_weight]) of one batch;
    for a function, its arguments. `verbose`: str() adds the compiler's
    account of each compiled cluster (fusion decisions, in-place updates).
    """
    if isinstance(model_or_fn, keras.Model):
        model = model_or_fn
        if not example_inputs:      # (else Keras's train step fails on an empty batch)
            raise TypeError(f"kerasjit.explain({model.name}) needs a batch to trace the "
                            "train step with: explain(model, x, y[, sample_weight])")
        state = getattr(model, "_kerasjit", None)
        strategy = strategy_of(model)
        step = state.train if state else CompiledStep(
            replicated(model.train_step, strategy, "auto"), backend, "train_step")
        # As fit feeds them: floating-point arrays (of several inputs too) cast to
        # Keras's float type.
        def as_fed(a):
            return np.asarray(a, keras.backend.floatx()) \
                if a is not None and np.asarray(a).dtype.kind == "f" else a
        batch = tuple(keras.tree.map_structure(as_fed, a) for a in example_inputs)
        program = step.program_for(*split_batch(batch, strategy))
        return Explanation(f"{model.name}.train_step", program, verbose)
    step = model_or_fn if isinstance(model_or_fn, CompiledStep) else \
        CompiledStep(model_or_fn, backend)
    program = step.program_for(*example_inputs)
    return Explanation(step.name, program, verbose)
