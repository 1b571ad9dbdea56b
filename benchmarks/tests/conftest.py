"""The benchmarks' own tests (their tables, their peers' loops, their refusals without a GPU): the benchmark library
(benchmarks/lib), the gates and the studies are importable by name, as a script imports the library when run."""
import os
import sys
from pathlib import Path

for folder in ("lib", "gates", "studies"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))
os.environ["BERTKIT_CPU_BF16_UNITS"] = "0"  # as tests/conftest.py: the same numbers on any CI machine
