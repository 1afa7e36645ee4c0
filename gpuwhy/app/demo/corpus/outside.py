"""The outside corpus: hosts written from outside sources (issue threads, vendor documents,
large-cluster failure studies, a real recording), each citing its source in its notes.

Harness, not product. It measures how the rules generalise beyond the built-in corpus they
were written beside (issue #56, item 6; docs/decisions/0019-outside-corpus.md). The
expected rule ids were chosen from the cause the source describes, before running any rule.

The corpus is split once, by a hash of each scenario's name (:func:`half`), into a
**tuning** half, which rule changes may be checked against, and a **held-out** half, which
is only measured: a change that raises one half and lowers the other is reverted. The split
is recorded in each manifest (``"half"``) and `gpuwhy rules eval --corpus-set outside`
reports the halves apart.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable

from gpuwhy.app.demo.corpus.host import (
    A100,
    CNN_TRAIN,
    H100,
    L4,
    L40S,
    LLM_DECODE,
    LLM_TRAIN,
    TICKS,
    Board,
    Host,
    Inference,
    Mix,
    Steady,
    Training,
    cuda_start_fails,
    gpu_state,
    gpu_xid,
    pci,
    power_speed,
    thermal_speed,
)
from gpuwhy.app.demo.corpus.planted import Scenario
from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    DriverCall,
    ProcessExec,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.identity import ProcessKey
from gpuwhy.nvioctl import iowr

OUTSIDE: list[Scenario] = []
TUNING, HELD_OUT = "tuning", "held-out"

# The real H200 of tests/data/real/h200 (nvidia-smi -q there): 143771 MiB, 700 W, PCIe
# Gen5, 1980 MHz, idle at 345 MHz; the dynamic power and thermal figures are the H100's
# (same GH100 die and board power).
H200 = Board("NVIDIA H200", 132, 1980, 345, 3201, 700, 70, 115, 843, 143771, 5, 450e9, 0.061,
             fabric=False)


def half(name: str) -> str:
    """The half a scenario belongs to, fixed by its name alone (the first byte of its
    SHA-256: even, tuning; odd, held-out)."""
    return TUNING if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else HELD_OUT


def scenario(name: str, seed: int, cause: str, expected: tuple[str, ...] = (),
             group: str = "", onset_s: float = 0.0, notes: str = ""):
    def register(build: Callable[[int], Host]) -> Callable[[int], Host]:
        OUTSIDE.append(Scenario(name, seed, cause, tuple(expected), build, group, onset_s,
                                notes, half(name)))
        return build
    return register


def node(seed: int, board: Board, gpus: int, minutes: float, source: str = "dcgm",
         hostname: str = "gpu-node-07") -> Host:
    host = Host(seed, board, gpus, int(minutes * 60), source, hostname=hostname)
    host.monitors()
    host.chatter()
    return host


def cron_job(host: Host, t: float, command: str) -> None:
    """cron runs ``command`` (its crontab line) at ``t``: the CRON journal line names it and
    what it does to GPUs, and the commands it runs are exec'd."""
    host.cron(t, command, gpu_action=gpu_action(command))
    for k, part in enumerate(command.split("&&")):
        host.command(t + 0.05 + 0.3 * k, part.strip(), lasts_s=0.25)


def version_check_fails(host: Host, t: float, cmdline: str, client: str, lasts_s: float = 2.0,
                        ppid: int = 1, uid: int = 1000) -> ProcessKey:
    """A CUDA or NVML client of driver ``client`` starts at ``t`` against a loaded kernel
    module of another version: cuInit/nvmlInit open /dev/nvidiactl and send
    NV_ESC_CHECK_VERSION_STR with the client's version; the module refuses it (the ioctl
    returns -EINVAL, open-gpu-kernel-modules nv.c) and the client exits
    (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 'Driver/library version mismatch')."""
    key = ProcessKey(host.pid(), int((host.uptime_s + t) * TICKS))
    exe = "/usr/bin/" + cmdline.split()[0].rsplit("/", 1)[-1]
    opens = t + lasts_s - 0.3
    host.extra += [
        (t, "probes", ProcessSeen(ts=0, process=key, comm=exe.rsplit("/", 1)[-1][:15],
                                  cmdline=cmdline, exe=exe, ppid=ppid, uid=uid)),
        (t + 0.001, "probes", ProcessExec(ts=0, process=key, filename=exe, ppid=ppid)),
        (opens, "probes", DeviceOpened(ts=0, process=key, fd=3, path="/dev/nvidiactl",
                                       device="nvidiactl", minor=None)),
        (opens + 0.002, "probes", DriverCall(
            ts=0, process=key, tid=key.pid, fd=3, path="/dev/nvidiactl", device="nvidiactl",
            cmd=iowr(0xD2, 72), nr=0xD2, size=72, op="NV_ESC_CHECK_VERSION_STR",
            latency_ns=41_000, ret=-22, version=client, reasons=["notable", "error"])),
        (opens + 0.01, "probes", DeviceClosed(ts=0, process=key, fd=3, path="/dev/nvidiactl")),
        (opens + 0.02, "probes", ProcessExited(ts=0, process=key, exit_code=1))]
    return key


