"""What the soak reads from /proc (soak_bench.py): each daemon process's memory, descriptors, threads,
context switches and CPU time, the host's CPU steal, and memory growth over a run."""
import os
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def host_ticks() -> tuple[int, int]:
    """(all CPU ticks, stolen ticks) since boot, from /proc/stat's cpu line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def process(pid: int) -> dict | None:
    """One process's figures; None once it is gone."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":" in line)
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return {"pid": pid, "rss_kb": int(status["VmRSS"].split()[0]), "fds": fds,
            "threads": int(status["Threads"]), "cpu_s": round((int(stat[11]) + int(stat[12])) * TICK_S, 2),
            "switches": int(status["voluntary_ctxt_switches"]),
            "preempted": int(status["nonvoluntary_ctxt_switches"])}


class ProcSampler:
    def __init__(self, supervisor_pid: int):
        self.supervisor = supervisor_pid

    def read(self, status: dict) -> dict:
        """By role: the supervisor, the gateway (from status's http), each serving worker (worker-SLOT)."""
        roles = {"supervisor": self.supervisor}
        if status.get("http") and status["http"].get("pid"):
            roles["gateway"] = status["http"]["pid"]
        for w in status["workers"]:
            if w["role"] == "serving":
                roles[f"worker-{w['index']}"] = w["pid"]
        return {role: process(pid) for role, pid in roles.items()}


def rss_growth(samples: list[dict], warmup_s: float) -> dict:
    """Per role, after warm-up: MB an hour (a least-squares slope over the samples of one process), and
    the step that stays (the floor of the last third of the samples over the floor of the first)."""
    out = {}
    roles = {role for s in samples for role in s["procs"]}
    for role in sorted(roles):
        points = [(s["t_s"], s["procs"][role]) for s in samples if s["t_s"] >= warmup_s and s["procs"].get(role)]
        if len(points) < 3:
            continue
        pid = points[-1][1]["pid"]           # the process serving at the end (a reload starts a new one)
        points = [(t, p["rss_kb"] / 1024) for t, p in points if p["pid"] == pid]
        if len(points) < 3:
            continue
        n = len(points)
        mt, mr = sum(t for t, _ in points) / n, sum(r for _, r in points) / n
        stt = sum((t - mt) ** 2 for t, _ in points)
        slope = sum((t - mt) * (r - mr) for t, r in points) / stt if stt else 0.0
        third = max(1, n // 3)
        out[role] = {"pid": pid, "mb_per_hour": round(slope * 3600, 2), "from_mb": round(points[0][1], 1),
                     "to_mb": round(points[-1][1], 1),
                     "step_mb": round(min(r for _, r in points[-third:]) - min(r for _, r in points[:third]), 1),
                     "over_s": round(points[-1][0] - points[0][0], 1)}
    return out
