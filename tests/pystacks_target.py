"""A Python process for the stack sampler's tests: a planted slow function in a loop, counting.

``python pystacks_target.py COUNTER [--workers N] [--evil]`` loops on
:func:`planted_slow_function` and writes how many calls it finished to COUNTER every 50 ms,
so a test can tell whether it kept running while it was sampled. ``--workers N`` forks N
children that run the same loop (the DataLoader workers' role) while the main thread waits
on a multiprocessing queue. ``--evil`` renames the function with markup, control characters,
the folded format's separator and 500 more characters, as any process can.
"""

import multiprocessing
import os
import sys
import time

PLANTED_LINE = 22     # the line below that the samples must name


def planted_slow_function(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i        # line 22: where the time goes
    return total


def _count(path: str, done: int) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as out:
        out.write(f"{done} {time.monotonic()}\n")
    os.replace(tmp, path)


def work(path: str | None) -> None:
    done, last = 0, 0.0
    while True:
        planted_slow_function(2000)
        done += 1
        if path is not None and time.monotonic() - last >= 0.05:
            _count(path, done)
            last = time.monotonic()


def worker(queue: "multiprocessing.Queue[int]") -> None:
    while True:
        queue.put(planted_slow_function(20000))


def main() -> None:
    path = sys.argv[1]
    if "--evil" in sys.argv:
        name = "<b>evil</b>\x1b[31m;x\u202e" + "y" * 500
        code = planted_slow_function.__code__
        planted_slow_function.__code__ = code.replace(co_name=name, co_qualname=name)
    if "--workers" in sys.argv:
        count = int(sys.argv[sys.argv.index("--workers") + 1])
        queue: multiprocessing.Queue[int] = multiprocessing.get_context("fork").Queue()
        for _ in range(count):
            multiprocessing.get_context("fork").Process(target=worker, args=(queue,),
                                                        daemon=True).start()
        done, last = 0, 0.0
        while True:
            queue.get()
            done += 1
            if time.monotonic() - last >= 0.05:
                _count(path, done)
                last = time.monotonic()
    work(path)


if __name__ == "__main__":
    main()
