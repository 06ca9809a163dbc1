"""The sandbox's system-call filter: a small ctypes binding of libseccomp (``libseccomp.so.2``).

Self-contained on purpose (the standard library only): the sandbox's init loads this file by
path under the isolated system Python, which cannot import the box or its virtualenv, and the box
imports it as ``tasks.sandbox.syscall_filter`` to tell whether the filter can be had. libseccomp
itself is a C library every Linux distribution ships (Debian's ``libseccomp2``); nothing of
Python is needed beyond this file.

The filter denies, with EPERM, the system calls a task never needs and an attacker would use.
Everything else is allowed (a default-deny list would break ordinary programs). It is inherited
by every process the task starts and cannot be removed.
"""
from __future__ import annotations

import ctypes
import errno
import os

LIBRARY = "libseccomp.so.2"

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_EQ, _CMP_MASKED_EQ = 4, 7
_NR_SCMP_ERROR = -1  # what seccomp_syscall_resolve_name answers for a name it does not know

_CLONE_NEWUSER = 0x10000000
_KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_GET_PERSISTENT = 1, 22
_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING = -4, -5
_LOW32 = 0xFFFFFFFF
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_INSTRUCTION = 8  # bytes of one ``struct sock_filter``
# Denied outright: mounting and moving mounts, entering or making namespaces, tracing other
# processes, loading programs or modules into the kernel.
DENIED_SYSCALLS = (
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "open_by_handle_at",
    "swapon", "swapoff", "reboot", "acct", "quotactl", "userfaultfd",
)


class FilterError(Exception):
    """The filter cannot be built or loaded (the sandbox then refuses to start the task)."""


class _ArgCmp(ctypes.Structure):
    """``struct scmp_arg_cmp``: argument ``arg`` compared with ``op``; for MASKED_EQ, ``a`` is the
    mask and ``b`` the value."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def load() -> ctypes.CDLL:
    """libseccomp, with the signatures used here; ``FilterError`` when it cannot be loaded."""
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as exc:
        raise FilterError(f"{LIBRARY} cannot be loaded ({exc})") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.restype = ctypes.c_int
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def unavailable() -> str | None:
    """Why the filter cannot be had on this machine, or None when it can."""
    try:
        lib = load()
    except FilterError as exc:
        return str(exc)
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        return f"{LIBRARY} cannot make a filter"
    lib.seccomp_release(ctx)
    return None


def _errno(code: int) -> int:
    return _ACT_ERRNO | (code & 0xFFFF)


class _Filter:
    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.ctx = lib.seccomp_init(_ACT_ALLOW)
        if not self.ctx:
            raise FilterError("seccomp_init failed")

    def rule(self, action: int, name: str, *args: tuple[int, int, int, int], optional: bool = False) -> None:
        """Add ``action`` for ``name`` when its arguments match every ``(index, op, a, b)``.
        ``optional``: a name this architecture does not have is skipped."""
        number = self.lib.seccomp_syscall_resolve_name(name.encode())
        if number == _NR_SCMP_ERROR:
            if optional:
                return
            raise FilterError(f"no system call {name} here")
        compared = (_ArgCmp * len(args))(*(_ArgCmp(*arg) for arg in args)) if args else None
        result = self.lib.seccomp_rule_add_array(self.ctx, action, number, len(args), compared)
        if result != 0 and not optional:
            raise FilterError(f"the rule for {name}: {errno.errorcode.get(-result, result)}")

    def load(self) -> None:
        result = self.lib.seccomp_load(self.ctx)
        self.lib.seccomp_release(self.ctx)
        if result != 0:
            raise FilterError(f"seccomp_load: {errno.errorcode.get(-result, result)}")

    def export(self) -> bytes:
        """The filter as the kernel takes it (a BPF program), generated by libseccomp."""
        fd = os.memfd_create("box-seccomp", os.MFD_CLOEXEC)
        try:
            result = self.lib.seccomp_export_bpf(self.ctx, fd)
            if result != 0:
                raise FilterError(f"seccomp_export_bpf: {errno.errorcode.get(-result, result)}")
            os.lseek(fd, 0, os.SEEK_SET)
            program = b""
            while chunk := os.read(fd, 65536):
                program += chunk
        finally:
            os.close(fd)
            self.lib.seccomp_release(self.ctx)
        if not program or len(program) % _INSTRUCTION:
            raise FilterError("seccomp_export_bpf gave no program")
        return program


class _Program(ctypes.Structure):
    """``struct sock_fprog``: the number of instructions and where they are."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(lib: ctypes.CDLL) -> None:
    """Build the filter and load it into this process (and so into all it starts).

    Call after no_new_privs is set (an unprivileged process may load a filter only then)."""
    _build(lib).load()


def compiled(lib: ctypes.CDLL) -> bytes:
    """The filter built once, as its BPF program: ``install_compiled`` loads it into each process
    that needs it without building it again (a run's init builds it once for all its commands)."""
    return _build(lib).export()


def install_compiled(program: bytes) -> None:
    """Load ``compiled``'s program into this process (and so into all it starts), as
    ``seccomp_load`` would (``PR_SET_SECCOMP``). Call after no_new_privs is set."""
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Program(len(program) // _INSTRUCTION, ctypes.addressof(buffer))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise FilterError(f"PR_SET_SECCOMP: {errno.errorcode.get(code, code)}")


def _build(lib: ctypes.CDLL) -> _Filter:
    """The filter's rules, not yet loaded."""
    flt = _Filter(lib)
    denied = _errno(errno.EPERM)
    for name in DENIED_SYSCALLS:
        flt.rule(denied, name, optional=True)  # not a system call on every architecture
    # New user namespaces (root inside one): unshare and clone with CLONE_NEWUSER. clone3 passes
    # its flags in memory a filter cannot read, so it says "not implemented" and C libraries
    # fall back to clone.
    for name in ("unshare", "clone"):
        flt.rule(denied, name, (0, _CMP_MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER))
    flt.rule(_errno(errno.ENOSYS), "clone3")
    # Keyrings: only the task's own session keyring. The user's keyrings (shared by every
    # process of the uid), persistent keyrings and joining another session keyring are refused.
    for op in (_KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_GET_PERSISTENT):
        flt.rule(denied, "keyctl", (0, _CMP_EQ, op, 0))
    for spec in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
        value = spec & _LOW32  # key serials are 32-bit: compare only the low half of the register
        for index in (1, 2):
            flt.rule(denied, "keyctl", (index, _CMP_MASKED_EQ, _LOW32, value))
        flt.rule(denied, "add_key", (4, _CMP_MASKED_EQ, _LOW32, value))
        flt.rule(denied, "request_key", (3, _CMP_MASKED_EQ, _LOW32, value))
    return flt
