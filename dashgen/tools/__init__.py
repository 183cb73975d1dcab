"""What the command line runs beside show/plan/verify: emit (kernel sources, task tables and
ptxas figures on disk, and the golden renders), the benchmark and its report, the kernel model
and its calibration, dQ hand-off analysis of traces, and the PTX probes."""
