"""The broker (docs/internals/run-path.md#broker-and-tools): a per-task Unix socket speaking JSON lines.

A task's processes reach the box only through it, with the ``box`` client: report a step, call a
tool, ask for a value, ask for approval, report spending, ask for a person. One broker serves one
run: the worker's path (``tasks.run.worker``) starts it before the worker and closes it when the run ends.

Modules: ``protocol`` (the wire format), ``server`` (the socket), ``calls`` (what each op does),
``holds`` (pausing the task while a live process waits), ``paths`` (where the socket and the
client live).
"""
