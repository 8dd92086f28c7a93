"""A seccomp filter for the REPL: the kernel's riskiest doors shut, everything else as usual.

Namespaces, privileges and rlimits already keep the REPL's code off the host; this removes
the system calls that matter only to someone attacking the kernel from inside: new
namespaces (a user namespace hands out capabilities over its own mounts), mounting, ptrace,
eBPF, keyrings, io_uring, userfaultfd, perf events, handle-based opens, module and kexec
loading. They fail with EPERM (clone3 with ENOSYS, so the C library falls back to clone,
whose namespace flags are checked). The filter is classic BPF, handed to bubblewrap as
bytes (``--seccomp FD``), which installs it just before the REPL's command starts.

x86_64 only; elsewhere the sandbox runs without it and its isolation text says so.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# x86_64 numbers.
BLOCKED = {
    "ptrace": 101,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "open_by_handle_at": 304,
    "setns": 308,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
CLONE = 56
CLONE3 = 435
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME.
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
CLONE_NAMESPACES |= 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_ERRNO = 0x00050000


def supported() -> bool:
    return platform.machine() == "x86_64"


def program() -> bytes:
    """The filter as struct sock_filter[] bytes (code u16, jt u8, jf u8, k u32)."""
    deny = _ERRNO | errno.EPERM
    rules: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (_RET_K, 0, 0, _KILL_PROCESS),
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (_JGE_K, 0, 1, _X32_BIT),  # the x32 ABI: another table of numbers, refused whole
        (_RET_K, 0, 0, deny),
        (_JEQ_K, 0, 1, CLONE3),
        (_RET_K, 0, 0, _ERRNO | errno.ENOSYS),
    ]
    for number in sorted(BLOCKED.values()):
        rules += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, deny)]
    rules += [
        (_JEQ_K, 0, 3, CLONE),
        (_LD_W_ABS, 0, 0, 16),  # the low half of args[0], the clone flags
        (_JSET_K, 0, 1, CLONE_NAMESPACES),
        (_RET_K, 0, 0, deny),
        (_RET_K, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("<HBBI", *rule) for rule in rules)
