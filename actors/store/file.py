"""The store's file: one broker per file (a lock beside it), and SQLite's faults as `StoreError`.

`Store` (actors.store.database) opens its file through `check_file` and `lock`, and runs every
statement on a `Connection`, whose cursors turn an error about the file or the disk (read-only,
full, I/O, damaged) into a `StoreError` naming the file and what was being done.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sqlite3
from collections.abc import Iterator
from typing import Any

from actors.errors import StoreError, StoreInUse


def parts(items: list[Any]) -> Iterator[list[Any]]:
    """`items` in runs within SQLite's bound on a statement's parameters (for `IN (...)`)."""
    for i in range(0, len(items), 500):
        yield items[i : i + 500]


def marks(part: list[Any]) -> str:
    """The `?` placeholders of one run: `IN ({marks(part)})`."""
    return ",".join("?" * len(part))


# --- faults: every SQLite error that is about the file or the disk becomes a StoreError ----------

# Not these: a constraint or API misuse is a bug in the broker, not a fault of its store.
_NOT_FAULTS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)

# sqlite3 binds exact ints, floats and strs as they are, but looks every other parameter up in
# its adapter registry, then tries two attribute lookups on it before binding it unchanged: about
# a microsecond for each None and each bytes value, and a busy broker binds a dozen of them per
# message. An identity adapter answers at the first lookup and binds the same value.
for _type in (type(None), bytes):
    sqlite3.register_adapter(_type, lambda value: value)

_HINTS = {
    "SQLITE_FULL": "free disk space",
    "SQLITE_IOERR": "check the disk: free space, the file size limit (ulimit -f), I/O errors",
    "SQLITE_READONLY": "make the file, its -wal and -shm files and its directory writable",
    "SQLITE_CORRUPT": "the file is damaged; restore it from a backup",
    "SQLITE_NOTADB": "the file is not a broker store; give the broker another path",
    "SQLITE_CANTOPEN": "check that the directory exists and the file can be created there",
    "SQLITE_BUSY": "another process holds the file's write lock",
}


def reason(exc: sqlite3.Error) -> str:
    """What SQLite said, its error code, and what to do about it."""
    code = getattr(exc, "sqlite_errorname", "") or ""
    hint = next((h for prefix, h in _HINTS.items() if code.startswith(prefix)), "")
    return f"{exc} ({code}{'; ' + hint if hint else ''})" if code else str(exc)


def _operation(sql: str) -> str:
    word = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
    return {
        "SELECT": "read",
        "BEGIN": "begin a transaction",
        "COMMIT": "commit",
        "ROLLBACK": "roll back",
        "PRAGMA": "set up",
        "CREATE": "set up",
    }.get(word, "write")


def _fault(path: str, sql: str, exc: sqlite3.Error) -> StoreError:
    return StoreError(path, _operation(sql), reason(exc))


class _Cursor(sqlite3.Cursor):
    """A cursor whose store faults are StoreErrors; rows are read lazily, so fetching can fail
    as well as executing."""

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        self._sql = sql
        return self._guarded(super().execute, sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> _Cursor:
        self._sql = sql
        return self._guarded(super().executemany, sql, seq_of_parameters)

    def executescript(self, sql_script: str, /) -> _Cursor:
        self._sql = sql_script
        return self._guarded(super().executescript, sql_script)

    def _guarded(self, step: Any, *args: Any) -> Any:
        """Run one step of the statement (execute, fetch); a store fault is a StoreError."""
        try:
            return step(*args)
        except _NOT_FAULTS:
            raise
        except sqlite3.Error as exc:
            raise _fault(self.connection.path, getattr(self, "_sql", "SELECT"), exc) from exc

    def fetchone(self) -> Any:
        return self._guarded(super().fetchone)

    def fetchmany(self, size: int = 1) -> list[Any]:
        return self._guarded(super().fetchmany, size)

    def fetchall(self) -> list[Any]:
        return self._guarded(super().fetchall)

    def __next__(self) -> Any:
        return self._guarded(super().__next__)


_execute = sqlite3.Connection.execute  # SQLite's own, no _Cursor


def execute_bare(db: Connection, sql: str) -> None:
    """A statement with no parameters and no rows straight to SQLite, without a cursor (a
    savepoint's, a few per group commit); a mirror's capture, when there is one, still sees it."""
    if db.capture is not None:
        db.capture.execute(_Cursor(db), sql, ())
        return
    try:
        _execute(db, sql)
    except _NOT_FAULTS:
        raise
    except sqlite3.Error as exc:
        raise _fault(db.path, sql, exc) from exc


class Connection(sqlite3.Connection):
    """The store's connection: `execute` and friends run on a `_Cursor`, so a fault anywhere
    is a StoreError naming the file (`path`) and what was being done."""

    path = ""
    # Set by a mirrored broker's principal (actors.mirroring.capture.Capture): it sees every
    # statement, so each committed transaction's writes can be shipped to the mirror.
    capture: Any = None
    # Set while a group commit holds writes back (actors.store.savepoints.HeldWrites): run before
    # the next statement, whatever it is, so that statement sees them.
    before_statement: Any = None

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        if self.before_statement is not None:
            self.before_statement()
        if self.capture is not None:
            return self.capture.execute(_Cursor(self), sql, parameters)
        return _Cursor(self).execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> _Cursor:
        if self.before_statement is not None:
            self.before_statement()
        if self.capture is not None:
            return self.capture.executemany(_Cursor(self), sql, seq_of_parameters)
        return _Cursor(self).executemany(sql, seq_of_parameters)

    def executescript(self, sql_script: str, /) -> _Cursor:
        return _Cursor(self).executescript(sql_script)


# --- one broker per store file ---------------------------------------------------------------
#
# Two brokers on one file would share a broker id and hand out the same sequence numbers. The
# first to open the file takes an exclusive flock on a sidecar `<file>.lock`, held for the Store's
# life. Why flock on a sidecar rather than SQLite's `locking_mode=EXCLUSIVE`: a refusal is
# immediate and can name the holder (written in the lock file), where SQLite's lock makes the
# second broker wait out busy_timeout and then say only "database is locked"; and the file stays
# readable by tools (the sqlite3 shell, a backup) while the broker runs. The OS drops a flock when
# its process dies, so a broker Ray restarts reopens its store at once. flock locks belong to an
# open file description, so two Stores in one process exclude each other too. The lock file
# follows symlinks (realpath) and is never deleted (deleting it could let two brokers lock two
# different files of the same name).


def check_file(path: str) -> None:
    """Refuse, before anything is created, a path that cannot be a store."""
    if os.path.isdir(path):
        raise StoreError(path, "open", "it is a directory", "give the store a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise StoreError(
            path, "open", f"its directory {folder!r} does not exist", "create it, or fix the path"
        )
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return  # a new store
    except OSError as exc:
        raise StoreError(path, "open", exc.strerror or str(exc)) from None
    if head and head != b"SQLite format 3\x00":
        raise StoreError(
            path, "open", "it is not a SQLite file", "give the broker its own store file"
        )


def lock(path: str, holder: str) -> int:
    """Take the store's lock; the open descriptor, which holds it. `StoreInUse` if taken."""
    lock_path = os.path.realpath(path) + ".lock"
    try:
        # O_NOFOLLOW: a link planted where the lock goes would have the broker write elsewhere
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if os.path.islink(lock_path):
            raise StoreError(
                path,
                "open",
                f"its lock file {lock_path!r} is a symbolic link; the lock is the broker's own "
                "file: remove the link",
            ) from None
        raise StoreError(
            path, "open", f"cannot create its lock file {lock_path!r}: {exc.strerror}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _holder(fd)
        os.close(fd)
        name, pid = who.get("broker"), who.get("pid")
        raise StoreInUse(
            path,
            name if isinstance(name, str) and name else None,
            pid if isinstance(pid, int) else None,
        ) from None
    except OSError as exc:
        os.close(fd)
        raise StoreError(path, "open", f"cannot lock {lock_path!r}: {exc.strerror}") from None
    # Who holds it, for the refusal a second broker gets; only a courtesy, so failing is fine.
    me = {"broker": holder, "pid": os.getpid(), "host": socket.gethostname()}
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
    return fd


def _holder(fd: int) -> dict[str, Any]:
    try:
        who = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return who if isinstance(who, dict) else {}


def write_new(path: str, data: bytes) -> None:
    """Write `data` to a new file at `path` and sync it, following no symbolic link: whatever
    stands at `path` (a file a crash left, or a link planted there) is removed first and the file
    is created exclusively, so the bytes land nowhere else. For the files a broker writes beside
    its own and then renames over them (a witness's record, a mirror's rebuilt store)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o644), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sync_directory(path: str) -> None:
    """Sync a directory, so that a file created or renamed in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
