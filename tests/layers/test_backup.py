"""manage.py backup and restore: a box with finished tasks (and an upload) is backed up, restored
into a new data directory and database, and the restored box shows the same workspace and
undoes a task there; a bad archive or a non-empty target is refused with a clear reason, and
an extended attribute the backup cannot read fails it."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection

from tests.cluster import MANAGE
from tests.conftest import database_env, track_data_dir
from tests.factories import flow
from tests.layers.conftest import read

# Run inside the restored box: the owner's token undoes a task through the API and reads the
# workspace before and after, as the owner's client would.
RESTORED_BOX = """
import json, sys
from rest_framework.test import APIClient
token, task_id = sys.argv[1], sys.argv[2]
api = APIClient()
api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
def read(path):
    answer = api.get("/api/workspaces/repo/files", {"path": path})
    return answer.json()["content"] if answer.status_code == 200 else None
before = {p: read(p) for p in ("base.txt", "a.txt", "b.txt", "c.txt", "up.txt")}
undone = api.post(f"/api/tasks/{task_id}/undo")
after = {p: read(p) for p in ("base.txt", "a.txt", "b.txt", "c.txt", "up.txt")}
print(json.dumps({"before": before, "undo": undone.status_code, "state": undone.json().get("state"), "after": after}))
"""


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, MANAGE, *args], env=env, cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def new_box_env(tmp_path, driver):
    """The environment of a second box: its own data directory and its own, empty, database."""
    env = {key: value for key, value in database_env().items() if key not in ("BOX_SQLITE_PATH", "DJANGO_SECRET_KEY")}
    env["BOX_DATA_DIR"] = str(tmp_path / "restored")
    env["BOX_LAYER_DRIVER"] = driver
    track_data_dir(env["BOX_DATA_DIR"])
    database = None
    if settings.DB_IS_POSTGRES:
        database = f"{connection.settings_dict['NAME']}_restored"
        _psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        _psql(f"CREATE DATABASE {database}")
        env["BOX_DATABASE_NAME"] = database
    yield env
    if database:
        _psql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def _psql(sql: str) -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", sql], check=True)


def test_a_restored_box_shows_the_workspace_and_undoes_a_task(lbox, tmp_path, new_box_env, driver):
    source = tmp_path / "source"
    source.mkdir()
    (source / "base.txt").write_text("base\n")
    assert lbox.api.post("/api/workspaces", {"name": "repo", "importFrom": str(source)}, format="json").status_code == 201
    first = lbox.create(title="write two", workspace="repo",
                        flow=flow({"write": {"path": "a.txt", "content": "one"}}, {"write": {"path": "b.txt", "content": "two"}}))
    assert lbox.wait_state(first["id"], "done")["state"] == "done"
    second = lbox.create(title="delete one, add one", workspace="repo",
                         flow=flow({"delete": "b.txt"}, {"write": {"path": "c.txt", "content": "three"}}))
    assert lbox.wait_state(second["id"], "done")["state"] == "done"
    assert lbox.api.put("/api/workspaces/repo/files/up.txt", b"uploaded", content_type="text/plain").status_code in (200, 201)
    here = {p: read(lbox, p, workspace="repo") for p in ("base.txt", "a.txt", "b.txt", "c.txt", "up.txt")}
    assert here == {"base.txt": "base\n", "a.txt": "one", "b.txt": None, "c.txt": "three", "up.txt": "uploaded"}

    archive = tmp_path / "box.tar"
    taken = _manage({**database_env(), "BOX_LAYER_DRIVER": driver}, "backup", "--output", str(archive))
    assert taken.returncode == 0, taken.stderr
    assert "backup written to" in taken.stdout and archive.stat().st_mode & 0o777 == 0o600

    restored = _manage(new_box_env, "restore", str(archive))
    assert restored.returncode == 0, restored.stderr
    assert "restored the backup of" in restored.stdout

    answer = _manage(new_box_env, "shell", "-c", RESTORED_BOX.replace("sys.argv[1], sys.argv[2]", f"{lbox.token!r}, {second['id']!r}"))
    assert answer.returncode == 0, answer.stderr
    result = json.loads(answer.stdout.strip().splitlines()[-1])
    assert result["before"] == here  # the restored box sees the workspace as the first one did
    assert (result["undo"], result["state"]) == (200, "undone")
    # The second task's changes are gone (b.txt back, c.txt gone); everything else stayed.
    assert result["after"] == {**here, "b.txt": "two", "c.txt": None}
    # ... in the restored box only: the original is untouched.
    assert read(lbox, "b.txt", workspace="repo") is None

    again = _manage(new_box_env, "restore", str(archive))  # the restored box is no longer empty
    assert again.returncode != 0 and "is not empty" in again.stderr


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def _refused(path: Path) -> str:
    with pytest.raises(CommandError) as refused:
        call_command("restore", str(path))
    return str(refused.value)


def test_a_bad_archive_is_refused_with_the_reason(lbox, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    assert lbox.api.post("/api/workspaces", {"name": "repo", "importFrom": str(source)}, format="json").status_code == 201
    assert "no such file" in _refused(tmp_path / "missing.tar")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"this is not a tar archive at all" * 50)
    assert "is not a tar archive" in _refused(junk)
    assert "not a box backup" in _refused(_tar(tmp_path / "other.tar", {"readme.txt": b"hi"}))
    manifest = {"format": "box-backup", "version": 99}
    assert "format version 99" in _refused(_tar(tmp_path / "future.tar", {"manifest.json": json.dumps(manifest).encode()}))

    archive = tmp_path / "box.tar"
    assert _manage({**database_env(), "BOX_LAYER_DRIVER": settings.BOX_LAYER_DRIVER}, "backup", "-o", str(archive)).returncode == 0
    cut = tmp_path / "cut.tar"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    assert "damaged or cut short" in _refused(cut)

    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}
    escaping = {**members, "data/../../escaped": b"x"}
    assert "outside the data directory" in _refused(_tar(tmp_path / "escape.tar", escaping))
    tampered = {**members, "database/box.pgdump" if settings.DB_IS_POSTGRES else "database/box.sqlite3": b"tampered"}
    assert "does not match the digest" in _refused(_tar(tmp_path / "tampered.tar", tampered))
    # The data directory of this (running) box is not empty: refused without --force.
    assert "is not empty" in _refused(archive)


WRITE_TREE = """
import sys
from pathlib import Path
from boxsite.backups.archive import Writer
root = Path(sys.argv[1])
writer = Writer(root / "backup.tar")
try:
    writer.add_tree([root / "layer", root / "layer" / "gone"], root)
