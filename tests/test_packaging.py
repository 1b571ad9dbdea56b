"""How bertkit is installed: kernels/ and pipelines/ ship as bertkit.kernels and bertkit.pipelines, so nothing
takes the top-level names `kernels` (HF's package on PyPI) or `pipelines`."""
import subprocess
import sys

CHECK = """
import importlib.metadata, importlib.util
from transformers.utils.import_utils import is_kernels_available
import bertkit.kernels, bertkit.pipelines.prepare_corpus
assert importlib.util.find_spec("kernels") is None, importlib.util.find_spec("kernels")
assert importlib.util.find_spec("pipelines") is None, importlib.util.find_spec("pipelines")
assert not is_kernels_available()
owners = importlib.metadata.packages_distributions()
assert "bertkit" not in owners.get("kernels", []) + owners.get("pipelines", []), owners
print(bertkit.kernels.__name__, bertkit.pipelines.prepare_corpus.__name__)
"""


def test_no_top_level_kernels_or_pipelines_package(tmp_path):
    # run outside the checkout, as a user's script would: the repository root is then not on sys.path
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bertkit.kernels", "bertkit.pipelines.prepare_corpus"]
