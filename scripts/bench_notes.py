"""bench_notes: BENCHMARKS.md, written by `scripts/bench.py --write-md`: the table and what
each figure means."""

from __future__ import annotations

HEADER = """# Benchmarks

What gpuwhy costs a host, and how fast it answers: every figure of `scripts/bench.py`
(`sudo gpuwhy bench`, the same), from its last full run, what each figure means, and how
to reproduce it. What was tried, kept and dropped to reach these figures is in the
[decision records](docs/decisions/README.md).

```sh
sudo .venv/bin/python scripts/bench.py --json bench.json --write-md BENCHMARKS.md  # full run
sudo .venv/bin/python scripts/bench.py --quick                 # smaller sizes, fewer repeats
sudo .venv/bin/python scripts/bench.py --only sidecar,correlator   # some benchmarks (see --help)
```

Each figure is the median over repeated runs (the `runs` column) with the min and max; the
reference is what the figure is compared with (no probes, strace, the seed tool's figures)
and the ratio is figure / reference; `pass` or **miss** compares the figure (its p95 where
the goal says so) with the goal. Each component's script (`scripts/bench_*.py`) also runs
on its own and prints more detail.
"""

NOTES = """
## What each figure means

- **P1**: ns added to one `ioctl` by the probes (`gpuwhy probes`: fdtrack + lifecycle +
  sched, loaded as the service loads them), measured by `scripts/bench_probes.c` in a tight
  loop: on a look-alike NVIDIA device file the probe tracks (decoded and counted in the
  kernel), on a file it does not track, and on another syscall (`getppid`). The figure is
  the run-by-run difference with the same loop without probes; the reference is what
  `strace -f -e trace=ioctl` adds to the same loop, the intrusive way to see these calls.
  The "floor" rows (`scripts/bench_attach.py`) load bare programs (one array lookup) on
  each attachment that could see ioctl, so they show what no program body can go below:
  fdtrack's pair of syscall tracepoints costs ≈ +400 ns per ioctl by itself on this kind of
  VM, above the 150 ns goal for an untracked ioctl; raw tracepoints cost less per ioctl but
  tax every other syscall on the host; kprobes and fentry are refused by this kernel.
  Every P1 figure is measured with `kernel.bpf_stats_enabled` off (restored afterwards):
  when on, the kernel times every program run, ≈ 250 ns more per traced ioctl here.
- **P2**: slowdown of a pipe ping-pong (two processes waking each other, the worst case
  for the scheduler probe), both on one CPU: when both are GPU processes and 10 are
  tracked in all, and when neither is (what every other process on the host pays). Across
  CPUs the round trip is mostly the wake-up's inter-processor interrupt (≈ 43 µs on this
  VM, a noise far larger than a switch), on one CPU two switches and four syscalls
  (≈ 5 µs). The reference is the floor: a bare program (one array lookup) on each
  tracepoint the probes attach, read from their sources (`bench_attach.probe_tracepoints`).
  The syscall tracepoints put every syscall on the kernel's slow path and the
  `sched_switch`/`sched_wakeup` tracepoints run at every switch and wake-up on the host,
  so that floor alone is well above the 2 % goal; the ratio says what the probes' own code
  adds to it.
- **P3**: the whole sidecar as it runs: the real `gpuwhy up` (service process: correlator,
  store, web view, simulated GPU source, kernel-log, cron and rules threads; and its
  `gpuwhy probes` child) with 8 simulated GPUs at 1 Hz and 16 stand-in GPU processes
  (`gpuwhy.app.demo.standin train --starved`: each holds nvidiactl/nvidiaN/nvidia-uvm
  look-alikes and sends about 20 driver calls a second), then the seed tool's case of
  1 GPU and 3 processes, then an idle host: 2 GPUs and no GPU process, a host between
  jobs (goal ≤ 0.3 %; its memory is the 1-GPU case's, so only its CPU is shown). CPU is
  CPU seconds per wall second of those two processes
  (their threads' nanosecond counts in `/proc/PID/task/*/schedstat`; psutil's 10 ms ticks
  read a few-second window in 0.33 % steps), per window after the warm-up; the eBPF
  programs' own time runs inside the
  traced processes' system calls and is in P1, not here. Memory is from
  `/proc/PID/smaps_rollup`: RSS, and anonymous (private, not backed by a file: what the
  sidecar really takes). Most of the probes' RSS is clean file pages of bcc's LLVM/clang
  libraries (shown in the note): shared with any other bcc user and dropped by the kernel
  under memory pressure, they are why RSS is far above the anonymous figure. The simulator
  sends 37 fields per GPU, more than the 25 the goal is stated for. The reference for the
  probes process is the seed tool's bcc figures (≈ 131 MB RSS after compiling a handful of
  probes, ≈ 83 MB of it LLVM pages, ≈ 19 MB anonymous after `malloc_trim(0)`).
  "probes alone" loads the probes in a bare process and shows what glibc's `malloc_trim(0)`
  gives back after the compile. `gpuwhy probes` then goes further (`probes/release.py`):
  it frees each loaded program's LLVM module, trims, and drops the compiler libraries'
  clean pages from its resident set, so the sidecar's probes RSS counts ~13 MB of them,
  not ~85.
  "GPU source alone" is the simulator runner's thread CPU (`scripts/bench_gpu_sources.py`).
  "Kernel memory" is the `memlock` of the probes' BPF maps and programs
  (`/proc/PID/fdinfo`): locked kernel memory, in no process's RSS; the note computes what
  the maps would hold with 224 possible CPUs (a per-CPU map keeps a value for each). "The
  scheduler's flush" is the sched probe's flush alone, in thread CPU, with 8 processes of
  100 real threads (`bench_sidecar.py --thread-flush`), every thread waking every 50 ms (the
  worst case: every entry moved) and 10 of each 100 (the others asleep on a futex, as a
  runtime's pools between parallel sections): the stand-ins above have one thread each, a
  real GPU process tens to hundreds. A flush copies every watched thread's entry out of the
  kernel, and reads in full only those that moved.
  "With 20 short-lived host processes a second": after the windows above, windows without
  and with a thread that starts `sh -c true` 20 times a second (a host's health checks,
  scripts and agents: the lifecycle probe sees every process's exec, fork and exit, and the
  service stores them), alternated; "added per short-lived host process" is, window by
  window, the difference over the processes a second. "After 10 minutes" (full run only):
  the memory of the 8-GPU case read again 10 minutes after its start. The service's memory
  grows for minutes after start (the rules' windows fill up to their longest window asked,
  30 minutes here, and the store's page caches fill), so the memory rows above, read in
  the first two minutes, are lower than what a running host holds.
- **P4**: a publisher process sends a realistic mix of events as fast as it can, in batch
  messages of 256 events in runs of a topic (as the probes' flush sends its per-process
  figures), and again a message per event (the reference); the real correlator writes them
  to a real store, one transaction per batch of 5,000. Losses are bus sequence gaps,
  rejected events and events never written. "Busy" is the correlator thread's CPU time
  over wall time: near 100 %, it is the correlator, not the publisher, that sets the pace.
  The floor row replaces the correlator with the least any consumer of this bus on
  Python's sqlite3 does (receive and decode each event, one `executemany`'d `events` row
  an event; the correlator writes ~1.3 rows an event and decides). The goal is the first
  row: the correlator's pace over the floor's, pair by pair, at least 0.8 (issue #23); an
  absolute rate would judge the machine, not the correlator. Each pair's two runs go side
  by side, in turn first: the VM's pace drifts over minutes.
- **P5**: bytes of the raw-sample and rollup tables (`dbstat`) per GPU-day, filled through
  the real StoreWriter with the simulator's samples; the reference is the GPU-sources
  schema before the store's compact samples table.
- **P6**: p95 of the incident list, the reset history and a 1-hour process timeline on a
  7-day, 8-GPU store (`store.synthetic`), each query run 50 times.
- **P7**: a marked `NVRM: Xid` line written to `/dev/kmsg` until the incident row is in the
  store and its alert is in the journal (journald, the kernel-log source, the correlator,
  all real); then a real cron job runs a stand-in `nvidia-smi -r` (`gpuwhy demo
  cron-reset`): from its reset driver call (as stamped by the probes) until the incident's
  chain cron job → command → driver call → reset is complete in the store (polled every
  50 ms, so the figure is up to 50 ms late). Each run waits for a cron minute.
- **R**: CPU per evaluation round of 30 shipped rules over 8 GPUs and 32 processes with 1 Hz
  data, as % of one core at the default 10 s interval, with signals held in memory and read
  from the store (the service's path). "Rows the rules hold between rounds": what the
  signals keep from one round to the next (`Signals.held_rows()`, also the rules' health
  counter `rows_held`), every shipped rule over the same host for 70 minutes of rounds,
  against the figure after 35: the same once the longest window asked is full.
- **W**: p95 of the web view's GPU chart API over the stored days (downsampled to
  `web.max_points`).
- **C**: what the opt-in CUDA uprobes add per call of a stand-in libcuda (uprobes trap into
  the kernel: microseconds on this VM).

## What was not measurable here

No NVIDIA GPU, driver, NVML or DCGM exists on this machine: driver calls go to look-alike
files (they fail with ENOTTY after the tracepoints fired, so the driver's own time is
missing from every baseline), GPU counters come from the simulator, and the CUDA libraries
are stand-ins. The machine is a 2-core VM shared with other work: CPU figures and
latencies move with its load (the load average is given above; figures under load are
inflated, never flattered). The seed tool itself is not here: its figures are the ones
its issue quotes, measured on this kind of machine.
"""


