"""Per-sandbox metrics through the real `e2b` Python SDK (`Sandbox.get_metrics`, instance and
static): its generated model requires every field of SandboxMetric, and the values come from the
host agent's samples (every 2 s under pytest.test.ts). Memory in use grows by a 200 MiB allocation
a process holds; CPU rises while a busy loop runs, compared with idle samples. Waits are bounded
polls, never timing thresholds."""

from datetime import datetime, timezone

from e2b import Sandbox

from conftest import wait_until

MIB = 2**20


def test_get_metrics_follows_a_busy_loop_and_a_200_mib_allocation():
    sbx = Sandbox.create(allow_internet_access=False, timeout=600)
    try:
        idle_from = datetime.now(timezone.utc)
        idle = wait_until("three idle samples", lambda: (lambda s: s if len(s) >= 3 else None)([m for m in sbx.get_metrics(start=idle_from) if m.timestamp > idle_from]), timeout=90, interval=0.5)
        for m in idle:
            assert m.cpu_count >= 1
            assert m.mem_total == 1024 * MIB
            assert 0 < m.mem_used < m.mem_total
            assert m.disk_total > 0
        idle_cpu = max(m.cpu_used_pct for m in idle)

        busy = sbx.commands.run("while :; do :; done", background=True)
        busy_from = datetime.now(timezone.utc)
        try:
            wait_until("a busy sample above the idle ones", lambda: any(m.timestamp > busy_from and m.cpu_used_pct > idle_cpu + 10 for m in sbx.get_metrics(start=busy_from)), timeout=120, interval=0.5)
        finally:
            busy.kill()

        baseline = sbx.get_metrics(start=busy_from)[-1].mem_used
        holder = sbx.commands.run("python3 -c 'b = b\"\\x01\" * (200 << 20); import time; time.sleep(600)'", background=True)
        held_from = datetime.now(timezone.utc)
        try:
            wait_until("memory in use up by the allocation", lambda: any(m.timestamp > held_from and m.mem_used >= baseline + 190 * MIB for m in Sandbox.get_metrics(sbx.sandbox_id, start=held_from)), timeout=120, interval=0.5)
        finally:
            holder.kill()
    finally:
        sbx.kill()
