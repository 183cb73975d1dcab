"""From kernel variant to cubin: the typed variants, Jinja rendering, NVRTC compilation and the
disk cache of cubins. No torch."""
