"""From kernel variant to cubin: the typed variants, Jinja rendering, NVRTC compilation and the
disk cache of cubins, and `emit` (sources, task tables and ptxas figures on disk). No torch."""