def fsdp(gpus: list[int], **changes) -> Training:
    """Llama-2 7B FSDP, bf16 (the built-in corpus's figures, from model FLOPs)."""
    job = dict(gpus=gpus, gpu_s=0.99, host_s=0.08, mix=LLM_TRAIN, workers=2,
               worker_cpu_s=0.02, h2d_bytes=65536, comm_bytes=35e9, overlap=0.9,
               kernels=8000, fb_mib=71000, threads=64,
               cmdline="/usr/bin/python3 -u train.py --config configs/llama2_7b_fsdp.yaml")
    job.update(changes)
    return Training(**job)


def resnet(gpus: list[int], **changes) -> Training:
    job = dict(gpus=gpus, gpu_s=0.116, host_s=0.03, mix=CNN_TRAIN, workers=16,
               worker_cpu_s=256 * 0.0055, cores=30, h2d_bytes=38.5e6, comm_bytes=153e6,
               overlap=0.9, kernels=1600, fb_mib=31000, threads=44,
               cmdline="/usr/bin/python3 -u train_imagenet.py --arch resnet50 --amp -b 256")
    job.update(changes)
    return Training(**job)


# === a critical answer needs its evidence: hangs with and without a collective ==============
@scenario("single-gpu-kernel-spin-hang", 2101,
          "one single-GPU process hangs inside its own kernel at 200 s (a custom CUDA kernel "
          "spins on a flag that is never set): utilisation reads 100 % on a few SMs at low "
          "power, the process waits in cudaStreamSynchronize; no collective, no peer",
          ("R09_small_grid_low_sm",), "device_efficiency", onset_s=200,
          notes="source: https://github.com/tensorflow/tensorflow/issues/17968 (one GPU, "
                "'GPU at 100% utilization, but temp/fan are low, and training is stuck'); "
                "no rule names a hung kernel: the honest answer is the symptom, cause not "
                "established")
def _(seed: int) -> Host:
    host = node(seed, A100, 2, 11)
    host.add(resnet([0], gpu_s=0.3, workers=8, cores=14, comm_bytes=0.0,
                    hang={0: (200.0, "spin")},
                    cmdline="/usr/bin/python3 train_ocr.py --model crnn --custom-ctc-kernel"))
    return host


@scenario("notebook-kernel-spin-hang-l40s", 2102,
          "a single-GPU notebook on an L40S hangs in a Triton kernel it compiled (a loop "
          "bound read from uninitialised memory) at 150 s: the GPU reads 100 % busy on a few "
          "SMs; the other GPUs serve inference; nothing is distributed",
          ("R09_small_grid_low_sm",), "device_efficiency", onset_s=150,
          notes="source: https://github.com/tensorflow/tensorflow/issues/17968 and "
                "https://github.com/open-mmlab/mmdetection/issues/6169 ('GPU-Util 100% ... "
                "as if it is stuck'); one process, one GPU")
def _(seed: int) -> Host:
    host = node(seed, L40S, 4, 12)
    host.add(Training(gpus=[0], gpu_s=0.2, host_s=0.02, workers=2, worker_cpu_s=0.05,
                      mix=Mix(0.7, 0.35, 0.3, 0.4, 0.1, 0.1), h2d_bytes=4e6, kernels=900,
                      fb_mib=21000, threads=40, hang={0: (150.0, "spin")},
                      cmdline="/opt/conda/bin/python -m ipykernel_launcher -f /home/jo/.local/"
                              "share/jupyter/runtime/kernel-77ab.json",
                      comm="python", exe="/opt/conda/bin/python"))
    for g in (1, 2, 3):
        host.add(Inference(gpus=[g], rate=lambda t: 3.0, tokens=200, iter_s=0.028,
                           per_seq_s=0.0003, fb_mib=40000,
                           cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server "
                                   "--model /models/llama-3-8b-instruct"), seed=str(g))
    return host


@scenario("dead-rank-pcie-allreduce", 2103,
          "a 4-rank DDP job on L40S boards (no NVLink: the all-reduce crosses PCIe) loses "
          "rank 2 to the host OOM killer at 240 s; the other ranks wait in the all-reduce "
          "until NCCL's 10-minute timeout", ("R17_collective_hang",), "communication",
          onset_s=240,
          notes="source: https://github.com/facebookresearch/Detectron/issues/219 ('one or "
                "more gpu run on 100% utility with low power usage'); Llama 3 paper, "
                "arXiv:2407.21783 section 3.3.4 (hung collectives, NCCL watchdog)")
def _(seed: int) -> Host:
    host = node(seed, L40S, 4, 12)
    host.add(Training(gpus=[0, 1, 2, 3], gpu_s=0.35, host_s=0.04, mix=CNN_TRAIN, workers=8,
                      worker_cpu_s=0.3, cores=16, h2d_bytes=20e6, comm_bytes=1.2e9,
                      link="pcie", overlap=0.7, kernels=2000, fb_mib=38000, threads=50,
                      visible="all", crash={2: (240.0, None, 9)},
                      cmdline="/usr/bin/python3 -m torch.distributed.run --nproc-per-node 4 "
                              "train_det.py --config mask_rcnn_r50.py"))
    return host


# === a lone symptom while the process's own threads say why ===================================
@scenario("no-workers-nfs-reads", 2201,
          "the training process reads its samples itself (DataLoader num_workers=0) as small "
          "files from a busy NFS server: its main thread spends more time blocked in D state "
          "than on a CPU, the GPU waits", ("R02_input_io_bound", "R03_dataloader_synchronous"),
          "host_starvation",
          notes="source: https://github.com/runa91/barc_release/issues/9 (workers set to 0, "
                "'most of time is 0% waiting for data'); PyTorch data loading docs "
                "(num_workers=0 loads in the main process)")
