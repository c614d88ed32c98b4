"""Every own C++ kernel compiles at every vector width it may be built for, whatever this machine's width: a kernel
that fails to build falls back quietly to a slower path (a warning), so a change tried on an AVX2 machine once broke
the AVX-512 build of the attention kernel and no test run on that machine could see it. A syntax and semantics pass
(`-fsyntax-only`) with each width's flags needs only the compiler, not a CPU that runs the code."""
import os
import platform
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils.cpp_extension import include_paths

from eagle3 import amx, argmax, attention, vnni

CXX = shutil.which(os.environ.get("CXX", "c++"))
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler: the engine's kernels cannot build here at all")


def builds():
    """(name, source, flags) for each kernel at each width attention.build may pick for it (x86 widths on x86 only:
    elsewhere the generic build is the one that can run)."""
    widths = attention.WIDTHS
    out = [(f"attention-{w}", attention.SOURCE, f) for w, (_, f) in widths.items()]
    out += [(f"argmax-{w}", argmax.SOURCE, f) for w, (_, f) in widths.items()]
    if platform.machine() not in ("x86_64", "AMD64"):
        return [b for b in out if b[0].endswith("-base")]
    for name, (source, extra, needs) in vnni.KERNELS.items():  # built only where the CPU has `needs`
        out += [(f"{name}-{w}", source, f + extra) for w, (have, f) in widths.items()
                if w != "base" and (name != "vnni" or w == "avx512")]
    out.append(("amx", amx.SOURCE, amx.FLAGS))
    return out


def syntax_check(source, flags):
    cmd = [CXX, "-fsyntax-only", "-std=c++20", "-fopenmp", "-DTORCH_EXTENSION_NAME=check",
           f"-I{sysconfig.get_paths()['include']}", *(f"-I{p}" for p in include_paths()), *flags, str(source)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_every_kernel_compiles_at_every_width():
    jobs = builds()
    assert len(jobs) >= (9 if platform.machine() in ("x86_64", "AMD64") else 2)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: syntax_check(j[1], j[2]), jobs))
    failed = {name: r.stderr[-2000:] for (name, _, _), r in zip(jobs, results) if r.returncode}
    assert not failed, failed
