"""The seccomp filter interpreter that guards the ptrace snapshot's injected
system calls (forensics/snapshots/seccomp.py), on filters written as
programs write them."""

from forensics.snapshots import seccomp

SYS_clone, SYS_wait4 = 56, 61


def test_a_filter_is_run_as_the_kernel_runs_it():
    """The seccomp interpreter on the victim's own filter shape: clone is
    killed, read is allowed, another architecture is allowed."""
    SYS_read = 0
    prog = [  # plain_threads.c forbid_fork, as (code, jt, jf, k)
        (0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x7FFF0000),
        (0x20, 0, 0, 0), (0x15, 4, 0, 56), (0x15, 3, 0, 435), (0x15, 2, 0, 57),
        (0x15, 1, 0, 58), (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x80000000),
    ]
    assert not seccomp.seccomp_allows([prog], SYS_clone, (0,), 0x1000)
    assert seccomp.seccomp_allows([prog], SYS_read, (0,), 0x1000)
    assert seccomp.seccomp_allows([prog], SYS_wait4, (1, 0, 0), 0x1000)
    errno_clone = [(0x20, 0, 0, 0), (0x15, 0, 1, 56), (0x06, 0, 0, 0x00050001),
                   (0x06, 0, 0, 0x7FFF0000)]
    # an errno result is not ALLOW either: the injected clone would fail
    assert not seccomp.seccomp_allows([errno_clone], SYS_clone, (0,), 0x1000)
    assert not seccomp.seccomp_allows([errno_clone, prog], SYS_read + 56, (0,), 0x1000)


def test_a_division_by_zero_ends_the_filter_as_the_kernel_does():
    # A = nr; X = 0; A /= X: the kernel's converted program returns 0 (KILL_THREAD)
    prog = [(0x20, 0, 0, 0), (0x01, 0, 0, 0), (0x3C, 0, 0, 0), (0x06, 0, 0, 0x7FFF0000)]
    assert seccomp.run_filter(prog, bytes(64)) == 0
    assert not seccomp.seccomp_allows([prog], SYS_wait4, (1, 0, 0), 0x1000)
