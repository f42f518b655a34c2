"""lipstream.files: a file or folder appears whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipstream.files import atomic_file, atomic_folder


def test_atomic_file_replaces_on_success_and_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as fh:
            fh.write(b"half")
            raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"old"  # the reader still sees the whole old file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]
    with atomic_file(target, "w") as fh:
        fh.write("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


def test_atomic_folder_refuses_an_existing_one_and_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    with pytest.raises(FileExistsError):
        with atomic_folder(final, False, FileExistsError("out exists")):
            pass
    with pytest.raises(RuntimeError):
        with atomic_folder(final, True, FileExistsError("out exists")) as tmp:
            (tmp / "part").write_text("x")
            raise RuntimeError("the build failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and not any(final.iterdir())
    with atomic_folder(final, True, FileExistsError("out exists")) as tmp:
        (tmp / "whole").write_text("x")
    assert [p.name for p in final.iterdir()] == ["whole"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
