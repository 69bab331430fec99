"""What the zygote's workers find imported: torch, loaded so that the process can
still be forked safely."""

from __future__ import annotations

import os

# Set to 1 while the agent imports torch (and with it numpy's OpenBLAS).
BLAS_THREADS_VAR = "OPENBLAS_NUM_THREADS"


def import_torch_single_threaded() -> None:
    """Import torch's distributed package with OpenBLAS held to one thread.

    numpy, when torch finds it, loads OpenBLAS, which starts a thread per CPU at once,
    and a process with threads cannot be forked safely. OpenBLAS reads its thread count
    from this process's environment when it loads, so the variable is set around the
    import and put back after it; each worker then sets the count its own environment
    gives (forked_worker)."""
    saved = os.environ.get(BLAS_THREADS_VAR)
    os.environ[BLAS_THREADS_VAR] = "1"
    try:
        import torch.distributed.distributed_c10d  # noqa: F401
    finally:
        if saved is None:
            del os.environ[BLAS_THREADS_VAR]
        else:
            os.environ[BLAS_THREADS_VAR] = saved
