# forensics_gdb.py - load forensics' `tag` commands into gdb.
#
#     (gdb) source /path/to/site-packages/forensics/gdb/forensics_gdb.py
#
# or, once for good, the line `python3 -m forensics.gdb` prints, in ~/.gdbinit:
#
#     python3 -m forensics.gdb >> ~/.gdbinit
#
# gdb embeds its own Python (Debian 12's gdb 13: /usr/bin/python3, 3.11.2),
# which need not be the Python forensics was installed with (a venv, pyenv,
# ~/.local).  So this loader finds the installed package and puts its
# directories on gdb's sys.path, in this order:
#
#   1. $FORENSICS_PYTHON, when set: that interpreter is asked for its sys.path;
#   2. this file's own place, when it is the copy inside the installed package
#      (<site-packages>/forensics/gdb/forensics_gdb.py);
#   3. forensics already importable in gdb's Python;
#   4. `python3` on PATH, asked for its sys.path.
#
# Compiled dependencies (numpy) only load into the same Python minor version:
# when the interpreter that has forensics is another version than gdb's, this
# says so instead of failing on a confusing import error.
#
# gdb_scripts/forensics_gdb.py in a source checkout is a link to this file;
# the checkout's forensics/ is never imported (it has no built libtag): only
# an installed package is.  All logic lives in forensics.gdb.commands and below.


def _forensics_gdb_load():
    import json  # in the loader: gdb sources this file into its __main__, which keeps none of its names
    import os  # in the loader (as json)
    import shutil  # in the loader (as json)
    import subprocess  # in the loader (as json)
    import sys  # in the loader (as json)

    def purge():
        for name in [m for m in sys.modules if m == "forensics" or m.startswith("forensics.")]:
            del sys.modules[name]

    def add(paths):
        """Put paths on sys.path ahead of gdb's own site/dist-packages (so the
        installed numpy wins over an older system one), after its stdlib."""
        paths = [p for p in paths if p and os.path.isdir(p)]
        pos = next((i for i, p in enumerate(sys.path)
                    if p.rstrip("/").endswith(("site-packages", "dist-packages"))), len(sys.path))
        for p in reversed(paths):
            if p in sys.path:
                sys.path.remove(p)
                pos = min(pos, len(sys.path))
            sys.path.insert(pos, p)

    def ask(python):
        """sys.path and version of an interpreter that can import forensics."""
        code = ("import json, os, sys, forensics; print(json.dumps({'path': sys.path, "
                "'version': list(sys.version_info[:2]), 'pkg': os.path.dirname(forensics.__file__)}))")
        try:
            out = subprocess.run([python, "-c", code], check=False, capture_output=True, text=True,
                                 timeout=30, cwd="/", env={**os.environ, "PYTHONPATH": ""})
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{python}: {exc}"
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"{python} cannot import forensics ({last})"
        return json.loads(out.stdout), None

    def try_import():
        try:
            import forensics.gdb.commands  # noqa: F401
        except ImportError as exc:
            purge()
            return f"{exc}"
        return None

    here = os.path.dirname(os.path.abspath(__file__))
    problems = []
    mine = sys.version_info[:2]

    interpreters = []
    if os.environ.get("FORENSICS_PYTHON"):
        interpreters.append(os.environ["FORENSICS_PYTHON"])
    else:
        site = os.path.dirname(os.path.dirname(here))
        if os.path.isfile(os.path.join(site, "forensics", "gdb", "commands.py")):
            add([site])
        err = try_import()
        if err is None:
            return sys.modules["forensics.gdb.commands"]
        problems.append(f"gdb's Python {mine[0]}.{mine[1]}: {err}")
        python3 = shutil.which("python3")
        if python3:
            interpreters.append(python3)

    for python in interpreters:
        info, err = ask(python)
        if info is None:
            problems.append(err)
            continue
        if tuple(info["version"]) != mine:
            v = ".".join(map(str, info["version"]))
            problems.append(
                f"{python} is Python {v} but gdb embeds Python {mine[0]}.{mine[1]}: install "
                f"forensics for Python {mine[0]}.{mine[1]} and set FORENSICS_PYTHON to that python")
            continue
        purge()
        add([p for p in info["path"] if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
            + [os.path.dirname(info["pkg"])])
        err = try_import()
        if err is None:
            return sys.modules["forensics.gdb.commands"]
        problems.append(f"{python}'s packages in gdb: {err}")
    raise ImportError("; ".join(problems) or "forensics is not installed")


try:
    _forensics_gdb_load().register()
except ImportError as _exc:
    import gdb as _gdb  # only to say why the commands did not load; deleted after

    _gdb.write(f"forensics: the tag commands are not loaded: {_exc}\n", _gdb.STDERR)
    del _gdb
finally:
    del _forensics_gdb_load
