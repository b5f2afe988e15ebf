"""forensics snapshot PID on Debian's nginx and PostgreSQL, preloaded with
libtag as a user starts them, on loopback with a bounded load.

nginx's workers run as nobody (they cannot enter root's snapshot directory)
and its master owns SIGUSR2 (binary upgrade); PostgreSQL owns SIGUSR2 too,
and both write their process titles over their environment.  The tests
start and stop the servers themselves; each one times out by itself.

GIVEN / WHEN / THEN.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from forensics import libpath

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PG_BIN = Path("/usr/lib/postgresql/15/bin")

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the servers start as root and drop to their users")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exported(exe: str, name: str) -> int:
    """st_value of a dynamic symbol of exe (nginx and postgres export theirs
    for their modules and extensions)."""
    from elftools.elf.elffile import ELFFile

    with open(exe, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        (sym,) = dynsym.get_symbol_by_name(name)
        return int(sym["st_value"])


def _read_global(pid: int, exe: str, name: str) -> int:
    """The pointer held by global *name* of *exe* in process *pid*, now."""
    from forensics.reader.live import read_maps

    base = min(m.start - m.offset for m in read_maps(pid)
               if m.path == exe and m.offset == 0)
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        mem.seek(base + _exported(exe, name))
        return int.from_bytes(mem.read(8), "little")


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _stop(proc: subprocess.Popen, sig: int, timeout: float) -> None:
    """Stop a server the way its manual says (sig), killing it after timeout s."""
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)


def _children(pid: int) -> list[int]:
    import psutil

    return sorted(c.pid for c in psutil.Process(pid).children())


# ------------------------------------------------------------------ nginx --

@pytest.fixture
def nginx(tmp_path):
    """Debian's nginx preloaded with libtag: (master, workers, port, snapshot dir, root)."""
    yield from _nginx(tmp_path, preload=True)


@pytest.fixture
def plain_nginx(tmp_path):
    """The same nginx started without libtag."""
    yield from _nginx(tmp_path, preload=False)


def _nginx(tmp_path, *, preload: bool):
    if not os.access(NGINX, os.X_OK):
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx)")
    port = _free_port()
    root = tmp_path / "nginx"
    root.mkdir()
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)  # root's: the workers (nobody) cannot enter it
    conf = root / "nginx.conf"
    conf.write_text(f"""
user nobody nogroup;
worker_processes 2;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {root}/body; proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi; uwsgi_temp_path {root}/uwsgi; scgi_temp_path {root}/scgi;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "hello\\n"; }} }}
}}
""")
    env = dict(os.environ, LD_PRELOAD=str(libpath.lib_path()), LIBTAG_DIR=str(snaps))
    if not preload:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(root)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = _wait(lambda: len(_children(proc.pid)) == 2 and _children(proc.pid), 30,
                        "nginx's two workers")
        _wait(lambda: _get(port) == "hello\n", 30, "nginx to answer")
        yield proc, workers, port, snaps, root
    finally:
        _stop(proc, signal.SIGQUIT, 30)  # graceful stop