def _(seed: int) -> Host:
    host = node(seed, A100, 2, 11)
    host.add(Training(gpus=[0], gpu_s=0.09, host_s=0.02, mix=CNN_TRAIN, workers=0,
                      worker_cpu_s=24 * 0.004, worker_io_s=24 * 0.011, io_wait="disk",
                      h2d_bytes=3.6e6, kernels=700, fb_mib=14000, threads=38,
                      cmdline="/usr/bin/python3 train.py --data /mnt/nfs/dogs --bs 24 "
                              "--workers 0"))
    return host


@scenario("no-workers-http-streaming", 2202,
          "a single-GPU image classifier streams WebDataset shards over HTTPS in the "
          "training process (num_workers=0): each batch's 64 images (~7 MB) arrive at ~30 MB/s "
          "while the main thread sleeps on its socket, then it decodes them; the GPU waits",
          ("R02_input_io_bound", "R03_dataloader_synchronous"), "host_starvation",
          notes="source: https://github.com/mosaicml/streaming/issues/643 (GPU utilisation "
                "drops when streaming from remote storage); "
                "https://github.com/webdataset/webdataset/issues/267 (shards over pipe:/"
                "HTTP, the GPU waits for batches)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2, 12)
    host.add(Training(gpus=[0], gpu_s=0.12, host_s=0.025, mix=CNN_TRAIN, workers=0,
                      worker_cpu_s=64 * 0.005, worker_io_s=64 * 110e3 / 30e6, io_wait="net",
                      batch_bytes=64 * 110e3, h2d_bytes=9.6e6, kernels=1200, fb_mib=30000,
                      threads=46,
                      cmdline="/usr/bin/python3 train_vit.py --model vit_small -b 64 "
                              "--workers 0 --data https://data.example.org/in1k/"
                              "{000000..001281}.tar"))
    return host


# === settings changed by a scheduled job: the actor, not only the effect =====================
@scenario("cron-evening-power-cap", 2301,
          "a facility cron job caps every GPU at 250 W (of 400 W) at 180 s for the evening "
          "tariff (nvidia-smi -pl 250) under a running 4-GPU training job",
          ("R40_operator_or_cron_intervention",), "operator", onset_s=180,
          notes="source: nvidia-smi(1) -pl; NVIDIA DGX B200 user guide, 'Managing Power "
                "Capping' (https://docs.nvidia.com/dgx/dgxb200-user-guide/ power capping "
                "via nvidia-smi); the answer should name the job that changed the GPU")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, 11)
    for g in range(4):
        host.conditions[g].power_limit = lambda t: 250.0 if t >= 180.5 else 400.0
    speed = power_speed(A100, CNN_TRAIN, 250.0)
    host.add(resnet([0, 1, 2, 3], speed=lambda r, t: speed if t >= 180.5 else 1.0))
    cron_job(host, 180.0, "/usr/bin/nvidia-smi -pl 250")
    return host


@scenario("cron-lock-gpu-clocks", 2302,
          "an hourly cron job meant for benchmark nodes locks the SM clocks at 1200 MHz "
          "(nvidia-smi -lgc 1200,1200) on a training node at 240 s: the clocks hold low "
          "under load (clock event reason: application clocks setting)",
          ("R40_operator_or_cron_intervention",), "operator", onset_s=240,
          notes="source: nvidia-smi(1) -lgc/--lock-gpu-clocks; NVML "
                "nvmlClocksEventReasonApplicationsClocksSetting "
                "(https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html)")
def _(seed: int) -> Host:
    host = node(seed, H100, 4, 12)
    for g in range(4):
        host.conditions[g].app_clock = lambda t: 1200.0 if t >= 240.5 else None
    host.add(fsdp([0, 1, 2, 3], speed=lambda r, t: 1200 / 1980 if t >= 240.5 else 1.0))
    cron_job(host, 240.0, "nvidia-smi -lgc 1200,1200")
    return host


@scenario("cron-compute-mode-exclusive", 2303,
          "a cron job sets every GPU to EXCLUSIVE_PROCESS at 200 s (nvidia-smi -c 3) while an "
          "inference server holds GPU 0: the next job to start on GPU 0 cannot create a "
          "context and exits", ("R40_operator_or_cron_intervention",), "operator",
          onset_s=200,
          notes="source: nvidia-smi(1) -c/--compute-mode; CUDA programming guide, compute "
                "modes (exclusive-process: one context per device)")
def _(seed: int) -> Host:
    host = node(seed, A100, 2, 11)
    host.add(Inference(gpus=[0], rate=lambda t: 4.0 + math.sin(t / 100.0), tokens=180,
                       iter_s=0.03, per_seq_s=0.0002, fb_mib=60000))
    host.add(resnet([1], comm_bytes=0.0))
    cron_job(host, 200.0, "nvidia-smi -c EXCLUSIVE_PROCESS")
    for k in range(3):
        cuda_start_fails(host, 260.0 + 120 * k, "/usr/bin/python3 embed_batch.py --gpu 0",
                         [0], 4.0)
    return host