except Exception as exc:
    writer.abandon()
    print(type(exc).__name__, exc)
    sys.exit(3)
writer.close()
"""


def test_an_extended_attribute_the_backup_cannot_read_fails_it() -> None:
    # A backup taken by a user who may list an attribute but not read it (user.* attributes need
    # read permission on the file; listing them does not): a folder of a layer, deleted and made
    # again, marked opaque, which the backup's user may only pass through.
    root = Path(tempfile.mkdtemp(prefix="box-xattr-", dir="/tmp"))
    try:
        root.chmod(0o777)  # the backup's user writes the archive here
        gone = root / "layer" / "gone"
        gone.mkdir(parents=True)
        os.setxattr(gone, "user.overlay.opaque", b"y")
        (root / "layer").chmod(0o755)
        gone.chmod(0o111)
        # The system's interpreter: the box's may lie where that user cannot reach it, and the
        # archive module needs only the standard library.
        taken = subprocess.run(["/usr/bin/python3", "-c", WRITE_TREE, str(root)], cwd=settings.BASE_DIR, user=65534,
                               group=65534, extra_groups=[], capture_output=True, text=True, timeout=60)
        assert taken.returncode == 3, (taken.stdout, taken.stderr)
        assert "Unreadable" in taken.stdout
        assert f"{gone}: its extended attribute user.overlay.opaque cannot be read" in taken.stdout
        assert not (root / "backup.tar").exists() and not (root / ".backup.tar.partial").exists()
    finally:
        shutil.rmtree(root)