def _get(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


def test_nginx_worker_snapshot_names_the_cycle_pool(nginx, run_cli, tmp_path):
    # GIVEN Debian's nginx under libtag, workers as nobody, serving a bounded load
    proc, workers, port, snaps, root = nginx
    answers = [_get(port) for _ in range(100)]
    assert answers == ["hello\n"] * 100
    worker = workers[0]
    cycle = _read_global(worker, NGINX, "ngx_cycle")
    state = tmp_path / "state"
    # WHEN forensics snapshot <worker pid>, with no flags
    result = run_cli("snapshot", worker, "--json", "--timeout", "60",
                     env={"XDG_STATE_HOME": str(state)})
    # THEN the core was handed over (the worker cannot write root's directory)
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert doc["handed_over"] is True and doc["pid"] == worker, doc
    assert [_get(port) for _ in range(100)] == ["hello\n"] * 100, "nginx stopped serving"
    # ... and whoowns ngx_cycle finds the cycle inside its pool: 16384 bytes made
    # by the master in ngx_init_cycle before it forked the worker
    who = run_cli("whoowns", hex(cycle), "--core", doc["core"], "--json",
                  env={"XDG_STATE_HOME": str(state)})
    assert who.returncode == 0, who.stderr
    ans = json.loads(who.stdout)
    block = ans["block"]
    assert ans["owner"] == "heap" and block["state"] == "live", ans
    assert block["size"] == 16384 and block["thread"] == proc.pid, block
    functions = [f["function"] for f in block["alloc_stack"]]
    assert functions[:4] == ["ngx_memalign", "ngx_create_pool", "ngx_init_cycle", "main"], \
        functions
    assert any(r["symbol"] == "ngx_cycle" for r in ans["referrers"]), ans["referrers"][:5]


def test_nginx_master_and_workers_with_children(nginx, run_cli, tmp_path):
    # GIVEN the same nginx; its master owns SIGUSR2 (binary upgrade)
    proc, workers, port, snaps, root = nginx
    # WHEN forensics snapshot <master> --children
    result = run_cli("snapshot", proc.pid, "--children", "--json", "--timeout", "60",
                     env={"XDG_STATE_HOME": str(tmp_path / "state")})
    # THEN one core each: the master's in its own directory, the workers' handed over
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    docs = json.loads(result.stdout)
    assert sorted(d["pid"] for d in docs) == sorted([proc.pid, *workers]), docs
    by_pid = {d["pid"]: d for d in docs}
    assert by_pid[proc.pid]["handed_over"] is False
    assert Path(by_pid[proc.pid]["core"]).parent.parent == snaps
    assert all(by_pid[w]["handed_over"] for w in workers), docs
    assert all(Path(d["core"]).is_file() for d in docs)
    assert [_get(port) for _ in range(20)] == ["hello\n"] * 20
    # ... and nginx never saw a signal of its own: no binary-upgrade attempt
    log = (root / "error.log").read_text()
    assert "changing binary" not in log and "[crit]" not in log and "[alert]" not in log, log


def test_nginx_without_libtag_worker_snapshot_by_ptrace(plain_nginx, run_cli, tmp_path):
    # GIVEN Debian's nginx started WITHOUT libtag, workers as nobody, serving
    proc, workers, port, snaps, root = plain_nginx
    assert [_get(port) for _ in range(100)] == ["hello\n"] * 100
    worker = workers[0]
    cycle = _read_global(worker, NGINX, "ngx_cycle")
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    # WHEN forensics snapshot <worker pid>, with no flags
    result = run_cli("snapshot", worker, "--json", env=env)
    # THEN it was forked by ptrace, and nginx serves on as if nothing happened
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["method"] == "ptrace" and doc["pid"] == worker and doc["threads_stopped"] == 1, doc
    assert [_get(port) for _ in range(100)] == ["hello\n"] * 100, "nginx stopped serving"
    assert _children(proc.pid) == workers and _children(worker) == []
    # ... whoowns ngx_cycle: the glibc chunk of the cycle's pool (16384 bytes,
    # made by the master before it forked the worker), named by the global
    who = run_cli("whoowns", hex(cycle), "--core", doc["core"], "--json", env=env)
    assert who.returncode == 0, who.stderr
    ans = json.loads(who.stdout)
    assert ans["owner"] == "heap" and ans["libtag"] is False, ans
    assert ans["chunk"]["state"] == "inuse" and ans["chunk"]["usable"] >= 16384, ans["chunk"]
    assert any(r["symbol"] == "ngx_cycle" for r in ans["referrers"]), ans["referrers"][:5]
    # ... inspect answers with the worker's one thread in its event loop
    ins = run_cli("inspect", doc["core"], "--json", env=env)
    assert ins.returncode == 0, ins.stderr
    idoc = json.loads(ins.stdout)
    assert [t["tid"] for t in idoc["threads"]] == [worker]
    frames = [f["function"] for f in idoc["threads"][0]["stack"]]
    assert frames[0] == "epoll_wait" and "ngx_process_events_and_timers" in frames, frames
    log = (root / "error.log").read_text()
    assert "[crit]" not in log and "[alert]" not in log and "[emerg]" not in log, log
    assert "exited on signal" not in log, log


# ------------------------------------------------------------- PostgreSQL --

@pytest.fixture
def postgres():
    if not (PG_BIN / "postgres").is_file():
        pytest.skip("PostgreSQL 15 is not installed (.ci/run installs Debian's postgresql-15)")
    import pwd

    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user")
    # the server runs as postgres: its files outside pytest's 0700 tmp dir
    base = Path(tempfile.mkdtemp(prefix="forensics-pg-", dir="/tmp"))
    os.chown(base, pw.pw_uid, pw.pw_gid)
    port = _free_port()
    as_pg = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd=base)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base)}
    try:
        subprocess.run([PG_BIN / "initdb", "-D", base / "data", "-U", "postgres",
                        "--auth=trust", "--no-sync"], env=env, check=True, timeout=120,
                       capture_output=True, **as_pg)
        (base / "sock").mkdir(mode=0o700)
        (base / "snaps").mkdir(mode=0o700)
        for d in ("sock", "snaps"):
            os.chown(base / d, pw.pw_uid, pw.pw_gid)
        # a copy postgres can read (the installed one may be under root's 0700 home)
        lib = base / "libtag.so"
        shutil.copy(libpath.lib_path(), lib)
        os.chmod(lib, 0o755)
        srv_env = dict(env, LD_PRELOAD=str(lib), LIBTAG_DIR=str(base / "snaps"))
        proc = subprocess.Popen([PG_BIN / "postgres", "-D", base / "data", "-k", base / "sock",
                                 "-c", "listen_addresses=127.0.0.1", "-p", str(port),
                                 "-c", "shared_buffers=16MB", "-c", "fsync=off"],
                                env=srv_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, **as_pg)
        try:
            pg = [PG_BIN / "psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                  "-At", "postgres"]
            _wait(lambda: subprocess.run([*pg, "-c", "select 1"], env=env, capture_output=True,
                                         timeout=30, **as_pg).returncode == 0,
                  60, "PostgreSQL to accept connections")
            yield proc, port, base, env, as_pg, pg
        finally:
            _stop(proc, signal.SIGINT, 60)  # fast shutdown
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_postgres_backend_snapshot_names_the_cache_memory_context(postgres, run_cli, tmp_path):
    # GIVEN PostgreSQL under libtag, one backend held open in a session, a
    # bounded pgbench load beside it
    proc, port, base, env, as_pg, pg = postgres
    bench = [PG_BIN / "pgbench", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    subprocess.run([*bench, "-i", "-s", "1", "-q", "postgres"], env=env, check=True,
                   capture_output=True, timeout=120, **as_pg)
    session = subprocess.Popen(pg, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, **as_pg)
    load = None
    try:
        session.stdin.write("select pg_backend_pid();\n")
        session.stdin.flush()
        backend = int(session.stdout.readline())
        session.stdin.write("select count(*) from pgbench_accounts;\n")  # fills the caches
        session.stdin.flush()
        assert session.stdout.readline().strip() == "100000"
        load = subprocess.Popen([*bench, "-c", "2", "-t", "300", "postgres"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                **as_pg)
        context = _read_global(backend, str(PG_BIN / "postgres"), "CacheMemoryContext")
        # WHEN forensics snapshot <backend pid>, with no flags
        result = run_cli("snapshot", backend, "--json", "--timeout", "60",
                         env={"XDG_STATE_HOME": str(tmp_path / "state")})
        bench_out, _ = load.communicate(timeout=300)
        session.stdin.write("select 42;\n")
        session.stdin.flush()
        still = session.stdout.readline().strip()
    finally:
        session.communicate(input="", timeout=60) if session.poll() is None else None
        if load is not None and load.poll() is None:
            load.kill()
    # THEN the backend wrote its core in its own LIBTAG_DIR, found in its memory
    # (its environment holds its title now), asked on libtag's own signal
    assert result.returncode == 0, f"expected exit 0, got {result.returncode}: {result.stderr}"
    doc = json.loads(result.stdout)
    assert doc["handed_over"] is False and doc["pid"] == backend, doc
    assert Path(doc["core"]).parent.parent == base / "snaps", doc["core"]
    assert still == "42", "expected the session to run on"
    assert load.returncode == 0, bench_out
    # ... and whoowns CacheMemoryContext names its block and where it was made
    who = run_cli("whoowns", hex(context), "--core", doc["core"], "--json",
                  env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert who.returncode == 0, who.stderr
    ans = json.loads(who.stdout)
    block = ans["block"]
    assert ans["owner"] == "heap" and block["state"] == "live" and block["offset"] == 0, ans
    assert block["thread"] == backend, block
    functions = [f["function"] for f in block["alloc_stack"]]
    assert functions[:3] == ["AllocSetContextCreateInternal", "CreateCacheMemoryContext",
                             "RelationCacheInitialize"], functions
    assert "PostgresMain" in functions, functions
