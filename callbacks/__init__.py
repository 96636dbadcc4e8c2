"""Measurement and reporting for kerasjit runs (installed as `kerasjit.callbacks`).

Imports nothing of the compiler, so it measures plain Keras exactly as it
measures a wrapped model.
"""
from .profiler import COLUMNS, JitProfiler
from .report import speedup_report

__all__ = ["JitProfiler", "speedup_report", "COLUMNS"]