# === link traffic told apart: peers, offload, managed memory ==================================
@scenario("zero-offload-single-gpu", 2401,
          "DeepSpeed ZeRO-Offload fine-tunes Llama-2 7B on one A100-SXM of an 8-GPU node: "
          "after each step the bf16 gradients (14 GB) go to the host, CPU Adam runs there "
          "(~1.5 s on 24 cores), the parameters (14 GB) come back; the GPU waits; one GPU, "
          "no peer",
          ("R14b_low_gpu_utilisation", "R14_bursty_utilisation"), "host_starvation",
          notes="source: https://github.com/deepspeedai/DeepSpeed/issues/6695 (ZeRO-Offload "
                "step: transfers well below the PCIe peak, the GPU waits); ZeRO-Offload, "
                "arXiv:2101.06840 (CPU-Adam ~0.2 s per billion parameters); no rule names a "
                "host-side optimizer: the honest answer is the symptom, and not peers on "
                "PCIe (R15): one process, one GPU, the copies one way at a time")
def _(seed: int) -> Host:
    host = node(seed, A100, 8, 12)
    host.add(Training(gpus=[3], gpu_s=2.3, host_s=0.12, mix=LLM_TRAIN, workers=2,
                      worker_cpu_s=0.05, h2d_bytes=0.3e6, kernels=9000, fb_mib=61000,
                      threads=70, offload_bytes=14e9, cpu_step_s=1.5, cpu_step_cores=24,
                      cmdline="/usr/bin/python3 -u finetune.py --deepspeed ds_zero2_offload."
                              "json --model llama-2-7b"))
    return host


@scenario("uvm-oversubscribed-solver", 2402,
          "a sparse solver allocates 1.4x the GPU's memory as managed memory and prefetches "
          "its blocks back and forth (cudaMemPrefetchAsync): pages cross PCIe both ways near "
          "the link's limit while the SMs wait", ("R24_uvm_thrash",), "memory",
          notes="source: https://developer.nvidia.com/blog/improving-gpu-memory-"
                "oversubscription-performance/ (oversubscription: migration bound by the "
                "link, up to 100x slower)")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, 11)
    host.add(Steady(gpu=1, mix=Mix(0.3, 0.25, 0.0, 0.3, 0.15), busy=0.4, fb_mib=80500,
                    rx_Bps=21e9, tx_Bps=19.5e9, uvm_migrate=260, threads=14,
                    cmdline="./amgx_solve --matrix /data/reservoir_1400M.mtx --managed "
                            "--prefetch", comm="amgx_solve", exe="/opt/amgx/bin/amgx_solve"))
    return host


@scenario("acs-forces-shm-transport", 2403,
          "PCIe ACS left on by the BIOS of a bare-metal 8-GPU A100 node: NCCL's P2P over "
          "NVLink is refused and the all-reduce goes through host memory (SHM), both ways on "
          "every GPU at once, NVLink idle", ("R15_collectives_off_nvlink",), "communication",
          notes="source: NCCL troubleshooting, 'PCI Access Control Services (ACS)' "
                "(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/"
                "troubleshooting.html)")
def _(seed: int) -> Host:
    host = node(seed, A100, 8, 11)
    host.add(Training(gpus=list(range(8)), gpu_s=0.45, host_s=0.05, mix=LLM_TRAIN,
                      workers=2, worker_cpu_s=0.02, h2d_bytes=65536, comm_bytes=4.4e9,
                      link="shm", overlap=0.5, kernels=4000, fb_mib=48000, visible="all",
                      cmdline="/usr/bin/python3 -u pretrain_gpt.py --model gpt2-large"))
    return host


@scenario("fsdp-nvlink-with-prefetch-calls", 2404,
          "none: FSDP on 8 H100 over NVLink whose data pipeline keeps a managed-memory "
          "cache it prefetches now and then (a few cudaMemPrefetchAsync a second)",
          notes="source: NCCL/FSDP traffic on NVLink (the built-in corpus's figures); CUDA "
                "programming guide, unified memory prefetch (a few prefetch calls are not "
                "thrashing)")
def _(seed: int) -> Host:
    host = node(seed, H100, 8, 11)
    host.add(fsdp(list(range(8)), uvm_migrate=3.0))
    return host


# === driver and library versions ==============================================================
@scenario("version-mismatch-no-kernel-log", 2501,
          "unattended-upgrades installs 550.127.05 libraries under the loaded 550.90.07 "
          "module at 100 s; from 230 s every new job fails its driver version check "
          "(NV_ESC_CHECK_VERSION_STR refused); gpuwhy runs in a container without the host's "
          "kernel log, so no NVRM line reaches it", ("R41_driver_api_mismatch",),
          "sharing_config", onset_s=230,
          notes="source: https://github.com/lyulyul/shine-cluster/issues/30 (unattended-"
                "upgrade of libnvidia-common; running jobs fine, new ones cannot get a GPU); "
                "https://github.com/oddmario/NVIDIA-Ubuntu-Driver-Guide/issues/4")
def _(seed: int) -> Host:
    host = node(seed, H100, 4, 12)
    host.add(fsdp([0, 1]))
    host.command(100, "/usr/bin/python3 /usr/bin/unattended-upgrade")
    host.command(104, "dpkg --status-fd 3 --configure libnvidia-compute-550:amd64")
    for k in range(4):
        for rank in range(2):
            version_check_fails(host, 230 + 110 * k + 0.02 * rank,
                                "/usr/bin/python3 -u train.py --config configs/mistral.yaml",
                                "550.127.05")
    return host


