"""Reading `$VESSEL_OUTBOX` back after a call, without trusting what the tool left.

The outbox is read on the host side, from the turn's workspace folder, after
every sandboxed process is dead. A tool controls everything in it, so:

- each entry is opened relative to its already-opened parent directory with
  O_NOFOLLOW (a symlink, at any depth, is never followed) and O_NONBLOCK (a
  fifo cannot hang the worker), then fstat-checked to be a regular file;
- links, fifos, sockets and devices are skipped and named in `skipped`;
- a name (of a file or a folder, which is then not entered) that is not UTF-8,
  or holds a control character (C0, DEL, C1), a line or paragraph separator,
  or a bidirectional-text control, is skipped: such a name would make the
  result's JSON invalid UTF-8, or reach a terminal or a page as an escape
  sequence or reordered text. It is named in `skipped` backslash-escaped
  (`escaped_name`): each byte that is not UTF-8 as `\\xNN`, each of those
  characters as `\\xNN` or `\\uNNNN`, and a backslash as `\\\\`;
- files are returned in name order until `cap_bytes` in total; a file that
  would pass the cap is skipped and named (later, smaller files may still fit);
- at most `MAX_ENTRIES` entries are looked at, so a million empty files cannot
  stall the worker.

Each call's outbox is an empty folder of its own (a turn's call: one from
`WorkspaceStore.new_outbox`, bound at $VESSEL_OUTBOX; a call without a turn:
its one-call workspace's outbox/), so a file comes back from the call that
wrote it only, and it is removed once read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.result import OutboxFile
from workers.sandbox.folders import DIR_FLAGS

__all__ = [
    "DEFAULT_OUTBOX_CAP_BYTES",
    "MAX_ENTRIES",
    "Outbox",
    "collect_outbox",
    "ensure_mount_point",
    "escaped_name",
    "unsafe_name",
]

#: Total bytes of files one result may carry: 10 MiB. The result crosses Redis
#: as base64 JSON (x1.33), and the model-side platform stores it; files beyond
#: belong in a real object store.
DEFAULT_OUTBOX_CAP_BYTES = 10 * 1024 * 1024
#: Entries (files, folders, others) examined per call.
MAX_ENTRIES = 10_000
_READ_CHUNK = 1024 * 1024
#: Looks at the outbox mount point before giving up: each lost race means
#: another call made the folder (done) or a tool keeps replacing it (refused).
_MOUNT_POINT_TRIES = 5
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


#: Format characters that reorder or hide text (bidi embeddings, overrides,
#: isolates and marks): a name holding them displays as another name.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
#: Line and paragraph separators: a new line to whatever displays the name.
_SEPARATORS = frozenset("\u2028\u2029\x85")


def _unsafe_char(char: str) -> bool:
    code = ord(char)
    return (
        code < 0x20
        or 0x7F <= code <= 0x9F  # DEL and the C1 controls (CSI is 0x9b)
        or 0xDC80 <= code <= 0xDCFF  # a byte that is not UTF-8 (os.listdir's surrogateescape)
        or char in _BIDI_CONTROLS
        or char in _SEPARATORS
    )


def unsafe_name(name: str) -> bool:
    """True if `name` (as `os.listdir` gives it) is not UTF-8 or holds a character to refuse."""
    return any(_unsafe_char(c) for c in name)


def escaped_name(name: str) -> str:
    """`name` backslash-escaped: printable, valid UTF-8, and one name for one byte string."""
    out: list[str] = []
    for char in name:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == "\\":
            out.append("\\\\")
        elif _unsafe_char(char):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Outbox:
    files: tuple[OutboxFile, ...]
    skipped: tuple[str, ...]


def ensure_mount_point(path: Path) -> None:
    """Make `path` (the workspace's outbox/) a real folder the call's outbox can cover.

    A tool may have replaced it with a link or a file in an earlier call: those
    go. A folder is left as it is, never removed: a call of the same turn running
    now may have its outbox mounted on it, and removing a mount point detaches
    the mounts on it in every namespace.

    Race-safe: calls of one turn start at once, in threads of one worker and in
    other workers sharing the workspace root, and each makes sure of the same
    folder. A folder made meanwhile by another is the folder wanted; a link
    another call already removed is gone either way.
    """
    for _ in range(_MOUNT_POINT_TRIES):
        try:
            if stat.S_ISDIR(path.lstat().st_mode):
                return
            path.unlink()
        except FileNotFoundError:
            pass
        try:
            path.mkdir(mode=0o700)
            return
        except FileExistsError:
            continue  # made (or replaced) meanwhile: look again
    raise FileExistsError(f"{path} keeps being replaced by something other than a folder")


def _walk(
    dir_fd: int, prefix: str, budget: list[int]
) -> Iterator[tuple[str, int, os.stat_result | None]]:
    """Yield (relative name, parent fd, lstat) for every entry, depth first, sorted.

    An entry with an unsafe name comes with no lstat (a folder is not entered).
    """
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError:
        return
    for name in names:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        rel = f"{prefix}{name}"
        if unsafe_name(name):
            yield rel, dir_fd, None
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                yield rel, dir_fd, st  # reported as skipped below
                continue
            try:
                yield from _walk(sub, f"{rel}/", budget)
            finally:
                os.close(sub)
        else:
            yield rel, dir_fd, st


def _read_regular(name: str, dir_fd: int, limit: int) -> bytes | None:
    """The file's content if it is a regular file of at most `limit` bytes, else None."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None  # a symlink (ELOOP), or gone
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(_READ_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            return None
        return b"".join(chunks)
    finally:
        os.close(fd)


def collect_outbox(path: Path, cap_bytes: int = DEFAULT_OUTBOX_CAP_BYTES) -> Outbox:
    """The regular files under `path` (names relative to it) within `cap_bytes` in total."""
    files: list[OutboxFile] = []
    skipped: list[str] = []
    try:
        root_fd = os.open(path, DIR_FLAGS)
    except OSError:
        return Outbox((), ())  # no outbox (or the tool replaced it with a link)
    remaining = cap_bytes
    budget = [MAX_ENTRIES]
    try:
        for rel, dir_fd, st in _walk(root_fd, "", budget):
            name = rel.rsplit("/", 1)[-1]
            if st is None:
                skipped.append(escaped_name(rel))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append(rel)
                continue
            if st.st_size > remaining:
                skipped.append(rel)
                continue
            data = _read_regular(name, dir_fd, remaining)
            if data is None:
                skipped.append(rel)
                continue
            remaining -= len(data)
            files.append(
                OutboxFile(
                    name=rel,
                    size=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                    content_base64=base64.b64encode(data).decode("ascii"),
                )
            )
        if budget[0] <= 0:
            skipped.append(f"(more than {MAX_ENTRIES} entries: the rest were not read)")
    finally:
        with contextlib.suppress(OSError):
            os.close(root_fd)
    return Outbox(tuple(files), tuple(skipped))
