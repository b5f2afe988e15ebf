"""Compressed cores (zstd, lz4, xz): recognised by their magic, decompressed
once, streaming, into a private sparse file that is gone when the core is.

systemd-coredump stores cores compressed (``core.PROG.UID.BOOTID.PID.TIME.zst``,
``.lz4`` or ``.xz``), and people compress cores to move them.  The reader maps
a core and reads it at random (numpy views of whole segments), which a
compressed stream cannot serve; so the core is decompressed once, when it is
opened, into a file that:

- has no name: ``O_TMPFILE`` (or, where the file system lacks it, a name
  unlinked right after it is created), so nothing is left behind when the
  dump is closed or the process is killed - the kernel frees the blocks when
  the last descriptor or mapping goes;
- is written sparse: an all-zero 4 KiB block is seeked over, not written.
  Most of a core is zero pages (touched but zero, calloc'ed, stacks), so the
  copy takes on disk only the core's non-zero pages - less than the core
  itself takes when the kernel wrote those zero pages out;
- is in ``$XDG_CACHE_HOME/forensics/decompressed`` (0700, default
  ``~/.cache``): always ours and on a disk.  Not the core's folder - systemd's
  ``/var/lib/systemd/coredump`` is not the user's to write, and a copy there
  would count against systemd-coredump's own space limits (MaxUse=,
  KeepFree=) - and not ``$TMPDIR`` first, which is often a tmpfs, where a
  large core would take memory; ``$TMPDIR`` is the fallback when the cache
  folder cannot be made.

Input is read and output produced in bounded pieces (never the whole core in
memory: a zero page compresses ~30000 to 1, so one MiB of input can be tens
of GiB of output).  A stream that stops before its end marker, or that does
not decode, is a CoreParseError naming the file and the format.

The aim is that reading a compressed core costs no more than the format's
tool decompressing it and then reading the plain core (docs/benchmarks.md,
"Compressed cores"), so the copy costs the decoding and the writing of the
non-zero pages, little else:

- lz4 and xz give their output in pieces of 256 KiB (_OUT), memory malloc
  reuses; larger pieces were new memory from the kernel on each call, every
  page of it faulted in.  zstd's decompressobj has no output bound, so the
  input fed to it adapts instead (16 bytes to 1 KiB) to give about _OUT a
  call: a KiB of a run of zero pages is 10-30 MiB;
- lz4 is decoded by the binding's decompress_chunk on views of the input,
  which copies nothing but the output; LZ4FrameDecompressor would copy the
  input not yet used on each call;
- a piece of 64 KiB or more (_DIRECT: every lz4 and xz piece, zstd's runs)
  is checked and written where it lies; smaller ones (zstd's output for a
  KiB of input of incompressible memory) are gathered in one reused buffer
  first, so that a check and a write cover a MiB;
- the check of 4 KiB blocks for zeros is one numpy max per piece; each run
  of non-zero blocks is one pwrite.

The content checksum a frame carries (the lz4 and zstd tools write one) is
verified, as the tools do: for lz4 it is most of the decoding's time.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile

from forensics._np import np

from .errors import CoreParseError

# the first bytes of each format (its frame / stream magic), longest first
MAGICS = (
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"),
)
MAGIC_LEN = max(len(m) for m, _ in MAGICS)

_BLOCK = 4096  # the unit seeked over when all zero: a page
_READ = 1 << 20  # compressed bytes read from the file at a time
# lz4's and xz's output per call.  Small, so that each call's output (and
# lz4's own buffer behind it) is memory malloc reuses: pieces of 1 to 8 MiB
# came from the kernel again and again (mmap, or the heap's top trimmed and
# regrown), every page faulted in - for a 1.1 GiB core 47000-140000 faults,
# 0.2-0.4 s of system time - while 256 KiB pieces cost ~3000 faults and no
# more user time.
_OUT = 256 << 10
# the most zstd input fed at a time: its decompressobj has no output bound,
# so this bounds what one call can give (a KiB of zero pages: ~32 MiB)
_ZSTD_FEED = 1024
_GATHER = 1 << 20  # small pieces are gathered up to this before they are checked and written
_DIRECT = 64 << 10  # a piece this large is checked and written where it lies, not gathered


def detect(head: bytes) -> str | None:
    """"zstd", "lz4" or "xz" when head (a file's first bytes) starts a stream
    of that format, None otherwise."""
    for magic, kind in MAGICS:
        if head.startswith(magic):
            return kind
    return None


def _decompressor(kind: str):
    if kind == "xz":
        import lzma

        return lzma.LZMADecompressor()
    if kind == "lz4":
        import lz4.frame

        return lz4.frame.create_decompression_context()
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj()


def _errors(kind: str) -> tuple[type[BaseException], ...]:
    if kind == "xz":
        import lzma

        return (lzma.LZMAError, EOFError)
    if kind == "lz4":
        return (RuntimeError, EOFError)
    import zstandard

    return (zstandard.ZstdError,)


def _pieces(kind: str, read):
    """The decompressed output of the stream read(n) gives, in pieces of at
    most a few MiB (lz4, xz: at most _OUT); consecutive streams (frames)
    are decoded one after the other, as the tools do.  Raises
    CoreParseError (via the caller) for a stream cut short: EOFError here."""
    if kind == "lz4":
        yield from _lz4_pieces(read)
        return
    d = _decompressor(kind)
    started = False  # bytes of the current stream were fed
    bounded = kind != "zstd"
    feed = _ZSTD_FEED
    while True:
        data = read(_READ)
        if not data:
            break
        view = memoryview(data)
        while len(view):
            if bounded:
                out = d.decompress(bytes(view), max_length=_OUT)
                view = view[len(view):]
                started = True
                if out:
                    yield out
                # drain what the stream holds before feeding it more
                while not d.eof and not d.needs_input:
                    out = d.decompress(b"", max_length=_OUT)
                    if not out:
                        break
                    yield out
            else:
                piece, view = view[:feed], view[feed:]
                out = d.decompress(bytes(piece))
                # aim at _OUT a call: a run of zero pages decodes to MiBs
                # from a few bytes, incompressible memory to about what is
                # fed (nothing out: the decoder holds a partial block)
                feed = max(16, min(_ZSTD_FEED, feed * _OUT // len(out) if out else feed * 2))
                started = True
                if out:
                    yield out
            if d.eof:
                rest = bytes(d.unused_data or b"") + bytes(view)
                view = memoryview(b"")
                if kind == "xz":
                    rest = rest.lstrip(b"\0")  # xz's stream padding
                d, started = _decompressor(kind), False
                if rest:
                    view = memoryview(rest)
    if started:  # input ended inside a stream
        raise EOFError("the stream ends before its end marker")


def _lz4_pieces(read):
    """lz4's frames through the binding's decompress_chunk on views of the
    input: LZ4FrameDecompressor.decompress copies the input it has not used
    yet on every call (the rest of each MiB read, for every _OUT of output).
    After a frame's end the context starts the next frame (LZ4F resets it);
    skippable frames are skipped by LZ4F itself."""
    import lz4.frame

    ctx = lz4.frame.create_decompression_context()
    chunk = lz4.frame.decompress_chunk
    started = False  # bytes of the current frame were fed
    while True:
        data = read(_READ)
        if not data:
            break
        view = memoryview(data)
        while len(view):
            out, used, end = chunk(ctx, view, max_length=_OUT)
            if not used and not out:  # never seen: LZ4F takes input or gives output
                raise RuntimeError("the lz4 decoder makes no progress")
            view = view[used:]
            started = not end
            if out:
                yield out
    if started:
        raise EOFError("the stream ends before its end marker")


class SparseWriter:
    """Writes a stream of bytes to fd at increasing offsets, seeking over
    every all-zero 4 KiB block; size is the bytes taken so far.  A piece of
    _DIRECT bytes or more is checked and written where it lies, never
    copied (lz4's and xz's _OUT pieces, a zstd run of zero pages); smaller
    ones are gathered in one reused buffer and checked and written a MiB at
    a time (zstd's output for each KiB of input)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0  # bytes emitted: written or seeked over
        self._buf = bytearray(_GATHER)
        self._n = 0  # bytes gathered in _buf

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        if len(view) >= _DIRECT:
            if self._n:  # complete the gathered bytes to a whole block and write them
                need = -self._n % _BLOCK
                self._gather(view[:need])
                view = view[need:]
                self._flush()
            whole = len(view) // _BLOCK * _BLOCK
            self._emit(view[:whole])
            self._gather(view[whole:])
            return
        room = _GATHER - self._n
        if len(view) >= room:
            self._gather(view[:room])
            view = view[room:]
            self._flush()
        self._gather(view)

    def close(self) -> None:
        whole = self._n // _BLOCK * _BLOCK
        tail = bytes(self._buf[whole:self._n])
        self._n = whole
        self._flush()
        if any(tail):
            _pwrite_all(self.fd, tail, self.size)
        self.size += len(tail)
        os.ftruncate(self.fd, self.size)  # a zero tail is a hole too

    def _gather(self, view: memoryview) -> None:
        self._buf[self._n:self._n + len(view)] = view
        self._n += len(view)

    def _flush(self) -> None:
        """Emit the gathered bytes: whole blocks (the buffer is full, or was
        completed to a block)."""
        with memoryview(self._buf) as buf:
            self._emit(buf[:self._n])
        self._n = 0

    def _emit(self, view: memoryview) -> None:
        """view (whole blocks) at self.size: each run of non-zero blocks in one pwrite."""
        if not len(view):
            return
        # max, not any: numpy vectorises max over uint64 (~20 GB/s against ~6 here)
        nonzero = np.frombuffer(view, dtype=np.uint64).reshape(-1, _BLOCK // 8).max(axis=1) != 0
        count = int(np.count_nonzero(nonzero))
        if count == len(nonzero):
            _pwrite_all(self.fd, view, self.size)
        elif count:
            edges = np.flatnonzero(np.diff(nonzero.view(np.int8), prepend=0, append=0))
            for start, stop in zip(edges[0::2].tolist(), edges[1::2].tolist()):
                _pwrite_all(self.fd, view[start * _BLOCK:stop * _BLOCK], self.size + start * _BLOCK)
        self.size += len(view)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def private_dir() -> str:
    """Where decompressed cores go (see the module docstring)."""
    import platformdirs

    from forensics.files import ensure_private_dir

    try:
        return os.fspath(ensure_private_dir(
            os.path.join(platformdirs.user_cache_dir("forensics", appauthor=False), "decompressed")))
    except Exception:  # noqa: BLE001 - a read-only or foreign home: the temp folder
        return tempfile.gettempdir()


def _nameless_file(folder: str) -> int:
    """A read-write file in folder that no name reaches (0600)."""
    try:
        return os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            raise
    fd, name = tempfile.mkstemp(prefix=".core-", dir=folder)  # 0600, O_EXCL
    os.unlink(name)
    return fd


def decompress(fd_in: int, kind: str, path: str, folder: str | None = None) -> tuple[mmap.mmap, int, int]:
    """(a read-only map of the decompressed core, its size in bytes, the
    bytes its sparse copy takes on disk), decompressing the stream of format
    kind read from fd_in (of the file at path, for messages).  The copy is
    freed when the map is closed."""
    try:
        _decompressor(kind)
    except ImportError as exc:
        raise CoreParseError(f"cannot read {path}: it is {kind}-compressed and the Python module "
                             f"{exc.name} is not installed") from None
    folder = folder or private_dir()
    try:
        out = _nameless_file(folder)
    except OSError as exc:
        raise CoreParseError(f"cannot decompress {path}: no private file in {folder}: "
                             f"{exc.strerror or exc}") from None
    try:
        writer = SparseWriter(out)
        offset = [0]

        def read(n: int) -> bytes:
            data = os.pread(fd_in, n, offset[0])
            offset[0] += len(data)
            return data

        try:
            for piece in _pieces(kind, read):
                writer.write(piece)
            writer.close()
        except EOFError:
            raise CoreParseError(f"truncated {kind} stream: {path} ends before the end of its "
                                 f"compressed core (a cut copy?)") from None
        except _errors(kind) as exc:
            raise CoreParseError(f"corrupt {kind} stream: {path} does not decompress: "
                                 f"{str(exc).strip() or type(exc).__name__}") from None
        except OSError as exc:
            raise CoreParseError(f"cannot decompress {path} into {folder}: "
                                 f"{exc.strerror or exc}") from None
        if writer.size == 0:
            raise CoreParseError(f"empty file: {path} decompresses ({kind}) to 0 bytes")
        try:
            mm = mmap.mmap(out, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise CoreParseError(f"cannot map the decompressed core of {path}: {exc}") from None
        return mm, writer.size, os.fstat(out).st_blocks * 512
    finally:
        os.close(out)  # the map holds the file now; it goes with the map


def head(fd_in: int, kind: str, path: str, n: int) -> bytes:
    """The first n bytes (fewer when the core is shorter) of the core the
    stream of format kind in fd_in holds, decompressing only as far as that:
    the notes of a kernel's core are at its start (``forensics list``)."""
    offset = [0]

    def read(size: int) -> bytes:
        data = os.pread(fd_in, size, offset[0])
        offset[0] += len(data)
        return data

    out = bytearray()
    pieces = _pieces(kind, read)
    try:
        for piece in pieces:
            out += piece
            if len(out) >= n:
                break
    except EOFError:
        pass  # a cut stream: what came before the cut
    except (ImportError, *_errors_safe(kind)) as exc:
        raise CoreParseError(f"corrupt {kind} stream: {path} does not decompress: "
                             f"{str(exc).strip() or type(exc).__name__}") from None
    finally:
        pieces.close()
    return bytes(out[:n])


def _errors_safe(kind: str) -> tuple[type[BaseException], ...]:
    try:
        return _errors(kind)
    except ImportError:
        return ()
