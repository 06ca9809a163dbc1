"""What a task's start, seal and release read many times (a layer's meta, the data directory's
paths, the mount table, the user database) is read once, and never stale."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.layers import mounts, paths, tree
from tasks.layers.tree import Meta, write_atomically
from tasks.sandbox import accounts, users
from tasks.sandbox import paths as sandbox_paths


def _count_parses(monkeypatch: Any) -> list[bytes]:
    parsed: list[bytes] = []
    real = json.loads

    def counting(raw: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(raw)
        return real(raw, *args, **kwargs)

    monkeypatch.setattr(tree.json, "loads", counting)
    return parsed


def test_a_sealed_layers_meta_is_parsed_once_and_a_replaced_one_is_read_again(tmp_path, monkeypatch):
    Meta(format="portable", driver="copy", deleted={"gone"}, sealed=True).save(tmp_path)
    parsed = _count_parses(monkeypatch)
    first, second = Meta.load(tmp_path), Meta.load(tmp_path)
    assert (first.sealed, second.deleted) == (True, {"gone"})
    assert len(parsed) == 1
    second.deleted.add("mine")  # each caller gets its own copy to change
    assert Meta.load(tmp_path).deleted == {"gone"}

    # another process reopens the layer (written without this process's Meta.save)
    body = {"format": "portable", "driver": "copy", "deleted": ["gone"], "opaque": [], "sealed": False}
    write_atomically(tmp_path / "meta.json", json.dumps(body).encode())
    assert not Meta.load(tmp_path).sealed
    assert not Meta.load(tmp_path).sealed
    assert len(parsed) == 3  # an unsealed meta is read every time: its task still writes


def test_a_sealed_meta_converted_to_native_markers_is_seen_converted(tmp_path):
    meta = Meta(format="portable", driver="copy", deleted={"a", "b/c"}, sealed=True)
    meta.save(tmp_path)
    assert Meta.load(tmp_path).format == "portable"
    body = {"format": "native", "driver": "copy", "deleted": [], "opaque": [], "sealed": True}
    write_atomically(tmp_path / "meta.json", json.dumps(body).encode())
    assert (Meta.load(tmp_path).format, Meta.load(tmp_path).deleted) == ("native", set())


def test_a_deleted_layer_has_no_meta(tmp_path):
    Meta(sealed=True).save(tmp_path)
    assert Meta.load(tmp_path).sealed
    (tmp_path / "meta.json").unlink()
    assert not Meta.load(tmp_path).sealed


def test_paths_follow_the_data_directory_setting_when_it_changes(settings, tmp_path):
    settings.BOX_DATA_DIR = tmp_path / "one"
    settings.BOX_LOCAL_DIR = ""
    assert paths.layer_dir("t1") == tmp_path / "one" / "layers" / "t1"
    assert sandbox_paths.local_dir() == tmp_path / "one"
    settings.BOX_DATA_DIR = str(tmp_path / "two")
    assert paths.layer_dir("t1") == tmp_path / "two" / "layers" / "t1"
    assert paths.view_dir("t1") == tmp_path / "two" / "tasks" / "t1" / "view"
    assert sandbox_paths.local_dir() == tmp_path / "two"
    settings.BOX_LOCAL_DIR = str(tmp_path / "local")
    assert paths.view_dir("t1") == tmp_path / "local" / "tasks" / "t1" / "view"
    assert sandbox_paths.runtime_dir("t1") == tmp_path / "local" / "run" / "t1"


TABLE = """\
22 1 0:21 / / rw,relatime - ext4 /dev/root rw
30 22 0:40 / /data/tasks/a/view rw - overlay overlay rw
31 22 0:41 / /data/mounts/a/_/0 ro - ext4 /dev/root rw
32 22 0:42 / /data/mounts/a/_/1 ro - ext4 /dev/root rw
33 22 0:43 / /data/tasks/b/view rw - overlay overlay rw
34 22 0:44 / /data/tasks/with\\040space/view rw - overlay overlay rw
35 22 0:45 / /data/tasks/ab/view rw - overlay overlay rw
"""


def test_the_mount_table_is_read_once_for_several_places_each_in_unmounting_order(monkeypatch):
    reads: list[int] = []

    def table() -> str:
        reads.append(1)
        return TABLE

    monkeypatch.setattr(mounts, "_mount_table", table)
    found = mounts.mounts_under(Path("/data/tasks/a"), Path("/data/mounts/a"))
    assert found == [Path("/data/tasks/a/view"), Path("/data/mounts/a/_/0"), Path("/data/mounts/a/_/1")]
    assert len(reads) == 1
    assert mounts.mounts_under(Path("/data/tasks/with space")) == [Path("/data/tasks/with space/view")]
    assert mounts.mounts_under(Path("/data/tasks/c"), Path("/elsewhere")) == []
    assert mounts.is_mounted(Path("/data/tasks/b/view"))
    assert not mounts.is_mounted(Path("/data/tasks/b"))


def test_the_pool_is_read_again_once_the_user_database_changes(monkeypatch, tmp_path):
    passwd = tmp_path / "passwd"
    passwd.write_text("one\n")
    listed: list[list[Any]] = [[_account("box-x-0", "m")]]
    monkeypatch.setattr(accounts, "_PASSWD", str(passwd))
    monkeypatch.setattr(accounts, "_accounts_seen", None)
    monkeypatch.setattr(accounts.pwd, "getpwall", lambda: listed[-1])
    monkeypatch.setattr(accounts, "box_marker", lambda local_dir=None: "m")
    assert [i.name for i in users.pool_users()] == ["box-x-0"]
    listed.append([_account("box-x-0", "m"), _account("box-x-1", "m"), _account("someone", "m")])
    passwd.write_text("one\ntwo\n")  # useradd rewrites the file
    assert [i.name for i in users.pool_users()] == ["box-x-0", "box-x-1"]
    listed.append([])
    assert [i.name for i in users.pool_users()] == ["box-x-0", "box-x-1"]  # the file did not change


def _account(name: str, comment: str) -> Any:
    return accounts.pwd.struct_passwd((name, "x", 200000, 200000, comment, "/nonexistent", "/usr/sbin/nologin"))