@scenario("version-mismatch-nvml-only", 2502,
          "after a driver package update without a reboot, a Slurm prolog's nvidia-smi and "
          "each job's CUDA start fail with 'Driver/library version mismatch' (the NVML source "
          "was started before and keeps working); the kernel log is not readable here",
          ("R41_driver_api_mismatch",), "sharing_config", onset_s=150,
          notes="source: https://github.com/illinois-scicomp/machine-shop-maintenance/issues/"
                "70 ('Failed to initialize NVML: Driver/library version mismatch', kernel "
                "module 520.56.06, nvidia-smi 525.85.12)")
def _(seed: int) -> Host:
    host = node(seed, L4, 2, 11, source="nvml")
    host.add(Inference(gpus=[1], rate=lambda t: 2.0, tokens=180, iter_s=0.034,
                       per_seq_s=0.0004, fb_mib=20500))
    for k in range(4):
        t = 150 + 130 * k
        version_check_fails(host, t, "nvidia-smi -L", "525.85.12", lasts_s=0.3, uid=0)
        version_check_fails(host, t + 1.0, "/usr/bin/python3 infer_batch.py --gpu 0",
                            "525.85.12")
    return host


# === failures from large-cluster studies ======================================================
@scenario("single-gpu-job-gpu-lost", 2601,
          "GPU 1 of a 2-GPU NVML host falls off the bus at 260 s under a one-GPU job (Xid "
          "79); the job dies", ("R32_xid79_fallen_off_bus",), "failures", onset_s=260,
          notes="source: Kokolis et al., 'Revisiting Reliability in Large-Scale Machine "
                "Learning Research Clusters', arXiv:2410.21680 (GPU unavailable / fell off "
                "the bus among the leading hardware failures); NVIDIA Xid catalogue (79)")
def _(seed: int) -> Host:
    host = node(seed, L40S, 2, 11, source="nvml")
    host.add(resnet([1], comm_bytes=0.0, gpu_s=0.25, cores=14, workers=8,
                    crash={0: (261.0, 1, None)}))
    host.add(resnet([0], comm_bytes=0.0, gpu_s=0.25, cores=14, workers=8), seed="b")
    host.conditions[1].lost_at = 260.0
    host.klog(260.0, "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU "
                     "has fallen off the bus.")
    gpu_xid(host, 260.1, 1, 79)
    gpu_state(host, 260.3, 1, "lost", "NVML: GPU is lost")
    return host


# === serving engines: the engine's loop on one core (issue #59) ==============================
@scenario("vllm-qwen2-05b-h800-cpu-bound", 2701,
          "vLLM 0.4.2 serving Qwen2-0.5B on one H800 (80 GB): 247 requests running, 740 "
          "pending, KV cache ~99.7 %, ~2,100 generated tokens/s, and the GPU's compute "
          "~20 % used: for so small a model the engine's Python loop (scheduling, "
          "sampling, output processing on one core) takes most of each step",
          ("R49_engine_cpu_bound", "R48_kv_cache_pressure"), "host_starvation",
          notes="source: vllm-project/vllm issue #6737 (its metrics.py log lines: Running "
                "247 reqs, Pending 740 reqs, GPU KV cache usage 99.7 %, Avg generation "
                "throughput ~2136 tokens/s, prompt throughput 0). The H800 is modelled as an "
                "H100 (the same GH100 die, NVLink cut); the step's CPU share from the log: "
                "~240 tokens a step at 2,136 tokens/s is 0.11 s a step, 20 % of it on the GPU. "
                "The KV cache size is not given: sized so that the running requests fill it")
def _(seed: int) -> Host:
    host = node(seed, H100, 1, 12)
    host.add(Inference(gpus=[0], rate=lambda t: 3.0, tokens=1000, iter_s=0.004,
                       per_seq_s=0.00007, cpu_s_per_seq=0.00036, fb_mib=72000,
                       kv_tokens=200_000, prompt_tokens=300, prefill_s_per_token=0.000004,
                       cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server "
                               "--model /data/qwen2-0.5b --port 8000"))
    return host


@scenario("vllm-llama2-7b-a100-100-concurrent", 2702,
          "vLLM 0.3.2 serving Llama-2 7B (fp16) on one A100 80 GB, load-tested with Apache "
          "bench: from 1 to 100 concurrent requests the GPU's utilisation falls from 94 % "
          "to 56 %: each step's Python work grows with the batch, on one core",
          ("R49_engine_cpu_bound",), "host_starvation",
          notes="source: vllm-project/vllm issue #6105 (vllm-openai v0.3.2, A100, "
                "Llama-2-7b-chat-hf float16; Apache bench; GPU utilisation 94 % at 1 "
                "concurrent request, 56 % at 100). A closed loop: 100 requests in flight, "
                "each followed by the next, none left waiting in the engine's queue "
                "(max_num_seqs 256)")
def _(seed: int) -> Host:
    host = node(seed, A100, 1, 12)
    host.add(Inference(gpus=[0], rate=lambda t: 1.0, concurrency=100, tokens=256,
                       iter_s=0.016, per_seq_s=0.0002, cpu_s_per_seq=0.00025, fb_mib=72000,
                       kv_tokens=115_000, prompt_tokens=100, prefill_s_per_token=0.00007,
                       cmdline="python3 -m vllm.entrypoints.openai.api_server --model "
                               "meta-llama/Llama-2-7b-chat-hf --dtype float16"))
    return host


