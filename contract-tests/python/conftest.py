"""Shared fixtures of the Python contract tests, and the report the vitest runner reads.

The SDKs are configured the way their users configure them: through E2B_API_KEY / E2B_API_URL /
E2B_SANDBOX_URL and DAYTONA_API_KEY / DAYTONA_API_URL in the environment (pytest.test.ts sets
them for the server it starts). Sandboxes get no internet: E2B ones are created with
allow_internet_access=False, Daytona ones with network_block_all=True.
"""

import json
import os
import time

import pytest

REQUIRED_ENV = ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "DAYTONA_API_KEY", "DAYTONA_API_URL")


def pytest_configure(config):
    missing = [name for name in REQUIRED_ENV if not os.environ.get(name)]
    if missing:
        raise pytest.UsageError(f"set {', '.join(missing)} (a running Nestbox server; see contract-tests/README.md)")


def wait_until(what, check, timeout=30.0, interval=0.2):
    """Polls `check` until it returns a truthy value (returned), bounded in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(what, check, timeout=30.0, interval=0.2):
    """`wait_until` for a coroutine check."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


# --- The report pytest.test.ts reads: one JSON line per test, with its outcome and output. ---

_report = None
_results = {}


def pytest_sessionstart(session):
    global _report
    path = os.environ.get("NESTBOX_PYTEST_REPORT")
    if path:
        _report = open(path, "w", encoding="utf-8")


def pytest_runtest_logreport(report):
    # A test's outcome is the worst of its phases (setup, call, teardown).
    entry = _results.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0, "details": []})
    entry["duration"] += report.duration
    if report.outcome != "passed" and entry["outcome"] != "failed":
        entry["outcome"] = report.outcome
    if report.failed or report.skipped:
        entry["details"].append(f"--- {report.when}: {report.outcome}\n{report.longreprtext}")
        for name, text in report.sections:
            entry["details"].append(f"--- {name}\n{text}")
    if report.when == "teardown" and _report:
        _report.write(json.dumps(entry) + "\n")
        _report.flush()


def pytest_sessionfinish(session, exitstatus):
    if _report:
        _report.close()
