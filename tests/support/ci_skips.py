"""Under CI=true no test skips silently: a skip fails unless its reason is one of the legitimate ones.

A skip says something is missing here. In CI, .ci/run installs every system tool and `make test`
every extra, so a missing reference table, tool, extra or own module there is a broken CI, not a
reason to pass. The skips that stay legitimate everywhere are listed below, each with why;
docs/development.md lists the same (tests/repo/test_ci_skips.py keeps the two in step).
"""

from __future__ import annotations

import os
import re

import pytest

# (a pattern the skip's reason matches, why that skip is legitimate even in CI)
LEGITIMATE: tuple[tuple[str, str], ...] = (
    (r"vllm is not importable", "real vLLM is opt-in: its own venv (make vllm-check), never make test"),
    (r"needs a GPU|no GPU|CUDA is not available", "CI hosts have no accelerator; the GPU check runs on one"),
    (r"without conditional writes both racers may win", "the documented fallback race of an S3 without If-None-Match"),
    (r"unshare|mount namespace|read-only mount", "user and mount namespaces are a host setting CI runners may refuse"),
    (
        r"this CPU lacks|this host refuse",
        "a CPU's instruction sets and a kernel's policy are the runner's; the cases run where they hold",
    ),
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def legitimate(reason: str) -> bool:
    return any(re.search(pattern, reason) for pattern, _ in LEGITIMATE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not legitimate(reason):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI=true: {reason}\n"
            "CI installs every tool and extra the suite needs (.ci/run, make test): make it present, or, if "
            "this skip is legitimate everywhere, add it to tests/support/ci_skips.py and docs/development.md"
        )
