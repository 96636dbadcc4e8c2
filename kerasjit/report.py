"""`kerasjit.report.speedup_report(runs, path)`: the public name of the HTML speedup report.

The implementation lives in `kerasjit.callbacks.report` (measurement and
reporting import nothing of the compiler).
"""
from .callbacks.report import speedup_report

__all__ = ["speedup_report"]