# === healthy hosts ============================================================================
@scenario("healthy-h200-vm-single", 2901,
          "none: a Firecracker VM with one H200 (the real recording's: driver 580.159.04, "
          "persistence on) runs a steady single-GPU fine-tune",
          notes="source: tests/data/real/h200 (nvidia-smi -q: 143771 MiB, 700 W, Gen5, "
                "1980 MHz max, 345 MHz idle); NVML source as there (no DCGM)")
def _(seed: int) -> Host:
    host = node(seed, H200, 1, 11, source="nvml", hostname="vm")
    host.driver = "580.159.04"
    host.add(fsdp([0], comm_bytes=0.0, gpu_s=0.7, fb_mib=118000,
                  cmdline="/opt/torch/.venv/bin/python3 finetune.py --model llama-3.1-8b "
                          "--bf16", exe="/opt/torch/.venv/bin/python3"))
    return host


@scenario("healthy-ddp-a100-nvlink", 2902,
          "none: ResNet-50 DDP on 8 A100-SXM over NVLink, 16 workers a rank, enough cores",
          notes="source: NVIDIA DeepLearningExamples ResNet-50 (AMP, DALI-free loader), "
                "~2.2k images/s per A100")
def _(seed: int) -> Host:
    host = node(seed, A100, 8, 11)
    host.add(resnet(list(range(8)), visible="all"))
    return host


@scenario("healthy-vllm-quiet-hours", 2903,
          "none: a vLLM server on one L40S at night: a request every few seconds, the GPU "
          "mostly idle between them, as serving is",
          notes="source: vLLM continuous batching (docs.vllm.ai); idle between requests is "
                "not a fault")
def _(seed: int) -> Host:
    host = node(seed, L40S, 2, 12)
    host.add(Inference(gpus=[0], rate=lambda t: 0.25, tokens=220, iter_s=0.026,
                       per_seq_s=0.0003, fb_mib=41000, mix=LLM_DECODE))
    return host


@scenario("healthy-gromacs-steady", 2904,
          "none: GROMACS molecular dynamics on 4 H100, one run a GPU, steady",
          notes="source: GROMACS GPU offload (nb, pme, update on the GPU): one busy "
                "kernel stream, few host syncs (manual.gromacs.org)")
def _(seed: int) -> Host:
    host = node(seed, H100, 4, 11)
    for g in range(4):
        host.add(Steady(gpu=g, mix=Mix(0.85, 0.4, 0.0, 0.3, fp32=0.5), busy=0.93,
                        fb_mib=2200, threads=10, launches_per_s=2500, rx_Bps=5e6, tx_Bps=5e6,
                        cmdline=f"gmx mdrun -deffnm run{g} -nb gpu -pme gpu -update gpu",
                        comm="gmx", exe="/usr/local/gromacs/bin/gmx"), seed=str(g))
    return host


@scenario("healthy-idle-l4-nvml", 2905,
          "none: 4 L4 with no job, NVML source, the node's cron health checks only",
          notes="source: NVML idle board (P8, Gen1 link at idle: ASPM)")
def _(seed: int) -> Host:
    host = node(seed, L4, 4, 10, source="nvml")
    rng = random.Random(f"cron:{seed}")
    for t in range(30, 600, 300):
        host.cron(t + rng.uniform(0, 2), "/usr/local/bin/gpu-health.sh --query-only")
        host.command(t + 2.5, "nvidia-smi --query-gpu=index,temperature.gpu --format=csv")
    return host


@scenario("healthy-fsdp-h100-slurm", 2906,
          "none: Llama-2 7B FSDP on 8 H100, one Slurm task per GPU",
          notes="source: Llama 2 paper (arXiv:2307.09288) training setup; FSDP on NVLink")
def _(seed: int) -> Host:
    host = node(seed, H100, 8, 11)
    host.add(fsdp(list(range(8))))
    return host


# === second pass: more outside sources (issue #56, item 6) ====================================
# Written from each source's cause before any rule ran; the half is the name's hash's.
@scenario("cloud-gpu-thermal-throttle-half-power", 2801,
          "a rented single-GPU cloud host whose chassis cannot remove the heat: under a "
          "training job that keeps the GPU 100 % busy the die sits at its slowdown "
          "temperature (~88 °C), the clocks hold near half of their maximum at about half "
          "the board's power, and steps take ~1.3 s where 0.7 s was measured cold",
          ("R20_thermal_throttle",), "power_thermal",
          notes="source: https://matt.sh/cloud-gpu-thermal-throttling ('100% usage ... "
                "throttled between 450 MHz and 550 MHz (the GPU default speed is 1755 MHz) "
                "... operating at half power because of the thermal limit'; steps 700 ms -> "
                "1.2-1.4 s). The post's board is not one of the vocabulary's: written on an "
                "L40S (a passively cooled PCIe board that relies on the chassis' airflow), "
                "its thermal path three times the nominal resistance")