THREADS = """### Where P3's CPU goes, thread by thread

Each thread's CPU (`/proc/PID/task/*/schedstat`) and context switches (`status`: a
wake-up each, so a GIL hand-off counts too) over P3's windows above, per case, by the
name gpuwhy gives it in the kernel (`gpuwhy/threads.py`: `top -H` shows the same).
- service: `correlator` receives the bus, writes the store a batch at a time and decides
  (incidents, GPU health, chains); `source-gpu` asks for the 1 Hz GPU read and publishes it
  and the source's health, `gpu-read` reads (here the simulator; DCGM or NVML on a GPU
  host); `source-rules` runs a rules round every 10 s; `source-klog` waits on the kernel
  log, `source-cron` on journald until its next job is due; `web` is the web view's server;
  `python` is the main thread (the threads' watch, systemd's watchdog).
- probes: `python`, their one thread, polls the ring buffers and flushes the maps.
- `ZMQbg/IO/0`: each process's ZeroMQ I/O thread (the bus).
"""


def benchmarks_md(description: str, table: str, existing: str | None = None,
                  threads: str = "") -> str:
    """The whole file: header, when and where it ran, the table (and P3's thread-by-thread
    one, ``threads``), the notes. Given the file as it is (``existing``), only its "Last
    full run" section is replaced: the sections written by hand after it (what each pass
    measured and changed) are kept."""
    run = f"## Last full run\n\n{description}.\n\n{table}\n" + \
        (f"\n{THREADS}\n{threads}\n" if threads else "")
    start = existing.find("## Last full run\n") if existing else -1
    if start == -1:
        return f"{HEADER}\n{run}{NOTES}"
    end = existing.find("\n## ", start + 1)
    return existing[:start] + run + (f"\n{existing[end + 1:]}" if end != -1 else "")
