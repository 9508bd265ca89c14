"""The prefix cache, measured: cache on vs off through real daemons, on the default (choice) readout.

bench.py runs this for the workloads choice_short, choice_long, same_state
and agent. Three daemons serve the tiny choice model side by side: batched
with the cache off, batched with it on, and serial (max_batch_size 1) with
it on. Every round makes new requests (a new seed), so no daemon ever sees
a state it kept from an earlier round, and runs them through each daemon in
turn, rotating who goes first; a ratio is taken within each round, then the
median over rounds (this machine drifts by tens of percent within a minute).

The cache-on daemons keep --prefix-cache-entries states (64): the agent
workload has 32 sessions in flight, and an entry per session is what keeps
each session's next turn a hit. The default (4) suits a few shared states.
"""
from harness import ClientPool, Daemon, median, percentile, timed
from jevany_daemon import workloads
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.loading import load_model
from jevany_daemon.parity import compare

CACHE_WORKLOADS = ("choice_short", "choice_long", "same_state", "agent")
CLIENTS = 32


def make_bodies(name: str, quick: bool, seed: int) -> list[dict]:
    if name == "choice_short":
        return workloads.short(96 if quick else 256, seed=seed)
    if name == "choice_long":
        return workloads.long_uneven(48 if quick else 96, seed=seed)
    if name == "same_state":
        return workloads.same_state(64 if quick else 128, seed=seed)     # 8 requests per state
    # one session per client, from a short state to about 2,000 tokens (1,300 with --quick)
    return workloads.agent(CLIENTS, 12 if quick else 24, seed=seed, start=(100, 600))


# --- parity -----------------------------------------------------------------

def cache_parity(models, cases, args) -> list[dict]:
    """Per (arch, readout, layout, dtype): answers with the cache on vs each request alone with it off.

    States are kept from the first token (min tokens 1) and every request is
    scored twice, so the second time its state is a hit, batched with the rest.
    """
    bodies = workloads.mixed(args.parity_n, seed=9, max_words=30)
    rows = []
    for arch, readout, layout in cases:
        for dtype in ("fp32", "bf16"):
            model = load_model(str(models.dir(arch, readout)), device=args.device, dtype=dtype)
            off = Engine(model, EngineConfig(layout=layout, prefix_cache=0))
            on = Engine(model, EngineConfig(layout=layout, max_batch_size=16, max_padding_waste=1.0,
                                            batch_policy="greedy", max_packed_tokens=1 << 16,
                                            prefix_cache=len(bodies), prefix_min_tokens=1))
            expected = [off.score([off.admit(b)])[0] for b in bodies]
            misses = on.score([on.admit(b) for b in bodies])
            hits = on.score([on.admit(b) for b in bodies])
            r = compare(expected + expected, misses + hits)
            rows.append({"arch": arch, "readout": readout, "layout": layout, "dtype": dtype,
                         "requests": len(bodies), "hits": on.prefix_cache.hits, "max_abs_diff": r["max_abs_diff"],
                         "decisions_changed": len(r["decisions_changed"])})
            del model, off, on
    return rows


# --- through the daemons -------------------------------------------------------

def cold_idle(daemons: dict, quick: bool) -> dict:
    """Concurrency 1, states never seen: p50 with the cache on and off, interleaved in blocks."""
    out = {}
    for name, maker in (("choice_short", workloads.short), ("choice_long", workloads.long_uneven)):
        bodies = maker(48 if quick else 96, seed=1000)
        latencies = {"off": [], "on": []}
        order = [("off", daemons["off"]), ("on", daemons["on"])]
        for k, at in enumerate(range(0, len(bodies), 8)):
            for label, d in order[k % 2:] + order[: k % 2]:
                for body in bodies[at: at + 8]:
                    latencies[label].append(timed(lambda: d.client.call("decide", body))[1])
        p50 = {label: percentile(v, 0.5) * 1000 for label, v in latencies.items()}
        out[name] = {"off_p50_ms": p50["off"], "on_p50_ms": p50["on"], "on_over_off": p50["on"] / p50["off"]}
        print(f"  cold {name}, concurrency 1: p50 {p50['off']:.1f} ms off, {p50['on']:.1f} ms on "
              f"({out[name]['on_over_off']:.3f}x)", flush=True)
    return out


