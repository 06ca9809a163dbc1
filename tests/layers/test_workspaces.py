"""The workspace API: list, create (empty or imported), browse the current view, and refuse any
path that would leave it."""
from __future__ import annotations

from tests.factories import flow
from tests.layers.conftest import read


def test_workspaces_are_listed_created_and_imported(lbox, tmp_path):
    names = [w["name"] for w in lbox.api.get("/api/workspaces").json()["results"]]
    assert names == ["home"]

    made = lbox.api.post("/api/workspaces", {"name": "scratch"}, format="json")
    assert made.status_code == 201 and made.json()["layers"] == []
    assert lbox.api.get("/api/workspaces/scratch/files").json()["entries"] == []
    assert lbox.api.post("/api/workspaces", {"name": "scratch"}, format="json").status_code == 409

    source = tmp_path / "repo"
    (source / "src").mkdir(parents=True)
    (source / "src" / "main.py").write_text("print('hi')\n")
    made = lbox.api.post("/api/workspaces", {"name": "repo", "importFrom": str(source)}, format="json")
    assert made.status_code == 201, made.json()
    assert read(lbox, "src/main.py", workspace="repo") == "print('hi')\n"
    listing = lbox.api.get("/api/workspaces/repo/files", {"path": "src"}).json()
    assert listing["entries"] == [{"name": "main.py", "path": "src/main.py", "type": "file", "size": 12}]

    task = lbox.create(title="edit", workspace="repo", flow=flow({"write": {"path": "src/main.py", "content": "print('bye')\n"}}))
    assert lbox.wait_state(task["id"], "done")["state"] == "done"
    assert read(lbox, "src/main.py", workspace="repo") == "print('bye')\n"
    assert (source / "src" / "main.py").read_text() == "print('hi')\n"  # an import is a copy


def test_bad_workspace_requests_get_clear_errors(lbox, tmp_path):
    cases = [
        ({"name": "Bad Name"}, 400, "name"),
        ({"name": "ok", "budget": 1}, 400, "budget"),
        ({"name": "rel", "importFrom": "relative/dir"}, 400, "importFrom"),
        ({"name": "missing", "importFrom": str(tmp_path / "nope")}, 400, "importFrom"),
    ]
    for body, status, field in cases:
        response = lbox.api.post("/api/workspaces", body, format="json")
        assert response.status_code == status and response.json()["field"] == field, (body, response.json())
    assert lbox.api.get("/api/workspaces/nope/files").status_code == 404


def test_paths_that_leave_the_view_are_refused_and_links_are_not_followed(lbox):
    task = lbox.create(title="links", flow=flow({"run": "ln -s /etc/passwd pw && ln -s /etc etc && echo s > secret.txt"}))
    task = lbox.wait_state(task["id"], "done", "failed")
    assert task["state"] == "done", task["error"]
    for path in ("../../etc/passwd", "/etc/passwd", "a/../../x", "x\x00y"):
        response = lbox.api.get("/api/workspaces/home/files", {"path": path})
        assert response.status_code == 400 and response.json()["field"] == "path", (path, response.json())
    link = lbox.api.get("/api/workspaces/home/files", {"path": "pw"}).json()
    assert link == {"workspace": "home", "path": "pw", "type": "link", "target": "/etc/passwd"}
    assert lbox.api.get("/api/workspaces/home/files", {"path": "etc/passwd"}).status_code == 404
    assert lbox.api.get("/api/workspaces/home/files", {"path": "missing.txt"}).status_code == 404
