"""Files forensics keeps: the user's state directory, private directories,
and private files written atomically.

``$XDG_STATE_HOME/forensics`` (XDG default ``~/.local/state/forensics``, as
platformdirs reads it) holds the catalog and the symbol cache; snapshots go
to its ``snapshots/`` folder unless ``--dir`` says otherwise.

Cores hold the whole memory of a process, secrets included, and so does
everything derived from them (indexes, reports, the catalog's paths):

- a directory is created 0700, must belong to the user, and is never reached
  through a symlink (someone else could point it at their folder);
- a file is created 0600, never through a symlink, and written whole or not
  at all: a temporary file beside it, then a rename (write_private).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

import platformdirs

from forensics.errors import InputError


def state_dir() -> Path:
    """``$XDG_STATE_HOME/forensics``; a relative XDG_STATE_HOME is ignored, as the XDG spec says."""
    return Path(platformdirs.user_state_dir("forensics", appauthor=False))


def default_snapshot_dir() -> Path:
    return state_dir() / "snapshots"


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Make sure *path* is a directory of ours, creating it (and missing parents) 0700.

    Refused, with nothing created: a final component that is a symlink, a
    path that exists but is no directory, a directory owned by another user.
    Returns the absolute path (symlinks in parent components are not resolved:
    the path handed on is the one the user gave).
    """
    target = Path(os.path.abspath(os.fspath(path)))
    _check_existing(target)  # before creating anything

    missing: list[Path] = []
    p = target
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # a racing creator; checked below like any existing dir
        except OSError as e:
            raise InputError(f"cannot create snapshot directory {d}: {e.strerror}") from None
        else:
            os.chmod(d, 0o700)  # the umask may have taken bits off; never adds
    _check_existing(target)
    return target


def _check_existing(target: Path) -> None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"cannot use snapshot directory {target}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(
            f"snapshot directory {target} is a symlink; refusing to follow it "
            f"(give the real path with --dir)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"snapshot directory {target} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise InputError(
            f"snapshot directory {target} belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}); give a directory of your own with --dir"
        )


def write_private(path: str | os.PathLike[str], fill: Callable[[BinaryIO], object], *,
                  durable: bool = False) -> None:
    """Write *path* 0600 and atomically: fill(f) writes a temporary file
    beside it (created O_EXCL|O_NOFOLLOW, so a planted file or link is never
    written through), which then replaces *path*.  durable: fsync before the
    rename, for a file the user keeps (a cache that is lost is rebuilt).
    Raises OSError; the temporary file is gone then."""
    path = os.path.abspath(os.fspath(path))
    tmp = os.path.join(os.path.dirname(path),
                       f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def create_private(path: str | os.PathLike[str]) -> None:
    """Create *path* empty and 0600 if it does not exist (never through a
    symlink), before a library (sqlite) opens it with the umask's mode."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def disk_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes a file takes on disk (its allocated blocks): a core is sparse,
    its apparent size (st_size) counts the holes too.  None if it is gone."""
    try:
        return os.stat(path).st_blocks * 512
    except OSError:
        return None


def open_own_file(path: str | os.PathLike[str], flags: int, *,
                  any_owner: bool = False) -> tuple[int, os.stat_result] | None:
    """(fd, its stat) of a regular file of ours (of anyone's, with
    any_owner) at path, opened with flags, never through a symlink at its
    last component; None (nothing left open) when it cannot be opened or is
    not such a file."""
    try:
        # O_NONBLOCK: a FIFO planted at path must not block the open (a
        # regular file ignores the flag)
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode) or (st.st_uid != os.geteuid() and not any_owner):
        os.close(fd)
        return None
    return fd, st
