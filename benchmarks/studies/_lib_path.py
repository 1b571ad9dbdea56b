"""A script run as `python benchmarks/<folder>/NAME.py` has only its own folder on the import path; importing this
puts the benchmark library's folder there too (benchmarks/lib: record, benchlib, gpulib, the peers)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
