"""CPU cost of sampling simulated GPUs and publishing them on the bus (run on demand).

    .venv/bin/python scripts/bench_gpu_sources.py [--gpus 8] [--seconds 20] [--interval 1]

Runs the real GpuRunner (simulator -> Publisher) against a real bound Subscriber that
drains in another thread, and reports the runner thread's CPU seconds per wall second.
Also measures the same work without sleeping, to give the cost of one round.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from gpuwhy.bus import Publisher, Subscriber
from gpuwhy.probes.gpu.runner import GpuRunner
from gpuwhy.probes.gpu.sim import SimulatedGpus


def drain(subscriber: Subscriber, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        if subscriber.receive(0.1) is not None:
            counts[0] += 1


def run(gpus: int = 8, seconds: float = 20.0, interval: float = 1.0) -> dict:
    """The runner's CPU share of one core over ``seconds``, and the cost of one round."""
    endpoint = f"ipc://{tempfile.mkdtemp()}/bench.sock"
    subscriber = Subscriber(endpoint)
    publisher = Publisher(endpoint, src="bench")
    stop, received = threading.Event(), [0]
    drainer = threading.Thread(target=drain, args=(subscriber, stop, received))
    drainer.start()
    publisher.wait_for_subscriber(5)
    source = SimulatedGpus(count=gpus, interval=interval)
    source.open()
    fields = len(source.read()[0].fields)
    runner = GpuRunner(source, ["sim: bench"], publisher, interval)

    result: dict[str, float] = {}

    def timed_run() -> None:
        start_cpu, start = time.thread_time(), time.monotonic()
        runner.run(run_stop)
        result["cpu"], result["wall"] = time.thread_time() - start_cpu, time.monotonic() - start

    run_stop = threading.Event()
    thread = threading.Thread(target=timed_run)
    thread.start()
    time.sleep(seconds)
    run_stop.set()
    thread.join()
    rounds = 200
    start_cpu = time.thread_time()
    for _ in range(rounds):
        runner.step()
    per_round = (time.thread_time() - start_cpu) / rounds
    time.sleep(0.5)
    stop.set()
    drainer.join()
    publisher.close()
    subscriber.close()
    return {"gpus": gpus, "fields": fields, "interval": interval, "wall": result["wall"],
            "cpu": result["cpu"], "share_pct": result["cpu"] / result["wall"] * 100,
            "round_s": per_round, "received": received[0], "dropped": publisher.dropped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    r = run(args.gpus, args.seconds, args.interval)
    per_round = r["round_s"]
    rows = [("GPUs × fields", f"{r['gpus']} × {r['fields']}"), ("interval", f"{r['interval']} s"),
            ("wall time", f"{r['wall']:.1f} s"),
            ("runner CPU time", f"{r['cpu'] * 1000:.1f} ms"),
            ("CPU share of one core", f"{r['share_pct']:.3f} %"),
            ("one round (read + publish)", f"{per_round * 1e6:.0f} µs"),
            ("one round at 1 Hz, of one core", f"{per_round * 100:.3f} %"),
            ("messages received", str(r["received"])), ("dropped", str(r["dropped"]))]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
