"""Compressed cores (zstd, lz4, xz) are read by every verb as the core they
hold: recognised by their magic, decompressed into a private sparse copy
that is gone when the verb ends; a cut or corrupt stream is one error line.

The cores are real: libtag's snapshot core of tests/victims/rev_cases.c
(holding malloc(0)'s block, whose address it prints) and the kernel's core
of `sleep` killed with SIGABRT (no libtag: glibc's heap); they are
compressed by the real tools (zstd, lz4, xz) as a user or systemd-coredump
would, and cut or patched copies of those make the bad input.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import forensics_test_support as S
from forensics.core import Core, CoreParseError

TOOLS = {"zstd": ["zstd", "-q", "-c"], "lz4": ["lz4", "-q", "-c"], "xz": ["xz", "-c", "-T1"]}
FORMATS = list(TOOLS)


def compress(core: Path, kind: str, out: Path) -> Path:
    """out: core compressed by the real tool of kind."""
    if shutil.which(TOOLS[kind][0]) is None:
        pytest.skip(f"the {kind} tool is not installed (.ci/run installs it)")
    with open(out, "wb") as f:
        subprocess.run([*TOOLS[kind], str(core)], stdout=f, check=True, timeout=120)
    return out


def nonzero_pages(path: Path) -> int:
    """How many 4 KiB blocks of the file at path hold a non-zero byte."""
    n = 0
    with open(path, "rb") as f:
        while block := f.read(4096):
            n += any(block)
    return n


@pytest.fixture(scope="module")
def libtag_core(build_victim, tmp_path_factory) -> tuple[Path, int]:
    """(libtag's core of rev_cases zero, the address of its malloc(0) block)."""
    return S.zero_block_core(build_victim("rev_cases"), tmp_path_factory.mktemp("zero"))


def _raise_core_limit() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


@pytest.fixture(scope="module")
def kernel_core(tmp_path_factory) -> Path:
    """The kernel's core of `sleep` killed with SIGABRT (core limit raised in the child)."""
    if S.core_pattern() != "core":
        pytest.skip(f"core_pattern is {S.core_pattern()!r}, not 'core': the kernel's core is not ours")
    work = tmp_path_factory.mktemp("kernel")
    proc = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "60"], cwd=work,
                            preexec_fn=_raise_core_limit)
    time.sleep(0.3)  # past exec: the core is of sleep
    proc.send_signal(signal.SIGABRT)
    assert proc.wait(timeout=30) == -signal.SIGABRT
    core = work / "core"
    assert core.is_file(), sorted(work.iterdir())
    return core


@pytest.fixture
def cli(run_cli, tmp_path):
    """run_cli with a private state and cache folder (the decompressed copies go there)."""
    def run(*args: str):
        return run_cli(*args, env={"XDG_STATE_HOME": str(tmp_path / "state"),
                                   "XDG_CACHE_HOME": str(tmp_path / "cache")})
    run.cache = tmp_path / "cache" / "forensics" / "decompressed"
    return run


def inspect_json(cli, core: Path) -> dict:
    result = cli("inspect", "--json", str(core))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["core"] == str(core)
    doc["core"] = "CORE"
    return doc


@pytest.mark.parametrize("kind", FORMATS)
def test_inspect_of_a_compressed_libtag_core_equals_the_plain_cores(kind, libtag_core, cli, tmp_path):
    core, _ = libtag_core
    packed = compress(core, kind, tmp_path / f"core.{kind}")
    assert inspect_json(cli, packed) == inspect_json(cli, core)
    # the private copy went with the verb; its folder is ours alone
    assert list(cli.cache.iterdir()) == []
    assert cli.cache.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("kind", FORMATS)
def test_inspect_of_a_compressed_kernel_core_equals_the_plain_cores(kind, kernel_core, cli, tmp_path):
    packed = compress(kernel_core, kind, tmp_path / f"core.{kind}")
    plain = inspect_json(cli, kernel_core)
    assert plain["libtag"] is False and plain["crash"]["signal"] == "SIGABRT"
    assert inspect_json(cli, packed) == plain


def test_the_format_is_known_by_its_magic_not_its_name(libtag_core, cli, tmp_path):
    # GIVEN an xz stream named like a zstd one, and a zstd stream with no suffix
    core, address = libtag_core
    odd = compress(core, "xz", tmp_path / "core.zst")
    bare = compress(core, "zstd", tmp_path / "crash-dump")
    # THEN both read as the core (whoowns names the same block in each)
    answers = []
    for path in (core, odd, bare):
        result = cli("whoowns", hex(address), "--core", str(path), "--json")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        answers.append((doc["block"]["start"], doc["block"]["size"], doc["block"]["state"]))
    assert answers == [(hex(address), 0, "live")] * 3


def test_diff_takes_a_compressed_core_and_its_plain_one_as_the_same_memory(libtag_core, cli, tmp_path):
    core, _ = libtag_core
    packed = compress(core, "zstd", tmp_path / "core.zst")
    result = cli("diff", str(core), str(packed), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["same_process"], doc["new_blocks"], doc["gone_blocks"]) == (True, 0, 0), doc
    assert doc["survived_blocks"] == json.loads(cli("inspect", "--json", str(core)).stdout)["heap"]["live_blocks"]


