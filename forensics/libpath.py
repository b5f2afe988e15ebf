"""Where the libtag library and its headers are.

The wheel ships them inside the package (forensics/_lib/); the environment
variable FORENSICS_LIBTAG points at another libtag.so, e.g. a developer's
``cmake --build build`` output (build/libtag/libtag.so).
"""

from __future__ import annotations

import os
from pathlib import Path

from forensics.errors import InputError

ENV_VAR = "FORENSICS_LIBTAG"

_LIB_DIR = Path(__file__).resolve().parent / "_lib"


def lib_path() -> Path:
    """The libtag.so to preload: $FORENSICS_LIBTAG if set, else the packaged one."""
    override = os.environ.get(ENV_VAR)
    if override:
        path = Path(override).expanduser().absolute()
        if not path.is_file():
            raise InputError(
                f"{ENV_VAR}={override} is not a file; point it at a built "
                f"libtag.so or unset it to use the packaged one"
            )
        return path
    path = _LIB_DIR / "libtag.so"
    if not path.is_file():
        raise InputError(
            f"libtag.so is not installed at {path}; reinstall the package "
            f"(pip install .) or set {ENV_VAR} to a built libtag.so"
        )
    return path


def static_lib_path() -> Path:
    """libtag.a, for linking libtag into a program: the one beside lib_path()."""
    path = lib_path().with_name("libtag.a")
    if not path.is_file():
        raise InputError(
            f"libtag.a is not at {path}; reinstall the package (pip install .)"
        )
    return path


def include_dir() -> Path:
    """The packaged C headers (tag_abi.h ...), for compiling probes and victims."""
    path = _LIB_DIR / "include"
    if not path.is_dir():
        raise InputError(
            f"libtag headers are not installed at {path}; reinstall the package "
            f"(pip install .)"
        )
    return path
