"""The id-maps of id-mapped mounts: one user namespace per map and process, made once (a view's
opening needs one at every task start, and making one starts two processes)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.sandbox import idmap
from tests.sandbox.conftest import needs_sandbox, sandbox_missing

pytestmark = needs_sandbox


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int, int, int]]]:
    """The namespaces made (their maps), from a process that kept none yet."""
    reason = sandbox_missing()
    if reason is not None:
        pytest.skip(f"no sandbox here: {reason}")
    monkeypatch.setattr(idmap, "_mappings", {})
    calls: list[tuple[int, int, int, int]] = []
    real = idmap._new_mapping

    def counted(uid: int, gid: int, disk_uid: int, disk_gid: int) -> int:
        calls.append((uid, gid, disk_uid, disk_gid))
        return real(uid, gid, disk_uid, disk_gid)

    monkeypatch.setattr(idmap, "_new_mapping", counted)
    yield calls
    for fd in idmap._mappings.values():
        os.close(fd)


def _namespace(fd: int) -> int:
    return os.fstat(fd).st_ino


def test_the_same_map_is_made_once_and_each_caller_gets_its_own_fd(made: list[tuple[int, int, int, int]]) -> None:
    first = idmap.userns_mapping(61001, 61001)
    second = idmap.userns_mapping(61001, 61001)
    other = idmap.userns_mapping(61002, 61002)
    try:
        assert made == [(61001, 61001, 0, 0), (61002, 61002, 0, 0)]
        assert first != second
        assert _namespace(first) == _namespace(second) != _namespace(other)
        assert not os.get_inheritable(first)
    finally:
        for fd in (first, second, other):
            os.close(fd)
    again = idmap.userns_mapping(61001, 61001)  # the callers' copies closed: the kept one still serves
    os.close(again)
    assert len(made) == 2


def test_a_kept_map_still_shows_roots_files_as_the_users(made: list[tuple[int, int, int, int]], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for _ in range(2):
        fd = idmap.clone_tree(tmp_path, uid=61003, gid=61004)
        try:
            st = os.stat("file", dir_fd=fd)
            assert (st.st_uid, st.st_gid) == (61003, 61004)
        finally:
            os.close(fd)
    assert len(made) == 1


def test_no_more_maps_are_kept_than_the_bound(made: list[tuple[int, int, int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idmap, "_KEPT_MAPPINGS", 2)
    for uid in (61005, 61006, 61007):
        os.close(idmap.userns_mapping(uid, uid))
    assert list(idmap._mappings) == [(61006, 61006, 0, 0), (61007, 61007, 0, 0)]
    os.close(idmap.userns_mapping(61005, 61005))  # let go: made again
    assert [key[0] for key in made] == [61005, 61006, 61007, 61005]
