"""The backup file: one tar archive, its manifest first.

    manifest.json             format, version, time, database kind, the database member's digest
    database/box.sqlite3      the SQLite snapshot (or database/box.pgdump, pg_dump's custom format)
    data/...                  the data directory's files, owners, modes, times and extended
                              attributes kept (overlayfs marks opaque directories with one)

A tar file, not a compressed one: layers are mostly what tasks wrote, and an owner who wants it
smaller pipes it through the compressor of their choice. Extended attributes travel as pax
headers (``SCHILY.xattr.<name>``, as GNU tar writes them), put back after extraction.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import IO, Any

FORMAT = "box-backup"
VERSION = 1
MANIFEST = "manifest.json"
DATA = "data"
XATTR = "SCHILY.xattr."


class ArchiveError(Exception):
    """The file is not a backup this box can restore; the message says why."""


class Unreadable(Exception):
    """Something a backup must hold cannot be read (``_xattrs``): the backup is not taken; the
    message says what and what to do."""


@dataclass(frozen=True)
class Manifest:
    created_at: str
    database: str
    database_member: str
    database_sha256: str
    vault_key: str  # "file": in the archive; "environment": BOX_SECRET_KEY, not in it
    migrations: dict[str, str]

    def as_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "version": VERSION, **self.__dict__}, indent=2).encode()


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Writer:
    """Adds members to a new archive at ``path`` (written aside, renamed into place at the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.with_name(f".{path.name}.partial")
        fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the vault key
        self.tar = tarfile.open(fileobj=os.fdopen(fd, "wb"), mode="w", format=tarfile.PAX_FORMAT)
        self.skipped = 0

    def add_bytes(self, name: str, content: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(content), 0o600, int(datetime.now().timestamp())
        self.tar.addfile(info, io.BytesIO(content))

    def add_file(self, name: str, path: Path) -> None:
        info = self.tar.gettarinfo(str(path), name)
        with path.open("rb") as handle:
            self.tar.addfile(info, handle)

    def add_tree(self, paths: Iterable[Path], root: Path) -> None:
        """Each of ``paths`` (under ``root``) as ``data/<relative path>``."""
        for path in paths:
            self.add_path(f"{DATA}/{path.relative_to(root)}" if path != root else DATA, path)

    def add_path(self, name: str, path: Path) -> None:
        try:
            info = self.tar.gettarinfo(str(path), name)
        except FileNotFoundError:  # gone since it was listed
            return
        if info is None:  # a socket: made again by whoever listens on it
            return
        info.uname = info.gname = ""  # numeric owners: task users are named per machine
        info.pax_headers = _xattrs(path)
        if not info.isreg():
            self.tar.addfile(info)
            return
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            return
        except PermissionError:
            self.skipped += 1
            return
        with handle:
            # A file that shrinks while it is read (a running task's) is padded to the size the
            # header says, so the archive stays whole.
            self.tar.addfile(info, _Exactly(handle, info.size))

    def close(self) -> None:
        self.tar.close()
        assert self.tar.fileobj is not None
        self.tar.fileobj.close()
        os.replace(self.partial, self.path)

    def abandon(self) -> None:
        try:
            self.tar.close()
        finally:
            self.partial.unlink(missing_ok=True)


class _Exactly(io.RawIOBase):
    def __init__(self, handle: IO[bytes], size: int) -> None:
        self.handle, self.left = handle, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.handle.read(n)[:n]
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= n
        return data


def _xattrs(path: Path) -> dict[str, str]:
    """``path``'s extended attributes as pax headers. One that cannot be read fails the backup
    (``Unreadable``): a restore without it would not give the files back as they were (a lost
    overlay "opaque" mark brings a deleted folder's contents back into the task's view)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return {}  # gone since it was listed: nothing of it is kept
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}  # a file system without extended attributes: there are none to keep
        raise Unreadable(f"{path}: its extended attributes cannot be listed ({exc.strerror}); "
                         "run backup as the user the box runs as") from None
    found = {}
    for name in names:
        try:
            value = os.getxattr(path, name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.ENODATA, errno.ENOENT):
                continue  # removed since it was listed (the attribute, or the file): not there to keep
            raise Unreadable(f"{path}: its extended attribute {name} cannot be read ({exc.strerror}), and a "
                             "restore without it would not give the files back as they were; run backup as "
                             "the user the box runs as") from None
        found[XATTR + name] = value.decode("utf-8", "surrogateescape")
    return found


# --- reading -------------------------------------------------------------------------------

class Reader:
    """A backup opened for restore: the manifest read and every member's name checked before
    anything is written."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise ArchiveError(f"{path}: no such file")
        try:
            self.tar = tarfile.open(path, mode="r:")
        except tarfile.TarError as exc:
            raise ArchiveError(f"{path} is not a tar archive ({exc}); a backup is the .tar file "
                               "'manage.py backup' wrote") from None
        try:
            self.members = self.tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ArchiveError(f"{path} is damaged or cut short ({exc}): take the backup again") from None
        if not self.members or self.members[0].name != MANIFEST:
            raise ArchiveError(f"{path} is a tar archive but not a box backup: it does not start with {MANIFEST}")
        self.manifest = self._read_manifest()
        self._check_names()
        self._check_database()

    def _read_manifest(self) -> Manifest:
        raw = self._read(self.members[0])
        try:
            data: dict[str, Any] = json.loads(raw)
        except ValueError:
            raise ArchiveError(f"its {MANIFEST} is not JSON") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ArchiveError(f"its {MANIFEST} is not a box backup's manifest")
        if data.get("version") != VERSION:
            raise ArchiveError(f"it is a backup of format version {data.get('version')!r}; this box restores "
                               f"version {VERSION}: restore it with the box version that made it")
        try:
            return Manifest(**{key: data[key] for key in Manifest.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise ArchiveError(f"its {MANIFEST} lacks {exc}") from None

    def _check_names(self) -> None:
        """Every member under data/ or the database member; nothing climbs out or through a link."""
        links: set[PurePosixPath] = set()
        for member in self.members[1:]:
            name = PurePosixPath(member.name)
            if name.is_absolute() or ".." in name.parts:
                raise ArchiveError(f"member {member.name!r} points outside the data directory: refused")
            if member.name != self.manifest.database_member and name.parts[0] != DATA:
                raise ArchiveError(f"member {member.name!r} is not part of a box backup")
            if any(parent in links for parent in name.parents):
                raise ArchiveError(f"member {member.name!r} lies under a link in the archive: refused")
            if member.issym() or member.islnk():
                links.add(name)
            if member.islnk() and PurePosixPath(member.linkname).parts[:1] != (DATA,):
                raise ArchiveError(f"hard link {member.name!r} points outside the data directory: refused")
            if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.ischr()
                    or member.isblk() or member.isfifo()):
                raise ArchiveError(f"member {member.name!r} is of a kind a backup never holds")
        if self.manifest.database_member not in {member.name for member in self.members}:
            raise ArchiveError(f"it has no {self.manifest.database_member}: the database is missing, take the backup again")

    def _read(self, member: tarfile.TarInfo) -> bytes:
        handle = self.tar.extractfile(member)
        if handle is None:
            raise ArchiveError(f"{member.name} is not a file")
        try:
            return handle.read()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ArchiveError(f"{member.name} is damaged or cut short ({exc})") from None

    def _check_database(self) -> None:
        """The database member is the one the manifest describes, before anything is written."""
        self._copy_database(None)

    def extract_database(self, into: Path) -> None:
        """The database snapshot into the file ``into``, its digest checked again."""
        with into.open("wb") as out:
            self._copy_database(out)

    def _copy_database(self, out: IO[bytes] | None) -> None:
        member = self.tar.getmember(self.manifest.database_member)
        handle = self.tar.extractfile(member)
        if handle is None:
            raise ArchiveError(f"{member.name} is not a file")
        digest = hashlib.sha256()
        try:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                if out is not None:
                    out.write(chunk)
        except (tarfile.TarError, EOFError) as exc:
            raise ArchiveError(f"{member.name} is damaged or cut short ({exc})") from None
        if digest.hexdigest() != self.manifest.database_sha256:
            raise ArchiveError(f"{member.name} does not match the digest its manifest gives: the archive is damaged")

    def extract_data(self, into: Path) -> int:
        """The data directory's members into ``into`` (owners, modes, times, extended attributes
        kept as far as this process may set them); returns how many attributes could not be set."""
        members = [m for m in self.members[1:] if PurePosixPath(m.name).parts[0] == DATA and m.name != DATA]
        for member in members:
            member.name = str(PurePosixPath(member.name).relative_to(DATA))
            if member.islnk():
                member.linkname = str(PurePosixPath(member.linkname).relative_to(DATA))
        try:
            # Names and links were checked above (_check_names); modes and owners are kept as
            # they were, set-id bits included: a layer is the task's files, exactly.
            self.tar.extractall(into, members=members, numeric_owner=True, filter="fully_trusted")
        except (tarfile.TarError, EOFError) as exc:
            raise ArchiveError(f"the data directory's files are damaged or cut short ({exc})") from None
        missed = 0
        for member in members:
            for key, value in member.pax_headers.items():
                if key.startswith(XATTR):
                    try:
                        os.setxattr(into / member.name, key[len(XATTR):], value.encode("utf-8", "surrogateescape"),
                                    follow_symlinks=False)
                    except OSError:
                        missed += 1
        return missed

    def close(self) -> None:
        self.tar.close()


def digest_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
