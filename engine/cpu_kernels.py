"""Parley's own CPU kernels, `torch.ops.parley.int8_linear` and `torch.ops.parley.stack_step`
(engine/csrc/int8_linear.cpp).

One stream steps the STT model one frame at a time, so its products are matrix-vector
products with int8 weights. torch's `_weight_int8pack_mm` is tuned for AVX-512: on an
AVX2-only CPU it converts bf16 in software and spent 1.2 of the frame's ~2 ms there. The
kernel here widens the int8 weights to fp32 in AVX2 registers instead and keeps the
activations fp32 (no bf16 rounding).

It is compiled with g++ against the installed torch the first time a process needs it (about
15 s; `make` does it at install, `python -m engine.cpu_kernels` by hand) and cached under
$PARLEY_KERNEL_DIR (default ~/.cache/parley/kernels), one file per source, flags and torch
version. Where it cannot be used (no AVX2, no compiler, PARLEY_INT8_KERNEL=torch) the engine
uses torch's kernel instead, with the same int8 weights.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional

import torch

SOURCE = Path(__file__).parent / "csrc" / "int8_linear.cpp"
FLAGS = ("-O3", "-mavx2", "-mfma", "-std=c++20", "-shared", "-fPIC", "-w")
KERNEL_CHOICE_VARIABLE = "PARLEY_INT8_KERNEL"  # "torch" turns the kernel off


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "parley" / "kernels"
    return Path(os.environ.get("PARLEY_KERNEL_DIR", default))


def library_path() -> Path:
    """Where this source, these flags and this torch build compile to."""
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(" ".join(FLAGS).encode() + torch.__version__.encode() + sys.version.encode())
    return cache_dir() / f"parley_kernels-{key.hexdigest()[:16]}.so"


def unavailable_reason() -> Optional[str]:
    """Why this machine cannot run the kernel, or None when it can."""
    if os.environ.get(KERNEL_CHOICE_VARIABLE, "").lower() == "torch":
        return f"{KERNEL_CHOICE_VARIABLE}=torch"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is x86 code and this is {platform.machine()}"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "this CPU has no AVX2"
    return None


def compile_library(target: Path) -> None:
    """g++ the source into target (atomically: processes starting together may race)."""
    from torch.utils import cpp_extension

    target.parent.mkdir(parents=True, exist_ok=True)
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [os.environ.get("CXX", "g++"), *FLAGS, abi,
                   *(f"-I{path}" for path in cpp_extension.include_paths()), str(SOURCE), "-o", str(built),
                   *(f"-L{path}" for path in cpp_extension.library_paths()), "-lc10", "-ltorch_cpu"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{result.stderr[-2000:]}")
        os.replace(built, target)


@functools.cache
def load() -> bool:
    """Whether torch.ops.parley.int8_linear is usable in this process (compiling it if needed)."""
    reason = unavailable_reason()
    if reason is not None:
        return False
    try:
        target = library_path()
        if not target.exists():
            compile_library(target)
        torch.ops.load_library(str(target))
        return True
    except Exception as error:  # noqa: BLE001 - a kernel that cannot be built leaves torch's in use
        warnings.warn(f"Parley's int8 CPU kernel is unavailable, using torch's: {error}", RuntimeWarning)
        return False


def main() -> None:
    """Build (if needed) and report: `python -m engine.cpu_kernels`."""
    reason = unavailable_reason()
    if reason is not None:
        print(f"parley int8 kernel: not used ({reason}); torch's kernel serves")
        return
    print(f"parley int8 kernel: {'ready' if load() else 'FAILED, torch kernel serves'} ({library_path()})")


if __name__ == "__main__":
    main()
