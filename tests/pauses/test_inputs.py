"""Needs input: a ${name} nothing supplies starts the task waiting for input; continue merges
values, checks everything again, and asks again or goes on."""
from __future__ import annotations

from tests.factories import flow
from tests.pauses.helpers import cont, open_questions, report

NEEDS = flow(
    {"write": {"path": "who.txt", "content": "${contact email} ${mobile phone} ${date of birth} ${number of travellers} ${city}"}},
    {"run": "cat who.txt", "save": "who"},
)


def test_a_missing_name_starts_the_task_waiting_for_input_with_one_field_per_name(box):
    task = box.create(title="needs", flow=NEEDS)
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "input"
    assert view["next"][0] == "continue"
    fields = {f["name"]: f["kind"] for f in view["pause"]["fields"]}
    assert fields == {"contact email": "email", "mobile phone": "phone", "date of birth": "date",
                      "number of travellers": "number", "city": "text"}
    assert all("${" in f["why"] for f in view["pause"]["fields"])
    questions = open_questions(box, task["id"])
    assert len(questions) == 1 and questions[0]["kind"] == "input"
    assert [f["name"] for f in questions[0]["fields"]] == list(fields)


def test_continue_with_some_values_asks_again_for_the_rest(box):
    task = box.create(title="needs", flow=NEEDS)
    view = box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], inputs={"contact email": "a@example.com", "city": "Pune"})
    assert response.status_code == 200, response.json()
    again = response.json()
    assert again["state"] == "waiting" and again["waitingFor"] == "input"
    assert again["version"] == view["version"] + 1
    assert [f["name"] for f in again["pause"]["fields"]] == ["mobile phone", "date of birth", "number of travellers"]
    questions = box.task(task["id"])["questions"]
    assert [q["state"] for q in questions] == ["answered", "open"]
    assert [f["name"] for f in questions[1]["fields"]] == ["mobile phone", "date of birth", "number of travellers"]
    assert box.task(task["id"])["facts"]["city"] == "Pune"


def test_continue_with_everything_starts_the_flow(box):
    task = box.create(title="needs", flow=NEEDS, facts={"city": "Pune"})
    box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], inputs={"contact email": "a@example.com", "mobile phone": "+91 98765 43210",
                                             "date of birth": "1990-01-02", "number of travellers": 2})
    assert response.status_code == 200, response.json()
    box.wait_state(task["id"], "done")
    assert report(box, task["id"])["records"]["who"] == "a@example.com +91 98765 43210 1990-01-02 2 Pune"
    assert [q["state"] for q in box.task(task["id"])["questions"]] == ["answered"]


def test_a_value_that_is_a_card_number_makes_its_name_secret(box):
    spec = flow({"run": "echo paying with ${payment method}", "save": "said"})
    task = box.create(title="card", flow=spec)
    box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], inputs={"payment method": "4111 1111 1111 1111"})
    assert response.status_code == 200
    view = box.wait_state(task["id"], "done")
    assert "payment method" in view["secretFacts"]
    assert view["facts"]["payment method"] == "${payment method}"
    assert report(box, task["id"])["records"]["said"] == "paying with ${payment method}"
    question = box.task(task["id"])["questions"][0]
    assert "4111" not in str(question)


def test_continue_can_add_secrets_but_never_make_a_sensitive_name_shared(box):
    spec = flow({"run": "echo ${nickname} ${password}", "save": "said"})
    task = box.create(title="secrets", flow=spec, facts={"password": "hunter2-canary"})
    box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], inputs={"nickname": "bobby-the-nick"}, secretFacts=["nickname"])
    assert response.status_code == 200
    view = box.wait_state(task["id"], "done")
    assert set(view["secretFacts"]) == {"nickname", "password"}
    assert report(box, task["id"])["records"]["said"] == "${nickname} ${password}"


def test_an_ask_step_pauses_for_its_value_and_goes_on_from_there(box):
    spec = flow({"run": "echo first >> log.txt"},
                {"ask": {"name": "colour", "why": "which colour to paint", "options": ["red", "blue"]}},
                {"run": "echo ${colour} >> log.txt"}, {"run": "cat log.txt", "save": "log"})
    task = box.create(title="ask", flow=spec)
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "input"
    assert view["pause"]["fields"] == [{"name": "colour", "why": "which colour to paint", "kind": "text", "options": ["red", "blue"]}]
    assert cont(box, task["id"], inputs={"colour": "red"}).status_code == 200
    box.wait_state(task["id"], "done")
    assert report(box, task["id"])["records"]["log"] == "first\nred"


def test_an_empty_value_is_still_missing(box):
    task = box.create(title="needs", flow=flow({"run": "echo ${city}"}))
    box.wait_state(task["id"], "waiting")
    again = cont(box, task["id"], inputs={"city": ""}).json()
    assert again["waitingFor"] == "input" and [f["name"] for f in again["pause"]["fields"]] == ["city"]


def test_bad_continue_bodies_are_refused_without_echoing_values(box):
    task = box.create(title="needs", flow=flow({"run": "echo ${city}"}))
    view = box.wait_state(task["id"], "waiting")
    for body, field in [({}, "inputs"), ({"inputs": "Pune"}, "inputs"), ({"inputs": {}}, "inputs"),
                        ({"inputs": {"city": {"card": "4111111111111111"}}}, "inputs.city"),
                        ({"approve": True}, "inputs"), ({"inputs": {"city": "x"}, "extra": 1}, "extra")]:
        response = cont(box, task["id"], **body)
        assert response.status_code == 400, body
        assert response.json()["field"] == field, (body, response.json())
        assert "4111" not in response.content.decode()
    assert box.task(task["id"])["version"] == view["version"]


def test_continue_on_a_task_that_is_not_waiting_is_a_conflict(box):
    task = box.create(title="plain", flow=flow({"write": {"path": "a", "content": "a"}}))
    box.wait_state(task["id"], "done")
    response = cont(box, task["id"], inputs={"x": "y"})
    assert response.status_code == 409 and response.json()["code"] == "CONFLICT"


def test_a_stale_version_on_continue_is_a_conflict(box):
    task = box.create(title="needs", flow=flow({"run": "echo ${city}"}))
    view = box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], inputs={"city": "Pune"}, version=view["version"] - 1)
    assert response.status_code == 409
    assert box.task(task["id"])["state"] == "waiting"
