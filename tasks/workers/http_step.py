"""The flow's ``http`` step: a request through the box's egress rules; one with ``stop_before``
is a consequential action, sent at most once (``approvals.actions``)."""
from __future__ import annotations

import json
from typing import Any

from tasks import pauses
from tasks.pauses import ActionKind
from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed, bounded
from tasks.tools.http import Blocked


def http_step(ctx: RunContext, value: Any, step: dict[str, Any], index: int) -> tuple[Any, Evidence]:
    """Send step ``index``'s request; the answer and its evidence, ``StepFailed`` on a refusal,
    a failed request or a status of 400 or more."""
    spec: dict[str, Any] = {"url": value} if isinstance(value, str) else value
    method = str(spec.get("method", "GET")).upper()
    asked = {"method": method, "url": spec["url"]}
    if "stop_before" in step:
        return consequential_http(ctx, index, spec, asked)
    try:
        response = ctx.http(method, spec["url"], headers=spec.get("headers", {}), body=spec.get("body"))
    except Blocked as exc:
        raise StepFailed(str(exc), evidence=Evidence({**asked, "blocked": str(exc)})) from exc
    except OSError as exc:
        raise StepFailed(f"request failed: {exc}", evidence=Evidence({**asked, "error": str(exc)})) from exc
    return http_answer(response, asked)


def step_position(index: int) -> str:
    """Where a flow's action stands: its step, so a resumed run finds the same action."""
    return f"step:{index + 1}"


def http_action(ctx: RunContext, index: int, value: Any) -> Any:
    """The action of an ``http`` step with ``stop_before``: its real request is its arguments."""
    spec: dict[str, Any] = {"url": value} if isinstance(value, str) else value
    method = str(spec.get("method", "GET")).upper()
    args = {"method": method, "url": spec["url"], "headers": spec.get("headers", {}), "body": spec.get("body")}
    return pauses.actions().propose(ctx.recorder, ctx.run.pk, kind=ActionKind.HTTP, target=f"{method} {spec['url']}",
                           position=step_position(index), args=args, policy=pauses.actions().policy_of(ctx.task))


def consequential_http(ctx: RunContext, index: int, spec: dict[str, Any], asked: dict[str, Any]) -> tuple[Any, Evidence]:
    """An approved (or allowed) ``http`` step with ``stop_before``: the request is sent at most
    once. A response is a confirmed outcome (its receipt: status, size, digest, an excerpt); a
    request the policy refused or nobody answered never reached a provider (failed); anything
    else (a reset, a timeout, a worker killed mid-call) leaves the outcome unknown."""
    action = http_action(ctx, index, spec)
    try:
        receipt = pauses.actions().replayed_receipt(action)
    except pauses.ActionFailedBefore as before:
        raise StepFailed(f"the request failed before and is not sent again: {before.action.error}",
                         evidence=Evidence({**asked, "action": action.pk})) from before
    if receipt is not None:
        # Sent before (its receipt says so, or the owner did): answered from the receipt, not sent again.
        return receipt.get("excerpt"), Evidence({**asked, "action": action.pk, "replayed": True,
                                                 "status": receipt.get("status", "done before"), "receipt": receipt})
    pauses.actions().begin(ctx.recorder, ctx.run.pk, action)
    try:
        response = ctx.http(asked["method"], spec["url"], headers=spec.get("headers", {}), body=spec.get("body"))
    except (Blocked, ConnectionRefusedError) as exc:
        pauses.actions().fail(ctx.recorder, action, {"sent": False, "error": str(exc)[:pauses.RECEIPT_EXCERPT]}, str(exc))
        raise StepFailed(f"request failed: {exc}", evidence=Evidence({**asked, "action": action.pk, "error": str(exc)})) from exc
    except OSError as exc:
        # Sent or not, nobody knows (a reset, a timeout): the owner says what happened.
        pauses.actions().uncertain(ctx.recorder, action, f"request failed: {exc}")
        raise pauses.ActionUnknown(action) from exc
    body = response["body"]
    receipt = {"status": response["status"], "bytes": len(body), "digest": pauses.receipt_digest(body),
               "excerpt": bounded(body, chars=pauses.RECEIPT_EXCERPT)}
    if response["status"] >= 400:
        pauses.actions().fail(ctx.recorder, action, receipt, f"HTTP {response['status']}")
    else:
        pauses.actions().succeed(ctx.recorder, action, receipt)
    return http_answer(response, {**asked, "action": action.pk})


def http_answer(response: dict[str, Any], asked: dict[str, Any]) -> tuple[Any, Evidence]:
    """An ``http`` step's value (the body, parsed when it is JSON) and its evidence; a status of
    400 or more fails the step with the page's text."""
    body = response["body"]
    evidence = Evidence({**asked, "status": response["status"], "bytes": len(body), "body": bounded(body)})
    if response["status"] >= 400:
        raise StepFailed(f"HTTP {response['status']}", page_text=body, evidence=evidence)
    try:
        return json.loads(body), evidence
    except ValueError:
        return body, evidence
