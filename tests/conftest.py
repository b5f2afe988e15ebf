"""Shared fixtures: the installed libtag, victim programs built once per session,
and runners for victims and for the ``forensics`` command.

Tests import the INSTALLED forensics (pip install '.[test]'), never the work
tree: pytest runs with --import-mode=importlib and the CLI runs with its cwd
in a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pytest

from forensics import libpath

VICTIMS = Path(__file__).resolve().parent / "victims"


def _register_helpers() -> None:
    """Make tests/support.py importable as ``forensics_test_support``,
    tests/fakes.py as ``forensics_test_fakes`` and tests/browser.py as
    ``forensics_test_browser``: pytest's importlib mode puts
    no test folder on sys.path, and this conftest is imported before any test
    module."""
    import importlib.util

    for name, file in (("forensics_test_support", "support.py"), ("forensics_test_fakes", "fakes.py"),
                       ("forensics_test_browser", "browser.py")):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)


_register_helpers()

# Guarded sampling (LIBTAG_GUARD_RATE) is on by default and picks its blocks
# at random: a block a test misuses on purpose would, once in a few thousand
# runs, be a guarded one and fault instead of being found where the test
# looks.  Every program the tests start inherits rate 0 from here; the tests
# of guarded sampling set the rate they need themselves.
os.environ["LIBTAG_GUARD_RATE"] = "0"

# A victim that hangs must fail its test, not the whole run.
DEFAULT_TIMEOUT = 60


@pytest.fixture(scope="session")
def libtag_so() -> Path:
    """The libtag.so that forensics itself would preload."""
    return libpath.lib_path()


@pytest.fixture(scope="session")
def libtag_include() -> Path:
    """The packaged C headers (tag_abi.h ...)."""
    return libpath.include_dir()


@pytest.fixture(scope="session")
def build_victim(tmp_path_factory) -> Callable[..., Path]:
    """build(name, *, instrument=True, static_libtag=False, cxx=False, extra_flags=()) -> Path

    Compiles tests/victims/<name>.c (or .cc when cxx) once per session for each
    distinct set of options, with ``gcc -g -O1 -pthread -fno-omit-frame-pointer``
    (+ ``-finstrument-functions`` when instrument).  ``extra_flags`` come last,
    so e.g. ``-fomit-frame-pointer`` or ``-O2`` there wins.  static_libtag links
    the packaged libtag.a into the program (no LD_PRELOAD needed then).
    """
    out_dir = tmp_path_factory.mktemp("victims")
    built: dict[tuple, Path] = {}

    def build(name: str, *, instrument: bool = True, static_libtag: bool = False,
              cxx: bool = False, extra_flags: Sequence[str] = ()) -> Path:
        key = (name, instrument, static_libtag, cxx, tuple(extra_flags))
        if key in built:
            return built[key]
        source = VICTIMS / f"{name}.{'cc' if cxx else 'c'}"
        if not source.is_file():
            raise FileNotFoundError(f"no victim source {source}")
        suffix = "".join([
            "-i" if instrument else "-p",
            "-static" if static_libtag else "",
            f"-{len(built)}" if extra_flags else "",
        ])
        binary = out_dir / f"{name}{suffix}"
        cmd = ["g++" if cxx else "gcc", "-g", "-O1", "-pthread", "-fno-omit-frame-pointer"]
        if instrument:
            cmd.append("-finstrument-functions")
        cmd += [f"-I{libpath.include_dir()}", *extra_flags, "-o", str(binary), str(source)]
        if static_libtag:
            # whole-archive: every libtag object (constructors, signal hooks,
            # the trace hooks) is linked, not only those the victim names.
            cmd += ["-Wl,--whole-archive", str(libpath.static_lib_path()),
                    "-Wl,--no-whole-archive", "-ldl", "-pthread"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.fail(
                f"building victim {name} failed (exit {result.returncode}):\n"
                f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr}",
                pytrace=False,
            )
        built[key] = binary
        return binary

    return build


def _run_victim(binary: os.PathLike | str, *args: str, preload: bool = True,
                env: Mapping[str, str] | None = None, snap_dir: os.PathLike | str | None = None,
                on_anomaly: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                cwd: os.PathLike | str | None = None, input: str | None = None,
                ) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    if preload:
        existing = full_env.get("LD_PRELOAD", "")
        full_env["LD_PRELOAD"] = f"{libpath.lib_path()} {existing}".strip()
    if snap_dir is not None:
        full_env["LIBTAG_DIR"] = str(snap_dir)
    if on_anomaly is not None:
        full_env["LIBTAG_ON_ANOMALY"] = on_anomaly
    return subprocess.run(
        [str(binary), *map(str, args)], env=full_env, cwd=cwd, input=input,
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="session")
def run_victim() -> Callable[..., subprocess.CompletedProcess]:
    """run(binary, *args, preload=True, env=None, snap_dir=None, on_anomaly=None,
    timeout=60, cwd=None, input=None) -> CompletedProcess (text, captured)

    Runs a built victim with LD_PRELOAD of the packaged libtag (preload=False
    for a victim built with static_libtag).  A hang raises TimeoutExpired.
    """
    return _run_victim


@pytest.fixture
def run_cli(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """cli(*args, env=None, cwd=None, timeout=60) -> CompletedProcess

    Runs ``python -m forensics ARGS`` with its cwd in a temporary folder (not
    the repo root, so the installed package is the one imported).
    """
    def cli(*args: str, env: Mapping[str, str] | None = None,
            cwd: os.PathLike | str | None = None, timeout: float = DEFAULT_TIMEOUT,
            ) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        full_env.pop("PYTHONPATH", None)
        return subprocess.run(
            [sys.executable, "-m", "forensics", *map(str, args)],
            env=full_env, cwd=cwd if cwd is not None else tmp_path,
            capture_output=True, text=True, timeout=timeout,
        )

    return cli
