"""Route stores: a local file store (the embedded default) and an S3 store, both compare-and-swap.

Layout, the same in both: ``<route>/history/<generation>.json`` keeps every committed generation and
is the commit point; ``<route>/current.json`` is a copy of the newest, for fast reads. The protocol
that keeps them consistent and self-healing is in :mod:`registry.route_log`.

Deliberately free of model_signing, sigstore and mlflow: the router imports this module.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from revgate.manifests.route import ROUTE_NAME, RouteSnapshot, RouteStore, RouteStoreUnavailable
from revgate.registry import route_log
from revgate.registry.durable import create_file, replace_file


def check_route(route: str) -> None:
    """Refuse a route name that is not a safe folder or key name."""
    if not ROUTE_NAME.match(route):
        raise RouteStoreUnavailable(
            f"route name {route!r} is not valid", fix="Use 1-63 of a-z 0-9 . _ - starting with a letter or digit."
        )


class FileObjects:
    """One route's folder; writers hold the route's lock, so a version tag is not needed."""

    def __init__(self, folder: Path, route: str) -> None:
        self.folder = folder
        self.route = route

    def where(self, name: str) -> str:
        """The file's path."""
        return str(self.folder / name)

    def get(self, name: str) -> tuple[bytes, str] | None:
        """The file's bytes."""
        try:
            return (self.folder / name).read_bytes(), "file"
        except FileNotFoundError:
            return None
        except OSError as error:
            raise RouteStoreUnavailable(f"cannot read route snapshot: {error}", where=self.where(name)) from None

    def generations(self) -> list[int]:
        """Generations with a history file."""
        folder = self.folder / route_log.HISTORY
        found = (route_log.generation_of(path.name) for path in folder.glob("*.json")) if folder.is_dir() else ()
        return sorted(generation for generation in found if generation is not None)

    def put_new(self, name: str, data: bytes) -> bool:
        """Create the file durably unless it exists."""
        return self._guarded(name, lambda path: create_file(path, data))

    def put_over(self, name: str, data: bytes, tag: str | None) -> bool:
        """Replace the file durably (the lock, not the tag, keeps writers apart)."""
        def replace(path: Path) -> bool:
            replace_file(path, data)
            return True

        return self._guarded(name, replace)

    def _guarded(self, name: str, write: Callable[[Path], bool]) -> bool:
        path = self.folder / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return write(path)
        except OSError as error:
            raise RouteStoreUnavailable(f"cannot write route snapshot: {error}", where=str(path)) from None


class FileRouteStore:
    """Snapshots in a directory; writes are durable links and renames under an exclusive lock."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _objects(self, route: str) -> FileObjects:
        check_route(route)
        return FileObjects(self.root / route, route)

    def read(self, route: str) -> RouteSnapshot | None:
        """The newest committed snapshot, None when the route has none; ManifestInvalid when none is readable."""
        return route_log.read(self._objects(route))

    def write(self, snapshot: RouteSnapshot) -> None:
        """Commit the next generation; RouteConflict (and nothing changed) on a stale generation."""
        objects = self._objects(snapshot.route)
        with _locked(self.root):
            route_log.commit(objects, snapshot)

    def history(self, route: str) -> list[RouteSnapshot]:
        """Every readable committed generation, oldest first, ending with the newest."""
        return route_log.history(self._objects(route))

    def back(self, route: str) -> Iterator[RouteSnapshot]:
        """The newest committed snapshot, then older generations, each read only when asked for."""
        return route_log.back(self._objects(route))

    def routes(self) -> list[str]:
        """The routes with at least one committed generation, sorted."""
        try:
            folders = sorted(entry.name for entry in self.root.iterdir() if entry.is_dir())
        except FileNotFoundError:
            return []
        except OSError as error:
            raise RouteStoreUnavailable(f"cannot list routes: {error}", where=str(self.root)) from None
        return [name for name in folders if ROUTE_NAME.match(name) and self._objects(name).generations()]


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Writers of every route in ``root`` one at a time: a lock on the folder itself, so no lock file
    appears and a refused write leaves the store exactly as it was."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise RouteStoreUnavailable(f"cannot lock the route store: {error}", where=str(root)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def open_route_store(url: str) -> RouteStore:
    """A store from a URL: ``s3://bucket/prefix[?endpoint_url=...]``, ``file:///dir`` or a plain directory."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from revgate.registry.route_store_s3 import S3RouteStore  # deferred: only S3 users pay for importing boto3

        if not parts.netloc:
            raise RouteStoreUnavailable("S3 route store URL names no bucket", where=url, fix="Use s3://BUCKET/PREFIX.")
        endpoint = parse_qs(parts.query).get("endpoint_url", [None])[0]
        return S3RouteStore(parts.netloc, parts.path, endpoint_url=endpoint)
    if parts.scheme in ("file", ""):
        return FileRouteStore(Path(parts.path if parts.scheme else url))
    raise RouteStoreUnavailable(
        f"unsupported route store scheme {parts.scheme!r}", where=url, fix="Use a directory, file:///DIR or s3://BUCKET/PREFIX."
    )
