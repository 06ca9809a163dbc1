from tests.factories import flow


def test_a_flow_task_runs_to_done(box):
    task = box.create(title="hello", flow=flow({"write": {"path": "a.txt", "content": "hi"}}, {"run": "cat a.txt"}))
    view = box.wait_state(task["id"], "done")
    kinds = [e["kind"] for e in box.events(task["id"])]
    assert kinds[0] == "status" and "step" in kinds, kinds
    assert view["progress"] == 1.0
