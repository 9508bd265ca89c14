"""Media requests on the tiny multimodal model: what one costs, and what it costs the text around it.

One daemon (the tiny multimodal qwen3_5, pointer readout, FP32 on the CPU,
max_batch_size 8, a media root holding generated images) and:

- image latency: one client, image requests one after another, p50;
- text under load: 8 closed-loop text clients, alone and then beside one
  client sending image requests back to back; text p50 and requests per
  second in each, and their ratio.

    .venv/bin/python benchmarks/media_bench.py [--out PATH]
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import ClientPool, Daemon, machine, median, percentile, write_result   # noqa: E402

from jevany_daemon import workloads   # noqa: E402
from jevany_daemon.model.tiny import build_tiny_model   # noqa: E402

TEXT_CLIENTS = 8


def images(root: Path, n: int) -> list[str]:
    from PIL import Image

    names = []
    for i in range(n):
        image = Image.new("RGB", (64, 48))
        image.putdata([((x * 7 + i * 31) % 256, (y * 5 + i) % 256, (x + y) % 256) for y in range(48) for x in range(64)])
        image.save(root / f"img{i}.png")
        names.append(f"img{i}.png")
    return names


def media_bodies(names: list[str], n: int) -> list[dict]:
    question = {"q": {"type": "choice", "criteria": {"cat": None, "dog": None, "bird": None}}}
    return [{"state": {"note": f"photo {i}"}, "questions": question,
             "media": [{"type": "image", "uri": names[i % len(names)]}]} for i in range(n)]


def text_run(pool: ClientPool, daemon: Daemon, text: list, media: list | None) -> dict:
    """8 text clients (and, with media, one more sending it); the text clients' figures."""
    conns = pool.conns[:TEXT_CLIENTS + (1 if media else 0)]
    for k in range(TEXT_CLIENTS):
        conns[k].send((daemon.endpoint, text[k::TEXT_CLIENTS]))
    if media:
        conns[-1].send((daemon.endpoint, media))
    for c in conns:
        assert c.recv() == "ready"
    started = time.perf_counter()
    for c in conns:
        c.send("go")
    text_latencies = [t for c in conns[:TEXT_CLIENTS] for t in c.recv()]
    elapsed = time.perf_counter() - started        # the text clients' time; the media client may run on
    media_latencies = conns[-1].recv() if media else []
    # The media client runs on after the text clients finish: count what it did beside them.
    spent, beside = 0.0, []
    for t in media_latencies:
        spent += t
        if spent > elapsed:
            break
        beside.append(t)
    return {"text_rps": len(text) / elapsed, "text_p50_ms": percentile(text_latencies, 0.5) * 1000,
            "media_beside_text": len(beside),
            "media_p50_beside_text_ms": percentile(beside, 0.5) * 1000 if beside else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=HERE / "results" / "cpu-fp32-tiny-media.json")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="jv-media-bench-"))
    model = build_tiny_model(root / "mm", arch="qwen3_5", readout="pointer", multimodal=True)
    media_root = root / "media"
    media_root.mkdir()
    names = images(media_root, 8)
    settings = argparse.Namespace(device="cpu", dtype="fp32", serve_args=["--media-root", str(media_root)])
    daemon = Daemon(model, settings, batch=8, policy="adaptive")
    pool = ClientPool(TEXT_CLIENTS + 1)
    try:
        for body in media_bodies(names, 3):                # warm the vision path
            daemon.client.call("decide", body)
        idle = []
        for body in media_bodies(names, 40):
            started = time.perf_counter()
            daemon.client.call("decide", body)
            idle.append((time.perf_counter() - started) * 1000)
        text = workloads.short(240, seed=7)
        alone, beside = [], []
        for r in range(args.rounds):                      # alternate which goes first
            for kind in (("alone", "beside") if r % 2 == 0 else ("beside", "alone")):
                run = text_run(pool, daemon, text, media_bodies(names, 400) if kind == "beside" else None)
                (alone if kind == "alone" else beside).append(run)
    finally:
        pool.close()
        daemon.stop()
    summary = {k: {f: median([x[f] for x in runs]) for f in ("text_rps", "text_p50_ms")}
               for k, runs in (("alone", alone), ("beside_media", beside))}
    result = {
        "machine": machine(),
        "settings": {"model": "tiny qwen3_5 multimodal, pointer, fp32, cpu", "max_batch_size": 8,
                     "image": "64x48 PNG", "text_clients": TEXT_CLIENTS, "rounds": args.rounds},
        "image_idle_p50_ms": median(idle), "image_idle_p99_ms": percentile(idle, 0.99),
        "text": summary, "rounds": {"alone": alone, "beside_media": beside},
        "text_rps_ratio": summary["beside_media"]["text_rps"] / summary["alone"]["text_rps"],
        "text_p50_ratio": summary["beside_media"]["text_p50_ms"] / summary["alone"]["text_p50_ms"],
    }
    print(f"image request, idle: p50 {result['image_idle_p50_ms']:.1f} ms")
    print(f"text, {TEXT_CLIENTS} clients: {summary['alone']['text_rps']:.1f} req/s, p50 "
          f"{summary['alone']['text_p50_ms']:.1f} ms alone; {summary['beside_media']['text_rps']:.1f} req/s, p50 "
          f"{summary['beside_media']['text_p50_ms']:.1f} ms beside a media client "
          f"({result['text_rps_ratio']:.2f}x throughput, {result['text_p50_ratio']:.2f}x p50)")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
