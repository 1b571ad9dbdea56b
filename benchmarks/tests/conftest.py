"""The benchmarks' own tests (their tables, their peers' loops, their refusals without a GPU): the scripts are
modules of the folder above, importable by name as they import each other when run."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["BERTKIT_CPU_BF16_UNITS"] = "0"  # as tests/conftest.py: the same numbers on any CI machine
