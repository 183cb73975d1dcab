"""Measuring instruments around the kernels: the benchmark and its report, the kernel model and
its calibration, dQ hand-off analysis of traces, and the PTX probes."""
