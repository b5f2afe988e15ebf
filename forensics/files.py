"""The user's forensics state directory and private directories in it.

``$XDG_STATE_HOME/forensics`` (XDG default ``~/.local/state/forensics``) holds
the catalog; snapshots go to its ``snapshots/`` folder unless ``--dir`` says
otherwise.  Cores hold the whole memory of a process, secrets included, so a
snapshot directory is created 0700, must belong to the user, and is never
reached through a symlink (someone else could point it at their folder).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from forensics.errors import InputError


def state_dir() -> Path:
    """``$XDG_STATE_HOME/forensics``; a relative XDG_STATE_HOME is ignored, as the XDG spec says."""
    base = os.environ.get("XDG_STATE_HOME", "")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "forensics"


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
