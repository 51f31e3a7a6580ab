"""Files by path or URL: the local disk, ``file://``, or any file system fsspec reaches
(``hdfs://`` through pyarrow, ``s3://`` with s3fs installed, ...).

A run directory and its partitions are named by one string that the driver and every worker
resolve alike, so on a cluster they must name a file system all of them reach.
"""
from __future__ import annotations

import errno
import os
import reprlib
import stat
import urllib.parse
from typing import IO, Any

import fsspec


def normalize(location: str) -> str:
    """A local path made absolute, ``~`` expanded (``file://`` URLs become paths); other URLs
    as given, once their file system is known to be usable here."""
    if not location.strip():
        raise ValueError(f"store={location!r} must name a directory (or a URL)")
    location = os.path.expanduser(location)
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        return os.path.abspath(urllib.parse.unquote(parsed.path))
    if len(parsed.scheme) <= 1:   # no scheme, or a Windows drive letter
        return os.path.abspath(location)
    try:
        fsspec.get_filesystem_class(parsed.scheme)
    except (ValueError, ImportError) as error:
        raise ValueError(f"store={location!r}: its file system cannot be used here: {error}") from None
    return location


def join(location: str, *parts: str) -> str:
    if "://" in location:
        return "/".join([location.rstrip("/"), *parts])
    return os.path.join(location, *parts)


def _fs(location: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(location)


class UnsafeFileError(ValueError):
    """A path in a run directory that is not what Cerebro writes there: a symbolic link, a
    FIFO, a device or a directory where a regular file of its own belongs, a file with a
    second name, or one larger than any of its kind Cerebro writes. Anyone who could write
    the directory (a shared store, a received tarball) may have put it there: it is named,
    and never followed, blocked on or read without bound (DESIGN invariant 10)."""


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link",
          stat.S_IFREG: "a regular file"}
_REMEDY = "remove it, or restore the run directory from its source"


def _not_regular(location: str, mode: int) -> UnsafeFileError:
    what = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return UnsafeFileError(f"{location} is {what}, not a regular file Cerebro wrote; it is not followed or read "
                           f"({_REMEDY})")


