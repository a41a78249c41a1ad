"""The x86 AMX permission a parked process had, asked for again once it is restored.

Linux lets a process use AMX's tile data (XTILEDATA, xstate component 18) only after it asked with
arch_prctl(ARCH_REQ_XCOMP_PERM); oneDNN and MKL ask at their first AMX kernel (a bf16 matmul on
Sapphire Rapids and later). CRIU 4.1 neither saves that permission nor restores it, so a restored
process that had it dies by SIGILL at its next AMX instruction: the first request. The park records
the permission (ARCH_GET_XCOMP_PERM) and the restored process asks for it again before it serves.
The tiles' own state needs nothing: the kernels load their tile configuration at every call.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_GET_XCOMP_PERM = 0x1022
_ARCH_REQ_XCOMP_PERM = 0x1023
XTILEDATA = 18  # the xstate component whose permission a process must ask for


def _x86_linux() -> bool:
    return sys.platform.startswith("linux") and platform.machine() == "x86_64"


def _arch_prctl(code: int, argument: object) -> int:
    """The syscall's errno, 0 when it succeeded."""
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.syscall(_SYS_ARCH_PRCTL, code, argument) == 0 else ctypes.get_errno()


def permitted() -> int:
    """The xstate components this process may use (a bit mask; 0 where the kernel cannot say)."""
    if not _x86_linux():
        return 0
    mask = ctypes.c_ulong(0)
    if _arch_prctl(_ARCH_GET_XCOMP_PERM, ctypes.byref(mask)):
        return 0  # a kernel before 5.16 has no such permission: nothing to ask for again
    return mask.value


def ask_again(before: int) -> str | None:
    """Ask for AMX's tile data again when `before` (permitted() at the park) held it and this
    process no longer does; None when done or not needed, else why not."""
    if not before & (1 << XTILEDATA) or permitted() & (1 << XTILEDATA):
        return None
    if error := _arch_prctl(_ARCH_REQ_XCOMP_PERM, XTILEDATA):
        return (
            f"the snapshot's process used AMX, and this host refused it AMX's tile data "
            f"(arch_prctl ARCH_REQ_XCOMP_PERM: {os.strerror(error)}): its next bf16 matmul would die by SIGILL"
        )
    return None
