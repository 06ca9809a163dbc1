"""A task's browser (docs/internals/browser.md#browser-steps): Chromium as the task's own process,
driven by Playwright over CDP.

Modules, one per noun: ``session`` (starting, reaching and releasing the task's Chromium),
``relay`` (the DevTools port inside the task's network namespace), ``origins``
(``constraints.origins``), ``steps`` (browse, click, fill, pick, extract, screenshot; their
evidence; payment pages).
"""