def open_regular(location: str) -> IO:
    """``location`` opened for reading where it is a regular file: a local one without
    following a symbolic link or blocking on a FIFO, its kind checked on the open descriptor
    (so a file swapped after a check is not what is read)."""
    if "://" in location:
        return open_file(location)
    try:
        handle = os.open(location, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _not_regular(location, stat.S_IFLNK) from None
        raise
    mode = os.fstat(handle).st_mode
    if not stat.S_ISREG(mode):
        os.close(handle)
        raise _not_regular(location, mode)
    return os.fdopen(handle, "rb")


def read_regular(location: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``location`` (see :func:`open_regular`); an
    :class:`UnsafeFileError` where it holds more than ``limit`` bytes (it is then read no
    further: a huge file costs no memory)."""
    with open_regular(location) as f:
        content = f.read(-1 if limit is None else limit + 1)
    if limit is not None and len(content) > limit:
        raise UnsafeFileError(f"{location} holds more than {limit:,} bytes, more than any file of its kind "
                              f"Cerebro writes; it is not read")
    return content


def open_append(location: str) -> IO:
    """``location`` opened to append to, made if need be: on a local disk never through a
    symbolic link, and only where it is a regular file with no other name (a hard link to
    another file would be appended to)."""
    if "://" in location:
        return open_file(location, "ab")
    os.makedirs(os.path.dirname(location), exist_ok=True)
    try:
        handle = os.open(location, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _not_regular(location, stat.S_IFLNK) from None
        raise
    found = os.fstat(handle)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(handle)
        if not stat.S_ISREG(found.st_mode):
            raise _not_regular(location, found.st_mode)
        raise UnsafeFileError(f"{location} has {found.st_nlink} names (hard links): appending to it would change "
                              f"another file; it is not written ({_REMEDY})")
    return os.fdopen(handle, "ab")


def refuse_links(root: str, location: str) -> str:
    """``location``, after checking that each directory between ``root`` (a run directory,
    itself perhaps a link the user made) and it is a plain directory, not a symbolic link:
    Cerebro never writes into a directory someone pointed elsewhere. URLs are returned as
    they are (object stores have no links)."""
    if "://" in location:
        return location
    relative = os.path.relpath(location, root)
    if relative == os.curdir or relative.startswith(os.pardir):
        raise ValueError(f"{location} is not inside the run directory {root}")
    here = root
    for part in relative.split(os.sep)[:-1]:
        here = os.path.join(here, part)
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return location         # made below as a plain directory
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(f"{here} is {_KINDS.get(stat.S_IFMT(mode), 'no directory')}, where Cerebro keeps "
                                  f"a directory of its own; nothing is written through it ({_REMEDY})")
    return location


def open_file(location: str, mode: str = "rb") -> IO:
    fs, path = _fs(location)
    if "w" in mode or "a" in mode:
        fs.makedirs(fs._parent(path), exist_ok=True)
    return fs.open(path, mode)


def exists(location: str) -> bool:
    fs, path = _fs(location)
    return fs.exists(path)


def signature(location: str) -> tuple[Any, ...] | None:
    """What tells a changed file from the one read before: its size and modification time
    (or the store's tag for its version); None where it does not exist."""
    fs, path = _fs(location)
    try:
        info = fs.info(path)
    except (OSError, ValueError):
        return None
    return (info.get("size"), info.get("mtime"), info.get("LastModified"), info.get("ETag"), info.get("etag"))


def is_empty_dir(location: str) -> bool | None:
    """True for an empty directory, False for one with entries, None if it is no directory."""
    fs, path = _fs(location)
    return (len(fs.ls(path)) == 0) if fs.isdir(path) else None


def listdir(location: str) -> list[str]:
    """The names in the directory ``location``, sorted; none where it does not exist."""
    fs, path = _fs(location)
    if not fs.isdir(path):
        return []
    return sorted(str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False))


def makedirs(location: str) -> None:
    fs, path = _fs(location)
    fs.makedirs(path, exist_ok=True)


def write_atomic(location: str, blob: bytes | None = None, writer: Any = None, durable: bool = True) -> None:
    """Write ``blob`` (or call ``writer(file)``) to a temporary name, then move it in place,
    so readers never see half a file. The move is atomic on local file systems; on HDFS it
    deletes the old file first, so a crash in between leaves only the ``.tmp`` file.
    ``durable=False`` skips the flush to disk, for a file a crash may lose (``live.json``)."""
    fs, path = _fs(location)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with _new_file(location) if "://" not in location else fs.open(path + ".tmp", "wb") as f:
        if writer is not None:
            writer(f)
        else:
            f.write(blob)
        if durable:
            sync(f)
    if "://" in location:
        fs.mv(path + ".tmp", path)
    else:        # not fsspec's mv (shutil.move): it moves into a directory, or one a link names
        _replace(location + ".tmp", location)


def _new_file(location: str) -> IO:
    """``location + ".tmp"`` made anew for writing: a symlink or a hard link someone put
    there is removed, not written through (nothing Cerebro writes lands in a file an
    attacker who can write the run directory points it to)."""
    temporary = location + ".tmp"
    if os.path.lexists(temporary):
        try:
            os.remove(temporary)
        except IsADirectoryError:
            raise _not_regular(temporary, stat.S_IFDIR) from None
    return os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb")


def _replace(source: str, target: str) -> None:
    """``os.replace``, where ``target`` may be anything someone put there: a directory (or
    another kind of file that cannot be replaced) is named, and the temporary file removed."""
    try:
        os.replace(source, target)
    except (IsADirectoryError, NotADirectoryError, PermissionError) as error:
        os.remove(source)
        if isinstance(error, PermissionError):
            raise
        raise _not_regular(target, os.lstat(target).st_mode) from None


def sync(file: IO) -> None:
    """Flush ``file`` to the disk where it is a local file (a crash of the machine then
    loses nothing written before); other file systems persist on close."""
    file.flush()
    try:
        os.fsync(file.fileno())
    except (AttributeError, OSError, ValueError, NotImplementedError):
        pass


def move(source: str, target: str) -> None:
    """Rename ``source`` to ``target``, replacing whatever is there (a symbolic link itself,
    never what it names)."""
    if "://" not in source and "://" not in target:
        _replace(source, target)      # not shutil.move: it moves into a directory a link names
        return
    fs, path = _fs(source)
    fs.mv(path, _fs(target)[1])


def link_atomic(source: str, target: str) -> None:
    """Make ``target`` a second name of the file ``source`` (a hard link on a local disk, a
    copy elsewhere), put in place as :func:`write_atomic` does."""
    if "://" not in source and "://" not in target:
        if os.path.islink(source):     # a link to it would be a second name of the symlink
            raise OSError(errno.ELOOP, f"{source} is a symlink, not a file Cerebro wrote", source)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target + ".tmp"):
            os.remove(target + ".tmp")
        os.link(source, target + ".tmp")
        os.replace(target + ".tmp", target)
        return
    fs, path = _fs(target)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.copy(_fs(source)[1], path + ".tmp")
    fs.mv(path + ".tmp", path)


def remove(location: str) -> None:
    """Remove the file ``location`` if it is there: on a local disk the name itself (a
    symbolic link, never what it names); a directory is no file Cerebro wrote, and is left."""
    if "://" in location:
        fs, path = _fs(location)
        if fs.exists(path):
            fs.rm(path)
        return
    try:
        mode = os.lstat(location).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise _not_regular(location, mode)
    os.unlink(location)


def remove_tree(location: str) -> None:
    """Remove the file or directory ``location`` with everything in it, if it exists."""
    fs, path = _fs(location)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def check_output(path: str | os.PathLike, name: str) -> str:
    """``path`` as a string, where a file can be written: fail before any work, naming the
    argument, where it is a directory or its directory does not exist (a URL is the store's
    to judge when written)."""
    path = os.fspath(path)
    if "://" in path:
        return path
    if os.path.isdir(path):
        raise ValueError(f"{name}={path!r} is a directory; give the path of a file to write")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{name}={path!r}: its directory {parent!r} does not exist; create it first")
    return path


def check_location(name: str, location: Any) -> None:
    """Fail, naming the argument, where ``location`` is not a path or URL (e.g. arguments
    given in the wrong order)."""
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"{name}={reprlib.repr(location)} must be a path or URL (a str or os.PathLike), "
                        f"not {type(location).__name__}")
