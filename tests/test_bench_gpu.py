"""bench/gpu.sh's Python part runs end to end on a CPU (no GPU in CI): the script a lent GPU will run cannot rot, and
its decoders agree token for token in both dtypes the engine uses."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_gpu_bench_runs_on_cpu(dtype):
    out = subprocess.run([sys.executable, "-m", "bench.gpu", "--device", "cpu", "--target", "tiny", "--quick",
                          "--dtype", dtype, "--batches", "1", "8"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| t(K) ms |" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 8 |")]
    assert len(rows) == 2
    assert rows[0].endswith("| 4/4 |") and rows[1].endswith("| 8/8 |")  # EAGLE-3 output identical to vanilla
