"""jevany-ctl's pages: the status and models results as a person reads them at a glance."""

import json
from typing import Any

_BAR_WIDTH = 40


def format_status(s: dict) -> str:
    """The status result as a page a person reads at a glance; missing fields show '-'."""
    model = _section(s, "model")
    batching = _section(s, "batching")
    queue = _section(s, "queue")
    latency = _section(s, "latency_ms")
    requests = _section(s, "requests")
    head = (
        f"jevany-daemon {_text(s.get('version'))}   state {_text(s.get('state'))}   "
        f"pid {_text(s.get('pid'))}   up {_duration(s.get('uptime_s'))}"
    )
    summary = _table([
        ("model", _text(model.get("id"))),
        ("source", _text(model.get("source"))
                   + ("   (RANDOM weights: the built-in demo model, its answers mean nothing)"
                      if model.get("random_weights") else "")),
        ("readout", f"{_text(model.get('readout') or _loading(s))}   layout {_text(model.get('layout'))}"),
        ("device", f"{_text(model.get('device'))}   dtype {_text(model.get('dtype'))}"),
        ("endpoints", ", ".join(map(str, s.get("endpoints") or [])) or "-"),
        ("queue", f"{_text(queue.get('depth'))} / {_text(queue.get('max_depth'))}"),
        ("batching", _batching(batching.get("max_batch_size"))),
        ("batches", f"{_text(batching.get('batches'))} for {_text(batching.get('requests'))} "
                    f"requests, mean size {_number(batching.get('mean_batch_size'), '.2f')}"),
        ("latency", f"p50 {_number(latency.get('p50'), '.1f')} ms   "
                    f"p99 {_number(latency.get('p99'), '.1f')} ms{_waited(latency)}"),
        ("metrics", _text(s.get("metrics") or ("off" if "metrics" in s else None))),
        ("requests", f"{_text((requests.get('by_op') or {}).get('decide', 0))} decide{_transports(requests)}   "
                     f"{_text(requests.get('ok'))} ok   {_text(requests.get('error'))} error   "
                     f"(every op: ping and status count too)"),
        *_plan_row(s.get("plan")),
        *_http_row(s.get("http"), batching),
    ])
    blocks = [head, summary, _errors_block(requests), _workers_block(s), _histogram_block(batching)]
    return "\n\n".join(block for block in blocks if block)


def _loading(s: dict) -> str | None:
    """The readout is the model's to say: while it loads there is none yet, and the page says why."""
    return "(known once the model has loaded)" if s.get("state") == "starting" else None


def _waited(latency: dict) -> str:
    waited = latency.get("waited_for_load")
    return f"   ({waited} that waited for the model to load left out)" if waited else ""


def _batching(max_batch_size) -> str:
    if max_batch_size is None:
        return "-"
    if max_batch_size == 1:
        return "OFF: each request runs alone (serve with --max-batch-size 32 to share passes)"
    return f"up to {max_batch_size} requests a pass"


def _transports(requests: dict) -> str:
    by = requests.get("decide_by_transport") or {}
    return f" ({_text(by.get('zmq', 0))} zmq, {_text(by.get('http', 0))} http)" if by.get("http") else ""


def _plan_row(plan) -> list:
    """The shape plan: its runner and buckets, and how many passes ran in them or as they came."""
    if not isinstance(plan, dict):
        return [("plan", "-")]
    if not plan.get("runner"):
        return [("plan", "off: passes run in the shapes they come in (--shape-plan, --cuda-graphs)")]
    eager = plan.get("eager") if isinstance(plan.get("eager"), dict) else {}
    why = ", ".join(f"{_text(n)} {reason}" for reason, n in sorted(eager.items()))
    return [("plan", f"{_text(plan.get('runner'))}, {_text(plan.get('buckets'))} shapes"
                           f"{_captured(plan)}   {_text(plan.get('planned'))} passes planned, "
                           f"{sum(_as_int(n) for n in eager.values())} as they came{f' ({why})' if why else ''}"
                           f"{_recompiles(plan)}")]


def _captured(plan: dict) -> str:
    return f" ({_text(plan.get('captured'))} captured)" if plan.get("runner") == "graphs" else ""


def _recompiles(plan: dict) -> str:
    return f", {_text(plan.get('recompiles'))} recompiles" if plan.get("runner") == "compiled" else ""


def _http_row(http, batching: dict) -> list:
    if not isinstance(http, dict):
        return []
    return [("http", f"{_text(http.get('address'))}   gateway {_text(http.get('state'))}, pid "
                     f"{_text(http.get('pid'))}, {_text(http.get('restarts'))} restarts   "
                     f"{_text(batching.get('mixed_transport_batches', 0))} batches mixed http and zmq")]


def format_models(result: dict) -> str:
    blocks = []
    for model in result.get("models") or []:
        rows = [(key, _text(value)) for key, value in model.items() if key != "id"]
        blocks.append(f"{_text(model.get('id'))}\n{_table(rows, indent=2)}")
    return "\n\n".join(blocks) or "no models"


def _errors_block(requests: dict) -> str:
    by_code = requests.get("by_error_code") or {}
    if not by_code:
        return ""
    rows = sorted(by_code.items(), key=lambda item: (-_as_int(item[1]), item[0]))
    return "errors by code\n" + _table([(code, _text(n)) for code, n in rows], indent=2)


def _workers_block(s: dict) -> str:
    workers = s.get("workers") or []
    keys = ("pid", "state", "restarts", "requests")
    rows = [tuple(key.upper() for key in keys) + ("MEMORY", "DEVICE")]
    rows += [tuple(_text(w.get(key)) for key in keys) + _device_cells(w) for w in workers if isinstance(w, dict)]
    return f"workers ({len(workers)})\n" + _table(rows, indent=2) if workers else "workers: none"


def _device_cells(worker: dict) -> tuple[str, str]:
    """('12.3/139.8 GiB', 'cuda:0 NVIDIA H200') from a worker's device and its own device report."""
    info = worker.get("device_info")
    info = info if isinstance(info, dict) else {}
    used, total = info.get("memory_used_bytes"), info.get("memory_total_bytes")
    memory = f"{_gib(used)}/{_gib(total)} GiB" if _is_number(used) or _is_number(total) else "-"
    name = info.get("name")
    device = _text(worker.get("device")) + (f" {name}" if isinstance(name, str) and name else "")
    return memory, device


def _gib(n: Any) -> str:
    return f"{n / (1 << 30):.1f}" if _is_number(n) else "-"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _histogram_block(batching: dict) -> str:
    histogram = batching.get("batch_size_histogram") or {}
    if not histogram:
        return ""
    rows = sorted(histogram.items(), key=lambda item: _as_int(item[0]))
    top = max(_as_int(count) for _, count in rows) or 1
    lines = ["batch sizes (batches per size)"]
    width = max(len(str(size)) for size, _ in rows)
    for size, count in rows:
        n = _as_int(count)
        bar = "#" * (max(1, round(n * _BAR_WIDTH / top)) if n else 0)
        lines.append(f"  {str(size):>{width}}  {bar} {n}")
    return "\n".join(lines)


def _section(s: dict, key: str) -> dict:
    value = s.get(key)
    return value if isinstance(value, dict) else {}


def _table(rows: list[tuple], indent: int = 0) -> str:
    if not rows:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pad = " " * indent
    return "\n".join(
        pad + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    )


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def _number(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else _text(value)


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"
