"""The local artifact store makes every name durable: bytes fsynced before a link or rename, the folder after."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from revgate.registry.build import build_manifest
from revgate.registry.store import open_store


def _spy(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[str]:
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append("fsync-folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def named(kind: str, real: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def call(source: Any, target: Any) -> None:
            events.append(f"{kind} {Path(target).relative_to(root)}")
            real(source, target)
        return call

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", named("link", os.link))
    monkeypatch.setattr(os, "rename", named("rename", os.rename))
    return events


def test_push_fsyncs_each_object_before_its_link_and_the_folder_after(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    manifest = build_manifest(model)
    events = _spy(monkeypatch, tmp_path)
    open_store(str(tmp_path / "store")).push(model, manifest)
    links = [index for index, event in enumerate(events) if event.startswith("link")]
    assert len(links) == 2  # the blob and the manifest
    for index in links:
        assert events[index - 1] == "fsync-file" and events[index + 1] == "fsync-folder"


def test_pull_fsyncs_files_and_folders_before_the_rename_and_the_parent_after(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "weights.bin").write_bytes(b"w" * 100)
    manifest = build_manifest(model)
    store = open_store(str(tmp_path / "store"))
    store.push(model, manifest)
    events = _spy(monkeypatch, tmp_path)
    store.pull(manifest.digest, tmp_path / "pulled")
    assert events == ["fsync-file", "fsync-folder", "fsync-folder", "rename pulled", "fsync-folder"]
