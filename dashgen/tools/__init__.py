"""What the command line runs beside show/plan/verify: emit (kernel sources, task tables and
ptxas figures on disk, and the golden renders), the benchmark with its timing and report, the
kernel model `plan --kernel-model` runs, and the PTX probes the compile tests build. The
measuring beyond `dashgen bench` (calibration, trace analysis, tree comparisons) is a checkout's
lab/, which nothing here imports."""
