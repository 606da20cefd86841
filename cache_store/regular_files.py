"""Reading the files of a cache folder: only regular files, never through a link, never blocking on a FIFO.

A FIFO, device or socket in place of a latent, manifest or index file must not hang the process (an open of a
FIFO for reading waits for a writer forever, with the writer lock held): every such file is checked with lstat
first, and opened with O_NONBLOCK and O_NOFOLLOW so that one swapped in between the check and the open is
refused too. What is refused raises NotRegularFileError (an OSError): callers treat it as a damaged file.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
          | getattr(os, "O_CLOEXEC", 0))


class NotRegularFileError(OSError):
    """A path that is a FIFO, device, socket, folder or symbolic link where a regular file belongs."""


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def refusal(path: Path) -> str | None:
    """Why `path` is not a regular file (None when it is one, or does not exist)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else f"{Path(path).name} is {kind(mode)}, not a regular file"


def is_regular(path: Path) -> bool:
    """True for an existing regular file (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_bytes(path: Path, check: Callable[[BinaryIO, int], None] | None = None) -> bytes:
    """The bytes of a regular file; NotRegularFileError for anything else, FileNotFoundError when missing.

    `check(fh, size)` may judge the file from its size and first bytes and raise before it is read whole."""
    why = refusal(path)
    if why:
        raise NotRegularFileError(errno.EINVAL, why)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link swapped in after the check
            raise NotRegularFileError(errno.ELOOP, f"{Path(path).name} is a symbolic link, not a regular file")
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(errno.EINVAL, f"{Path(path).name} is {kind(info.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            if check is not None:
                check(fh, info.st_size)
                fh.seek(0)
            return fh.read()
    finally:
        os.close(fd)


def read_text(path: Path) -> str:
    """The UTF-8 text of a regular file (as read_bytes)."""
    return read_bytes(path).decode("utf-8")
