"""Running the kernels from PyTorch: the selection of kernels and schedule for a problem, the
plans and workspace, the driver launches, the forward and backward calls and the torch op.
Importing this package loads neither torch nor the driver; its modules below do."""
