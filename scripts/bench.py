#!/usr/bin/env python3
"""scripts/bench.py: `dashgen bench` from a checkout (PYTHONPATH=. python3 scripts/bench.py ...);
time_kernels.py and overhead.py import its timing from here."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashgen.tools.bench import main, median_ms  # noqa: E402

__all__ = ["main", "median_ms"]

if __name__ == "__main__":
    sys.exit(main())