def _(seed: int) -> Host:
    host = node(seed, L40S, 1, 11, hostname="cloud-gpu-1")
    host.conditions[0].r_factor = lambda t: 3.0
    slow = thermal_speed(L40S, LLM_TRAIN, 3.0, host.inlet[0])
    host.add(Training(gpus=[0], gpu_s=0.65, host_s=0.03, mix=LLM_TRAIN, workers=4,
                      worker_cpu_s=0.15, h2d_bytes=4e6, kernels=2500, fb_mib=38000,
                      threads=36, speed=lambda r, t: slow,
                      cmdline="/usr/bin/python3 -u train.py --config micro_foundation.yaml"))
    return host


@scenario("second-container-time-slices-stylegan2", 2802,
          "a second copy of a 2-GPU StyleGAN2-ADA training container is started on the same "
          "host with the same command: both jobs drive GPUs 0 and 1 (docker --gpus all, "
          "train.py --gpus=2 takes the first two), each GPU time-slices two contexts and "
          "both jobs run at about half speed",
          ("R26_multi_process_contention",), "sharing_config",
          notes="source: https://github.com/NVlabs/stylegan2-ada-pytorch/issues/310 ('As "
                "soon as I start the training in the second instance, the training slows "
                "down for both the containers ... to half speed more or less'); "
                "https://github.com/coqui-ai/TTS/issues/2296 (A100: step 1.3 s -> 3.5 s "
                "with a second model on the GPU). The thread does not name the board: "
                "written on a 4-GPU A100 host")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, 11)
    for who in ("a", "b"):
        host.add(Training(gpus=[0, 1], gpu_s=0.28, host_s=0.03, mix=CNN_TRAIN, workers=3,
                          worker_cpu_s=0.08, h2d_bytes=50e6, comm_bytes=240e6, overlap=0.8,
                          kernels=2200, fb_mib=18000, threads=40, visible="all",
                          speed=lambda r, t: 0.5,
                          cmdline="python train.py --outdir=training_runs "
                                  "--data=datasets/dataset.zip --kimg=5000 --gpus=2"),
                 seed=who)
    return host


@scenario("h100-uncorrectable-ecc-row-remap-failed", 2803,
          "an uncorrectable HBM error on GPU 3 of an 8-GPU H100 training job at 260 s: the "
          "driver contains it (Xid 94, the rank on it dies) and the row remapper cannot "
          "remap the row (Xid 64, remap failure flag set): the GPU is out of spare rows; "
          "the other ranks wait in their collective",
          ("R35_row_remap_failure", "R34_xid94_95_ecc_containment"), "failures",
          onset_s=260,
          notes="source: NVIDIA GPU Memory Error Management "
                "(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html: error "
                "containment, row remapping, RMA policy for a remapping failure); Xid 64 "
                "'Row Remapper: Failed to remap row' "
                "(https://plexus.company/guides/gpu-xid-errors/64: drain, RMA if it "
                "persists after a reset)")
def _(seed: int) -> Host:
    host = node(seed, H100, 8, 12)
    procs = host.add(fsdp(list(range(8)), crash={3: (261.0, 1, None)}))
    pid = procs[3].key.pid
    host.conditions[3].dbe_at = [260.0]
    host.conditions[3].remapped = (3, 5)
    host.conditions[3].remap_failed_at = 260.2
    host.klog(260.0, f"NVRM: Xid (PCI:{pci(host, 3)}): 94, pid={pid}, name=python3, "
                     "Contained: SM (0x1). RST: No, D-RST: No")
    host.klog(260.2, f"NVRM: Xid (PCI:{pci(host, 3)}): 64, pid='<unknown>', name=<unknown>, "
                     "Row Remapper: Failed to remap row")
    gpu_xid(host, 260.05, 3, 94)
    gpu_xid(host, 260.25, 3, 64)
    return host


@scenario("vllm-qwen25-7b-kv-preemption-128-concurrent", 2804,
          "vLLM serving Qwen2.5-7B-Instruct with a 16 GiB KV cache (~300,000 tokens) to a "
          "benchmark at 128 concurrent requests of ~1,000 prompt and ~5,000 generated "
          "tokens: demand is ~1.5x the cache, running requests are preempted again and "
          "again (recompute) and re-prefill their tokens when they return",
          ("R48_kv_cache_pressure",), "memory",
          notes="source: https://github.com/vllm-project/vllm/pull/44594 (Qwen2.5-7B, KV "
                "cache 16 GiB -> 299,584 tokens, 'near-critical: ~1.5x mean demand', "
                "--max-concurrency 128, input ~1000 / output ~5000: 1,065 preemptions in "
                "450 prompts); vLLM docs, Optimization and Tuning: Preemption. The PR ran on "
                "a GB200: written on an H100 with --gpu-memory-utilization giving the same "
                "cache")
def _(seed: int) -> Host:
    host = node(seed, H100, 2, 11)
    host.add(Inference(gpus=[0], rate=lambda t: 0.0, concurrency=128, tokens=5000,
                       prompt_tokens=1000, kv_tokens=299_584, iter_s=0.012,
                       per_seq_s=0.0001, prefill_s_per_token=0.00004, chunk_tokens=8192,
                       max_seqs=256, fb_mib=33000,
                       cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server "
                               "--model Qwen/Qwen2.5-7B-Instruct --max-model-len 8192 "
                               "--max-num-seqs 256 --gpu-memory-utilization 0.4"))
    return host


