"""One agent-fleet client process for fleet_bench.py: jevany-client only, no torch.

    python benchmarks/fleet_load.py TASK.json

TASK: {"endpoints": [...], "routing": str, "sessions": [[body, ...], ...], "concurrency": int,
"timeout": s}. It connects, prints "ready", waits for a line on stdin, then plays the sessions
over one AsyncJevClient, `concurrency` at a time, each session's turns one after the other (an
agent waits for its answer before its next turn), and prints one JSON line: each request's
latency, the errors that reached the caller, how many answered and their input tokens.
"""
import asyncio
import json
import sys
import time

from jevany_client import AsyncJevClient, JevanyError


async def play(task: dict) -> dict:
    out = {"latencies": [], "errors": [], "answered": 0, "input_tokens": 0}
    async with AsyncJevClient(task["endpoints"], timeout=task["timeout"], routing=task["routing"]) as client:
        for _ in range(2 * len(task["endpoints"])):
            await client.ping()                     # connected to every daemon before the clock starts
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        sessions = asyncio.Queue()
        for session in task["sessions"]:
            sessions.put_nowait(session)
        out["started"] = time.time()
        await asyncio.gather(*(agent(client, sessions, out) for _ in range(task["concurrency"])))
        out["ended"] = time.time()
    return out


async def agent(client: AsyncJevClient, sessions: asyncio.Queue, out: dict) -> None:
    while not sessions.empty():
        for body in sessions.get_nowait():
            started = time.perf_counter()
            try:
                result = await client.decide_request(body)
            except JevanyError as err:
                out["errors"].append(f"{err.code}: {err.message}"[:200])
                continue
            out["latencies"].append(time.perf_counter() - started)
            out["answered"] += 1
            out["input_tokens"] += result["usage"]["input_tokens"]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(asyncio.run(play(json.load(f)))), flush=True)
