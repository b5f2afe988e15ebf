"""Debug files by build-id from debuginfod servers (elfutils' protocol), the
last place the symboliser looks, after the local debug directories.

With ``DEBUGINFOD_URLS`` set (servers separated by spaces, as elfutils reads
it), a stripped module's debug file is ``GET URL/buildid/HEX/debuginfo``
from each server in turn, kept where elfutils' own client keeps it - so gdb,
eu-stack and forensics share one cache -
``$DEBUGINFOD_CACHE_PATH/HEX/debuginfo``, else
``$XDG_CACHE_HOME/debuginfod_client/HEX/debuginfo`` (``~/.cache`` by
default); folders 0700, files 0600, written whole or not at all.  A file
is used only when its build-id is the module's.

Never a hang: each request gives up after ``DEBUGINFOD_TIMEOUT`` seconds
without progress (elfutils' default, 90), and a server that cannot be
reached is not asked again by this symboliser (one warning says so; the
frames stay module+0xOFFSET).  Nothing here raises for a server's failure.
"""

from __future__ import annotations

import os

from forensics.files import ensure_private_dir

DEFAULT_TIMEOUT_S = 90.0  # elfutils' DEBUGINFOD_TIMEOUT default
_CHUNK = 1 << 20


def urls() -> list[str]:
    return [u.rstrip("/") for u in os.environ.get("DEBUGINFOD_URLS", "").split() if u]


def cache_dir() -> str:
    given = os.environ.get("DEBUGINFOD_CACHE_PATH")
    if given:
        return given
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "debuginfod_client")


def timeout_s() -> float:
    try:
        value = float(os.environ.get("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


class Client:
    """One symboliser's debuginfod client: asks each server at most until
    it fails to answer, and says so once in warnings."""

    def __init__(self, warnings: list[str]) -> None:
        self.servers = urls()
        self.warnings = warnings
        self._down: set[str] = set()

    def debuginfo(self, build_id: bytes, usable) -> str | None:
        """The path of the debug file of build_id (cached, or fetched now),
        when usable(path) says it is that file; None otherwise."""
        if not self.servers:
            return None
        hexid = build_id.hex()
        folder = os.path.join(cache_dir(), hexid)
        target = os.path.join(folder, "debuginfo")
        if os.path.isfile(target) and not os.path.islink(target) and usable(target):
            return target
        for server in self.servers:
            if server in self._down:
                continue
            got = self._fetch(server, hexid, folder, target)
            if got is not None and usable(got):
                return got
            if got is not None:
                _unlink(got)  # not the module's file: never kept
        return None

    def _fetch(self, server: str, hexid: str, folder: str, target: str) -> str | None:
        # deferred, start-up time: urllib and http.client (with ssl, ~55 ms) only
        # when a server is asked - every symboliser imports this module
        import urllib.error
        import urllib.parse
        import urllib.request

        url = f"{server}/buildid/{hexid}/debuginfo"
        if urllib.parse.urlsplit(url).scheme not in ("http", "https", "file"):
            self._fail(server, "not an http, https or file URL")
            return None
        try:
            response = urllib.request.urlopen(url, timeout=timeout_s())  # noqa: S310 - the user's servers
        except urllib.error.HTTPError as exc:
            exc.close()
            return None  # 404: this server has no such file; the next may
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            self._fail(server, str(getattr(reason, "strerror", None) or reason))
            return None
        tmp = None
        try:
            ensure_private_dir(folder)
            tmp = os.path.join(folder, f".debuginfo.{os.getpid()}.{os.urandom(4).hex()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            with os.fdopen(fd, "wb") as out, response:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
            os.replace(tmp, target)
            return target
        except Exception as exc:  # noqa: BLE001 - a failed download is no answer, never a traceback
            if tmp is not None:
                _unlink(tmp)
            self._fail(server, str(getattr(exc, "strerror", None) or getattr(exc, "message", None)
                                   or exc) or type(exc).__name__)
            return None

    def _fail(self, server: str, why: str) -> None:
        self._down.add(server)
        self.warnings.append(
            f"debuginfod server {server} did not answer ({why}); the frames of modules without "
            f"a local debug file are shown as module+offset")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