@pytest.mark.parametrize("kind", FORMATS)
def test_the_copy_is_sparse_and_holds_the_cores_bytes(kind, kernel_core, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packed = compress(kernel_core, kind, tmp_path / f"core.{kind}")
    expected = nonzero_pages(kernel_core) * 4096
    with Core.open(packed) as c, Core.open(kernel_core) as plain:
        assert (c.compressed, c.file_size) == (kind, kernel_core.stat().st_size)
        # every non-zero page is written, no zero page is: the blocks the
        # copy takes are those pages (a file system may add its own
        # extent blocks on top, never more than a few)
        assert expected <= c.copy_disk_bytes <= expected + 16 * 4096, (expected, c.copy_disk_bytes)
        assert [(s.vaddr, s.dumped) for s in c.segments] == [(s.vaddr, s.dumped) for s in plain.segments]
        seg = max(plain.segments, key=lambda s: s.dumped)
        assert c.read(seg.vaddr, seg.dumped) == plain.read(seg.vaddr, seg.dumped)
    assert plain.copy_disk_bytes is None


def _one_error(result, expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"forensics: error: {expected}"]


@pytest.mark.parametrize("kind", FORMATS)
def test_a_cut_compressed_core_is_one_error_line(kind, kernel_core, cli, tmp_path):
    whole = compress(kernel_core, kind, tmp_path / f"whole.{kind}").read_bytes()
    cut = tmp_path / f"cut.{kind}"
    cut.write_bytes(whole[: len(whole) // 2])
    for verb in (["inspect", str(cut)], ["whoowns", "0x1000", "--core", str(cut)]):
        _one_error(cli(*verb), f"truncated {kind} stream: {cut} ends before the end of its "
                               f"compressed core (a cut copy?)")
    assert list(cli.cache.iterdir()) == []


# the stream's last byte flipped: zstd's and lz4's content checksum (the
# tools write one), xz's stream footer - each format's own check finds it
CORRUPT = {
    "zstd": "zstd decompressor error: Restored data doesn't match checksum",
    "lz4": "LZ4F_decompress failed with code: ERROR_contentChecksum_invalid",
    "xz": "Corrupt input data",
}


@pytest.mark.parametrize("kind", FORMATS)
def test_a_corrupt_compressed_core_is_one_error_line(kind, kernel_core, cli, tmp_path):
    data = bytearray(compress(kernel_core, kind, tmp_path / f"whole.{kind}").read_bytes())
    data[-1] ^= 0x55
    bad = tmp_path / f"bad.{kind}"
    bad.write_bytes(bytes(data))
    _one_error(cli("inspect", str(bad)), f"corrupt {kind} stream: {bad} does not decompress: {CORRUPT[kind]}")


def test_a_compressed_file_that_is_no_core_says_what_it_decompressed_to(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello, this is not a core\n")
    packed = compress(text, "zstd", tmp_path / "notes.zst")
    with pytest.raises(CoreParseError) as info:
        Core.open(packed)
    assert str(info.value) == (f"not an ELF file: {packed} (magic b'hell') "
                               f"(what its zstd stream decompresses to)")


def _same_memory(packed: Path, plain_core: Path) -> None:
    """packed reads as plain_core: every segment's bytes, in a sparse copy."""
    expected = nonzero_pages(plain_core) * 4096
    with Core.open(packed) as c, Core.open(plain_core) as plain:
        assert c.file_size == plain_core.stat().st_size
        assert expected <= c.copy_disk_bytes <= expected + 16 * 4096, (expected, c.copy_disk_bytes)
        assert [(s.vaddr, s.dumped) for s in c.segments] == [(s.vaddr, s.dumped) for s in plain.segments]
        for s in plain.segments:
            assert c.read(s.vaddr, s.dumped) == plain.read(s.vaddr, s.dumped), hex(s.vaddr)


@pytest.mark.parametrize("kind", FORMATS)
def test_a_core_in_two_frames_cut_mid_page_reads_as_the_core(kind, kernel_core, tmp_path, monkeypatch):
    # the tools decode concatenated frames (streams) as one; the cut is not
    # on a page, so a page of the copy is made of both frames' output
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if shutil.which(TOOLS[kind][0]) is None:
        pytest.skip(f"the {kind} tool is not installed (.ci/run installs it)")
    data = kernel_core.read_bytes()
    cut = len(data) // 2 + 1001
    assert cut % 4096, cut
    packed = tmp_path / f"two.{kind}"
    with open(packed, "wb") as f:
        for half in (data[:cut], data[cut:]):
            f.write(subprocess.run(TOOLS[kind], input=half, capture_output=True, check=True,
                                   timeout=120).stdout)
    _same_memory(packed, kernel_core)


# systemd-coredump's lz4 frame: LZ4F with 256 KiB linked blocks and no
# content checksum (its compress_stream_lz4), not the lz4 tool's default
# (4 MiB independent blocks, a content checksum)
LZ4_AS_SYSTEMD = ["lz4", "-q", "-c", "-BD", "-B5", "--no-frame-crc"]


def test_an_lz4_core_as_systemd_coredump_writes_it_reads_as_the_core(kernel_core, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packed = compress(kernel_core, "lz4", tmp_path / "core.lz4")  # skips without the tool
    with open(packed, "wb") as f:
        subprocess.run([*LZ4_AS_SYSTEMD, str(kernel_core)], stdout=f, check=True, timeout=120)
    flg, bd = packed.read_bytes()[4:6]
    # version 01, blocks linked, no content checksum; 256 KiB blocks
    assert (flg & 0xC0, flg & 0x20, flg & 0x04, bd >> 4 & 7) == (0x40, 0, 0, 5), (hex(flg), hex(bd))
    _same_memory(packed, kernel_core)
    # no checksum to fail: a cut one is still found cut
    cut = tmp_path / "cut.lz4"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    with pytest.raises(CoreParseError) as info:
        Core.open(cut)
    assert str(info.value) == (f"truncated lz4 stream: {cut} ends before the end of its "
                               f"compressed core (a cut copy?)")
