"""The GPU backend: the kernel IR rendered as CUDA C (a runtime to launch it comes later)."""
