"""numpy for the reader, imported with its BLAS on one thread.

numpy's wheels bundle OpenBLAS, whose library starts a thread per CPU as
numpy is imported: threads that spin a while, on every ``forensics``
command, for linear algebra forensics never does (~0.1 s of a command's
start-up on a 2-CPU machine, and a thread per CPU on a server of 128).
OPENBLAS_NUM_THREADS is read once, as the library loads: it is set to 1
for the import only and then put back as it was, so nothing forensics
starts (the program of ``forensics run``, gdb) sees it.  Every module of
the package imports numpy from here.
"""

import os

_VAR = "OPENBLAS_NUM_THREADS"
_was = os.environ.get(_VAR)
os.environ[_VAR] = "1"
try:
    import numpy as np
finally:
    if _was is None:
        del os.environ[_VAR]
    else:
        os.environ[_VAR] = _was

__all__ = ["np"]