@scenario("fsdp-cpu-offload-adam-step-on-cpu", 2805,
          "a 1.3B-parameter model under FSDP on 4 A100 with CPUOffload(offload_params=True) "
          "and torch.optim.AdamW: every step the gradient shards go to the host, AdamW "
          "updates them on the CPUs (~2 s), the parameters come back; the GPUs idle through "
          "the CPU step, 3-5x slower than without offload",
          ("R14_bursty_utilisation", "R14b_low_gpu_utilisation"), "device_efficiency",
          notes="source: https://github.com/pytorch/pytorch/issues/74588 ('[FSDP] using "
                "CPUOffload creates 3-10x slowdown due to slow cpu optimizer step/update' "
                "... 'the slowdown is the optimizer update step ... and not D2H'); no rule "
                "names a CPU-side optimizer step: the symptom, cause not established, is "
                "the honest answer. The thread ran on AWS g4dn/p3: written on A100")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, 12)
    host.add(Training(gpus=[0, 1, 2, 3], gpu_s=0.5, host_s=0.04, mix=LLM_TRAIN, workers=2,
                      worker_cpu_s=0.02, h2d_bytes=65536, comm_bytes=7.8e9, overlap=0.9,
                      offload_bytes=1.3e9, cpu_step_s=2.0, cpu_step_cores=8.0,
                      kernels=3000, fb_mib=21000, threads=60,
                      cmdline="/usr/bin/python3 -m torch.distributed.run --nproc-per-node 4 "
                              "train_fsdp.py --model gpt-1.3b --cpu-offload"))
    return host


@scenario("healthy-mar-gradient-checkpointing-a100", 2806,
          "none: MAR-L image generation training on 8 A100 with gradient checkpointing: "
          "activations are recomputed in the backward pass, so each step takes ~20 % "
          "longer (0.78 s -> 0.94 s) with half the memory (62 -> 32 GB); the GPUs stay busy "
          "computing. A trade, not a fault",
          notes="source: https://github.com/LTH14/mar/pull/7 ('Tested on 8 80G A100 GPUs: "
                "MAR-L ... from ~62GB to ~32GB, with the training time increasing from "
                "0.78s/iter to 0.94s/iter')")
def _(seed: int) -> Host:
    host = node(seed, A100, 8, 11)
    host.add(Training(gpus=list(range(8)), gpu_s=0.92, host_s=0.05, mix=LLM_TRAIN, workers=8,
                      worker_cpu_s=0.3, h2d_bytes=12e6, comm_bytes=1.9e9, overlap=0.9,
                      kernels=6000, fb_mib=32000, threads=52,
                      cmdline="/usr/bin/python3 -m torch.distributed.run --nproc-per-node 8 "
                              "main_mar.py --model mar_large --batch_size 64 "
                              "--grad_checkpointing"))
    return host


@scenario("pageable-layer-offload-lora-l40s", 2807,
          "a LoRA fine-tune of a 22B video model with every transformer block offloaded to "
          "host memory: each step streams the blocks' weights to the GPU for the forward and "
          "again for the backward pass (~90 GB) from pageable memory, staged by the "
          "process's own thread at ~9 GB/s, while the GPU waits; pinning the host copies "
          "halves the step (20 s -> 10 s)",
          ("R06_pageable_h2d_copy",), "host_starvation",
          notes="source: https://github.com/ostris/ai-toolkit/pull/813 ('pin_memory: true' "
                "with layer_offloading_transformer_percent 1.0: step ~20 s -> 10 s, 'a clean "
                "isolate of pin_memory'); the PR ran on an RTX 5090: written on an L40S "
                "(PCIe 4, 48 GB)")
def _(seed: int) -> Host:
    host = node(seed, L40S, 2, 12)
    host.add(Training(gpus=[0], gpu_s=9.5, host_s=0.2, mix=Mix(0.85, 0.45, 0.5, 0.45, 0.08,
                                                               0.05),
                      workers=2, worker_cpu_s=0.3, h2d_bytes=90e9, pageable=True,
                      pageable_Bps=9e9, kernels=20000, fb_mib=18500, threads=40,
                      cmdline="/usr/bin/python3 run.py config/train_lora_ltx2_22b.yaml"))
    return host


@scenario("streaming-gcs-refetch-after-epoch", 2808,
          "8 A100 train from a MosaicML StreamingDataset in a GCS bucket; past an epoch "
          "boundary the (non-persistent) loader workers fetch their shards again over the "
          "network: they sleep on their sockets far longer than a step takes, and the "
          "GPUs idle for minutes",
          ("R02_input_io_bound",), "host_starvation",
          notes="source: https://github.com/mosaicml/streaming/issues/643 (gcp "
                "a2-ultragpu-8g, 8 A100: 'After the first epoch, I see gpu utilisation "
                "drop' ... with data streamed from GCS; the drop gone when training from "
                "local disk with one loader)")
def _(seed: int) -> Host:
    host = node(seed, A100, 8, 11)
    host.add(Training(gpus=list(range(8)), gpu_s=0.18, host_s=0.03, mix=CNN_TRAIN,
                      workers=4, worker_cpu_s=0.12, worker_io_s=3.2, io_wait="net",
                      batch_bytes=256 * 60e3, cores=10, h2d_bytes=8e6, comm_bytes=0.9e9,
                      overlap=0.9, kernels=1500, fb_mib=30000, threads=48,
                      cmdline="/usr/bin/python3 -m composer.cli.launcher -n 8 train.py "
                              "--streaming-remote gs://retail-mds/train"))
    return host