def workload(name: str, daemons: dict, pool: ClientPool, args) -> dict:
    rounds = []
    for r in range(args.rounds):
        bodies = make_bodies(name, args.quick, seed=200 + r)
        order = list(daemons.items())
        order = order[r % len(order):] + order[: r % len(order)]
        before = {label: d.prefix_cache() for label, d in daemons.items()}
        runs = {label: pool.run(d, bodies, CLIENTS) for label, d in order}
        after = {label: d.prefix_cache() for label, d in daemons.items()}
        rounds.append({"requests": len(bodies),
                       **{label: {"rps": run["rps"], "p50_ms": percentile(run["latencies"], 0.5) * 1000,
                                  "mean_batch_size": run["mean_batch_size"],
                                  "hits": after[label].get("hits", 0) - before[label].get("hits", 0),
                                  "misses": after[label].get("misses", 0) - before[label].get("misses", 0)}
                          for label, run in runs.items()}})
    ratio = {"on_over_off": median([x["on"]["rps"] / x["off"]["rps"] for x in rounds]),
             "batched_over_serial_on": median([x["on"]["rps"] / x["on_serial"]["rps"] for x in rounds])}
    w = {"requests": rounds[0]["requests"], "rounds": rounds, "ratios": ratio,
         **{label: {"rps": median([x[label]["rps"] for x in rounds])} for label in daemons}}
    print(f"  {name}: {w['requests']} requests, 32 clients: off {w['off']['rps']:.1f} req/s, on "
          f"{w['on']['rps']:.1f}, serial on {w['on_serial']['rps']:.1f}; on/off {ratio['on_over_off']:.2f}x, "
          f"batched/serial (on) {ratio['batched_over_serial_on']:.2f}x; hits/misses on "
          f"{rounds[-1]['on']['hits']}/{rounds[-1]['on']['misses']}", flush=True)
    return w


def run(models, args, names: list[str], pool: ClientPool, parity_cases) -> dict:
    print("\nprefix cache: parity, cache on vs off (each request alone)", flush=True)
    result = {"entries": args.cache_entries, "parity": cache_parity(models, parity_cases, args)}
    for row in result["parity"]:
        print(f"  {row['arch']:8} {row['readout']:8} {row['layout']:6} {row['dtype']}: max "
              f"{row['max_abs_diff']:.2e}  decisions changed {row['decisions_changed']}  hits {row['hits']}",
              flush=True)
    model_dir = models.dir(args.arch, "choice")
    cache = ("--prefix-cache", str(args.cache_entries))
    daemons = {}
    try:
        daemons["off"] = Daemon(model_dir, args, args.batch, args.policy, ("--prefix-cache", "0"))
        daemons["on"] = Daemon(model_dir, args, args.batch, args.policy, cache)
        daemons["on_serial"] = Daemon(model_dir, args, 1, args.policy, cache)
        warm = workloads.short(64, seed=99)
        for d in daemons.values():      # warm-up, the adaptive policy's first measurements included
            pool.run(d, warm, 8)
        result["idle"] = cold_idle(daemons, args.quick)
        result["workloads"] = {name: workload(name, daemons, pool, args) for name in names}
    finally:
        for d in daemons.values():
            d.stop()
    return result


def targets(cache: dict, add) -> None:
    ws = cache.get("workloads", {})
    bounds = {"choice_short": 1.4, "same_state": 3.0, "agent": 3.0}
    for name, bound in bounds.items():
        if name in ws:
            v = ws[name]["ratios"]["on_over_off"]
            add(f"cache {name}, 32 clients: cache on / off throughput", v, f">= {bound}", v >= bound)
    for name, bound in (("choice_long", 1.0), ("choice_short", 1.3)):
        if name in ws:
            v = ws[name]["ratios"]["batched_over_serial_on"]
            add(f"cache {name}, 32 clients, cache on: batched / serial throughput", v, f">= {bound}", v >= bound)
    fp32 = [r for r in cache.get("parity", []) if r["dtype"] == "fp32"]
    if fp32:
        worst = max(r["max_abs_diff"] for r in fp32)
        changed = sum(r["decisions_changed"] for r in fp32)
        add("cache parity fp32, on vs off: max probability difference", worst, "<= 1e-5", worst <= 1e-5)
        add("cache parity fp32, on vs off: decisions changed", changed, "== 0", changed == 0)
    if "idle" in cache:
        worst = max(v["on_over_off"] for v in cache["idle"].values())
        add("cache cold request, concurrency 1: p50 on / off", worst, "<= 1.02", worst <= 1.02)
