"""The built-in scenarios: each written from how the workload and the hardware behave
(step times from model FLOPs and the board's throughput, loader speed from decode costs and
cores, link traffic from gradient sizes), the fault planted as it happens on real hosts.
The expected rule ids were chosen from the cause, before running any rule.

Deployments matter to what the probes see: a container or a Slurm task bound to one GPU
opens only that GPU's device node; ranks started by torchrun on a bare-metal host (or in a
pod holding every GPU) each open every /dev/nvidiaN, as CUDA does for every device it may
use, though each computes on one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from gpuwhy.app.demo.corpus.host import (
    A100,
    CNN_TRAIN,
    H100,
    HW_POWER_BRAKE,
    L4,
    L40S,
    LLM_DECODE,
    LLM_TRAIN,
    Board,
    Holder,
    Host,
    Inference,
    MigInstance,
    Mix,
    Steady,
    Training,
    cuda_start_fails,
    gpu_state,
    gpu_xid,
    pci,
    power_speed,
    reset_call,
    thermal_speed,
)
from gpuwhy.app.demo.corpus.planted import Scenario
from gpuwhy.gpufields import FABRIC_IN_PROGRESS, FABRIC_NOT_STARTED, FABRIC_SUCCESS
from gpuwhy.reset import BACK_STATES, RESET_STATES

CORPUS: list[Scenario] = []
MINUTES = 12

LLAMA = "/usr/bin/python3 -u train.py --config configs/llama2_7b_fsdp.yaml"
RESNET = "/usr/bin/python3 -u train_imagenet.py --arch resnet50 --amp --channels-last -b 256"
VIT = "/usr/bin/python3 -u train_vit.py --model vit_base_patch16_224 -b 128 " \
      "--data /mnt/nfs/imagenet"


def scenario(name: str, seed: int, cause: str, expected: tuple[str, ...] = (),
             group: str = "", onset_s: float = 0.0, notes: str = ""):
    def register(build: Callable[[int], Host]) -> Callable[[int], Host]:
        CORPUS.append(Scenario(name, seed, cause, tuple(expected), build, group, onset_s,
                               notes))
        return build
    return register


def node(seed: int, board: Board, gpus: int, minutes: float = MINUTES,
         source: str = "dcgm", numa_nodes: int = 1) -> Host:
    host = Host(seed, board, gpus, int(minutes * 60), source, numa_nodes=numa_nodes)
    host.monitors()
    host.chatter()
    return host


def llm_fsdp(gpus: list[int], **changes) -> Training:
    """Llama-2 7B, FSDP, bf16, micro-batch 2 x 4096 tokens, activation checkpointing:
    6 * 6.7e9 * 8192 FLOPs * 4/3 at 45 % of an H100's 989 TFLOPS ~ 1.0 s a step; every
    step all-gathers the parameters twice and reduce-scatters the gradients (~35 GB)."""
    job = dict(gpus=gpus, gpu_s=0.99, host_s=0.08, mix=LLM_TRAIN, workers=2,
               worker_cpu_s=0.02, h2d_bytes=65536, comm_bytes=35e9, overlap=0.9,
               kernels=8000, fb_mib=71000, threads=64, cmdline=LLAMA)
    job.update(changes)
    return Training(**job)


def resnet50(gpus: list[int], **changes) -> Training:
    """ResNet-50, AMP, channels_last, batch 256 on an A100 (~2200 images/s: 0.116 s a step);
    16 workers decode and augment 256 JPEGs each at ~5.5 ms an image."""
    job = dict(gpus=gpus, gpu_s=0.116, host_s=0.03, mix=CNN_TRAIN, workers=16,
               worker_cpu_s=256 * 0.0055, cores=30, h2d_bytes=38.5e6, comm_bytes=153e6,
               overlap=0.9, kernels=1600, fb_mib=31000, threads=44, cmdline=RESNET)
    job.update(changes)
    return Training(**job)


# === healthy hosts ============================================================================
@scenario("healthy-llm-fsdp-slurm", 101,
          "none: Llama-2 7B FSDP on 8 H100, one Slurm task per GPU, well fed")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8))))
    return host


@scenario("healthy-llm-fsdp-torchrun", 102,
          "none: the same training started by torchrun on a bare-metal host",
          notes="every rank opens every /dev/nvidiaN (CUDA), computing on one")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8)), visible="all"))
    return host


@scenario("healthy-resnet50-a100", 103,
          "none: ResNet-50 data-parallel on 4 A100, 16 loader workers a GPU, enough cores")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3]))
    return host


@scenario("healthy-vllm-tp2", 104,
          "none: vLLM serving Llama-3 70B (FP8) with tensor parallelism 2 on 2 H100, "
          "steady daytime traffic",
          notes="the server's two processes share a container holding both GPUs")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    rate = lambda t: 6.0 + 1.5 * math.sin(t / 170.0)   # noqa: E731 - requests per second
    host.add(Inference(gpus=[0, 1], rate=rate, tokens=260, iter_s=0.030,
                       per_seq_s=0.00018, fb_mib=73500,
                       cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server "
                               "--model /models/llama-3-70b-instruct-fp8 "
                               "--tensor-parallel-size 2"))
    return host


@scenario("healthy-inference-l4-nvml", 105,
          "none: two single-GPU pods each serving Llama-3 8B on an L4, NVML source "
          "(no DCGM profiling fields)")
def _(seed: int) -> Host:
    host = node(seed, L4, 2, source="nvml")
    for g, base in ((0, 2.2), (1, 1.6)):
        rate = lambda t, b=base: b + 0.6 * math.sin(t / 90.0 + b)   # noqa: E731
        host.add(Inference(gpus=[g], rate=rate, tokens=180, iter_s=0.034, per_seq_s=0.0004,
                           fb_mib=20500, threads=70,
                           cmdline="/usr/bin/python3 -m vllm.entrypoints.openai.api_server "
                                   "--model /models/llama-3-8b-instruct"))
    return host


@scenario("idle-host", 106, "none: 4 H100 with nothing running, monitors only")
def _(seed: int) -> Host:
    return node(seed, H100, 4)


@scenario("node-boot-fabric-training", 113,
          "none: an HGX H100 node just booted, Fabric Manager still training the NVLink "
          "fabric; a Slurm health check that ran before it was done failed at CUDA init "
          "(802), the fabric is up at 45 s and the node waits for work",
          notes="the capture opens 75 s after boot, as gpuwhy starts with the node")
def _(seed: int) -> Host:
    host = Host(seed, H100, 8, MINUTES * 60)
    host.uptime_s = 75.0
    host.monitors()
    host.chatter()
    for g in range(8):   # the GPUs finish registering with the fabric a little apart
        host.conditions[g].fabric_state = lambda t, up=44.0 + 0.4 * g: \
            FABRIC_IN_PROGRESS if t < up else FABRIC_SUCCESS
    cuda_start_fails(host, 21.0, "/usr/bin/python3 /etc/slurm/healthcheck.d/gpu_cuda.py",
                     list(range(8)), 2.2, uid=0)
    return host


@scenario("job-ends-normally", 107,
          "none: a ResNet-50 run finishes at 5 min (exit 0); the GPUs idle after it")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3], stop_s=300.0, ckpt_every_s=295.0, ckpt_bytes=0.3e9,
                      ckpt_write_Bps=0.8e9))
    return host


@scenario("checkpoint-dips", 108,
          "none: LLM training with a sharded checkpoint every 5 minutes (each rank writes "
          "its 12 GB of parameters and optimizer state; 8 ranks share one NVMe)")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8)), ckpt_every_s=300.0, ckpt_first_s=140.0,
                      ckpt_bytes=12.25e9, ckpt_write_Bps=0.25e9, ckpt_ranks="all"))
    return host


@scenario("profiling-paused", 109,
          "none: healthy training while someone runs Nsight Compute: DCGM profiling "
          "fields paused for 4 minutes (absent from the samples)")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    for g in range(4):
        host.conditions[g].profiling_off = lambda t: 200 <= t < 440
    host.add(llm_fsdp([0, 1, 2, 3]))
    return host


@scenario("old-remapped-rows", 110,
          "none: healthy training; GPU 3 remapped 2 correctable and 1 uncorrectable row "
          "months ago (spares applied, no failure, nothing pending)")
def _(seed: int) -> Host:
    host = node(seed, A100, 8)
    host.conditions[3].remapped = (2, 1)
    host.add(resnet50(list(range(8)), cores=14, workers=10,
                      worker_cpu_s=256 * 0.0045))
    return host


@scenario("healthy-cuda-uprobes", 111,
          "none: a single-GPU fine-tune with the CUDA uprobes on")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(llm_fsdp([0], comm_bytes=0.0, gpu_s=0.62, uprobes=True,
                      cmdline="/usr/bin/python3 finetune.py --model mistral-7b --lora"))
    return host


@scenario("healthy-two-socket-unpinned", 112,
          "none: Llama-2 7B FSDP on a two-socket HGX H100, ranks not bound to a NUMA node: "
          "the kernel runs each on both sockets about evenly, as it does on most hosts")
def _(seed: int) -> Host:
    host = node(seed, H100, 8, numa_nodes=2)
    host.add(llm_fsdp(list(range(8)), placement="spread"))
    return host


@scenario("healthy-s3-streaming", 119,
          "none: ViT-B streams WebDataset shards from an object store in the same region "
          "(~30 MB/s a connection): 12 workers a rank fetch and decode faster than the GPUs "
          "take batches, so they wait on their sockets and on a full queue by turns")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    host.add(Training(gpus=[0, 1, 2, 3], gpu_s=0.12, host_s=0.025, mix=CNN_TRAIN,
                      workers=12, worker_cpu_s=128 * 0.005, worker_io_s=0.45, io_wait="net",
                      batch_bytes=128 * 110e3, cores=16, h2d_bytes=19e6, comm_bytes=1.3e9,
                      overlap=0.9, kernels=1200, fb_mib=38000, threads=46,
                      cmdline=VIT.replace("/mnt/nfs/imagenet", "pipe:aws s3 cp s3://ds/in1k/"
                                          "{000000..001281}.tar -")))
    return host


def recsys_pod(gpu: int, placement: str = "local") -> Training:
    """A DLRM-style recommender, one Kubernetes pod a GPU: each step moves 65,536 samples'
    dense features and the embedding rows looked up on the host (~350 MB, pinned) and
    computes ~45 ms on an H100 (embedding gathers read HBM hard, the MLPs use the tensor
    cores); the CPU manager gives each pod 8 exclusive cores."""
    return Training(gpus=[gpu], gpu_s=0.045, host_s=0.010, workers=4, worker_cpu_s=0.15,
                    mix=Mix(0.85, 0.40, 0.30, 0.55, 0.10, 0.05), h2d_bytes=350e6, kernels=400,
                    fb_mib=52000, threads=30, cores=8, placement=placement,
                    cmdline="/usr/bin/python3 recsys_train.py --batch-size 65536 "
                            "--pin-memory")


# === A. host starvation =======================================================================
@scenario("numa-pod-wrong-socket", 217,
          "a pod bound to the other socket: on a two-socket HGX H100 with the kubelet's "
          "Topology Manager off, the CPU manager gave the recommender pod on GPU 6 cores of "
          "node 0 while GPU 6 hangs off node 1; its pinned copies cross the inter-socket "
          "link at ~60 % of the local rate and its GPU waits", ("R46_cpu_on_far_numa_node",),
          "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 8, numa_nodes=2)
    for gpu in range(8):
        host.add(recsys_pod(gpu, "remote" if gpu == 6 else "local"))
    return host

@scenario("resnet50-cpu-starved", 201,
          "DataLoader workers cannot keep up: RandAugment decoding on a 48-vCPU VM with 4 "
          "A100 (10 workers a GPU at ~14 ms an image)",
          ("R01_input_cpu_bound",), "host_starvation",
          notes="moderate starvation: batches arrive ~3/s against ~8.6/s the GPU could take")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3], workers=10, cores=11, worker_cpu_s=256 * 0.014))
    return host


@scenario("resnet18-cpu-starved", 202,
          "DataLoader workers cannot keep up: ResNet-18 (0.05 s a step) fed by 6 workers "
          "doing heavy augmentation (~12 ms an image)",
          ("R01_input_cpu_bound",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3], gpu_s=0.05, workers=6, cores=7,
                      worker_cpu_s=256 * 0.012, kernels=700,
                      cmdline=RESNET.replace("resnet50", "resnet18")))
    return host


@scenario("nfs-small-files-starved", 203,
          "reads starve the loader: ViT training reading ImageNet as single files from an "
          "overloaded NFS server (~12 ms a file, in D state)",
          ("R02_input_io_bound",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(Training(gpus=list(range(8)), gpu_s=0.12, host_s=0.025, mix=CNN_TRAIN,
                      workers=8, worker_cpu_s=128 * 0.008, worker_io_s=128 * 0.012,
                      io_wait="disk", cores=12, h2d_bytes=19e6, comm_bytes=1.3e9,
                      overlap=0.9, kernels=1200, fb_mib=38000, threads=46, cmdline=VIT))
    return host


@scenario("s3-streaming-starved", 204,
          "network reads starve the loader: workers stream WebDataset shards from an "
          "object store (waits on sockets: interruptible sleep)",
          ("R02_input_io_bound",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    host.add(Training(gpus=[0, 1, 2, 3], gpu_s=0.12, host_s=0.025, mix=CNN_TRAIN,
                      workers=8, worker_cpu_s=128 * 0.005, worker_io_s=2.4, io_wait="net",
                      batch_bytes=128 * 110e3, cores=16, h2d_bytes=19e6, comm_bytes=1.3e9,
                      overlap=0.9,
                      kernels=1200, fb_mib=38000, threads=46,
                      cmdline=VIT.replace("/mnt/nfs/imagenet", "pipe:aws s3 cp s3://ds/in1k/"
                                          "{000000..001281}.tar -")))
    return host


@scenario("single-gpu-cpu-starved", 215,
          "DataLoader workers cannot keep up: a one-GPU pod with 8 CPUs fine-tunes "
          "ResNet-18 with heavy augmentation (6 workers, ~12 ms an image)",
          ("R01_input_cpu_bound",), "host_starvation",
          notes="one process: no all-reduce to wait in")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(resnet50([0], gpu_s=0.05, workers=6, cores=7, worker_cpu_s=256 * 0.012,
                      kernels=700, comm_bytes=0.0,
                      cmdline=RESNET.replace("resnet50", "resnet18")))
    return host


@scenario("single-gpu-nfs-starved", 216,
          "reads starve the loader: a one-GPU pod trains ViT-B reading single files from an "
          "overloaded NFS server (~12 ms a file, in D state)",
          ("R02_input_io_bound",), "host_starvation", notes="one process: no all-reduce")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.12, host_s=0.025, mix=CNN_TRAIN, workers=8,
                      worker_cpu_s=128 * 0.008, worker_io_s=128 * 0.012, io_wait="disk",
                      cores=12, h2d_bytes=19e6, kernels=1200, fb_mib=38000, threads=46,
                      cmdline=VIT))
    return host


@scenario("num-workers-zero", 205,
          "the batch is loaded in the training process (DataLoader num_workers=0): decode "
          "and compute never overlap",
          ("R03_dataloader_synchronous",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(resnet50([0], workers=0, worker_cpu_s=64 * 0.0075, gpu_s=0.03,
                      h2d_bytes=9.6e6, comm_bytes=0.0,
                      cmdline="/usr/bin/python3 finetune_cls.py --arch resnet50 -b 64 "
                              "--workers 0"))
    return host


@scenario("workers-oversubscribed", 206,
          "loader workers fight for CPUs: 12 workers a GPU each starting OpenCV's default "
          "8 threads, 12 cores a GPU",
          ("R03b_workers_oversubscribed",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, A100, 8)
    host.add(resnet50(list(range(8)), workers=12, worker_threads=8, cores=12,
                      worker_cpu_s=256 * 0.009))
    return host


@scenario("launch-bound-eager-rl", 207,
          "the CPU cannot launch kernels fast enough: an RL policy (small MLPs, eager "
          "PyTorch) issuing ~3000 tiny kernels a step",
          ("R04_launch_bound",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.024, host_s=0.045, workers=0, worker_cpu_s=0.004,
                      mix=Mix(0.18, 0.2, 0.05, 0.1, 0.12, 0.05), h2d_bytes=2e6, kernels=3000,
                      fb_mib=6000, threads=22,
                      cmdline="/usr/bin/python3 ppo_train.py --env humanoid --num-envs 64"))
    return host


@scenario("launch-bound-uprobes", 208,
          "the CPU cannot launch kernels fast enough (the same RL job), CUDA uprobes on",
          ("R04b_cuda_launch_bound",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.024, host_s=0.045, workers=0, worker_cpu_s=0.004,
                      mix=Mix(0.18, 0.2, 0.05, 0.1, 0.12, 0.05), h2d_bytes=2e6, kernels=3000,
                      fb_mib=6000, threads=22, uprobes=True,
                      cmdline="/usr/bin/python3 ppo_train.py --env humanoid --num-envs 64"))
    return host


@scenario("item-sync-bound-uprobes", 209,
          "host and GPU take turns: metrics read with .item() ~40 times a step, each "
          "draining the GPU; CUDA uprobes on",
          ("R05b_cuda_sync_bound",), "host_starvation",
          notes="16 workers (resnet50's): 11 batches/s against the 7.7 steps/s the syncs "
                "allow; with 8 (5.7/s) the loader would starve it too, a second real cause")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(resnet50([0], gpu_s=0.06, serial_s=0.07, syncs=40, comm_bytes=0.0,
                      uprobes=True,
                      cmdline="/usr/bin/python3 train_seg.py --log-every-op"))
    return host


@scenario("stuck-on-lock", 210,
          "the process sleeps on something other than input: at 3 min the training "
          "thread deadlocks on a logging lock; 40 GiB stay allocated",
          ("R05_gpu_idle_process_blocked",), "host_starvation", onset_s=180)
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(llm_fsdp([0], comm_bytes=0.0, gpu_s=0.55, fb_mib=40000,
                      hang={0: (180.0, "sleep")},
                      cmdline="/usr/bin/python3 finetune.py --model llama-2-7b --wandb"))
    return host


@scenario("pageable-h2d-dlrm", 211,
          "host-to-device copies from pageable memory: a recommender copying ~800 MB of "
          "features a step from unpinned tensors (staged at ~12 GB/s)",
          ("R06_pageable_h2d_copy",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.04, host_s=0.012, workers=4, worker_cpu_s=0.2,
                      mix=Mix(0.5, 0.3, 0.2, 0.6, 0.15, 0.05), h2d_bytes=800e6, pageable=True,
                      pageable_Bps=12e9, kernels=400, fb_mib=52000, threads=30,
                      cmdline="/usr/bin/python3 dlrm_train.py --mini-batch-size 65536"))
    return host


@scenario("pageable-h2d-uprobes", 212,
          "host-to-device copies from pageable memory (the same recommender), CUDA uprobes "
          "on", ("R06b_cuda_pageable_copies",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.04, host_s=0.012, workers=4, worker_cpu_s=0.2,
                      mix=Mix(0.5, 0.3, 0.2, 0.6, 0.15, 0.05), h2d_bytes=800e6, pageable=True,
                      pageable_Bps=12e9, kernels=400, fb_mib=52000, threads=30, uprobes=True,
                      cmdline="/usr/bin/python3 dlrm_train.py --mini-batch-size 65536"))
    return host


@scenario("cpu-offloaded-inference", 213,
          "PCIe is the bottleneck: a 70B model with 40 % of its layers offloaded to host "
          "memory streams ~12 GB of weights over PCIe for every token",
          ("R07_pcie_saturated_low_sm",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Training(gpus=[0], gpu_s=0.012, host_s=0.006, workers=0, worker_cpu_s=0.001,
                      mix=Mix(0.55, 0.3, 0.15, 0.7, 0.05, 0.1), h2d_bytes=12e9,
                      kernels=900, syncs=1, fb_mib=78500, threads=40,
                      cmdline="/usr/bin/python3 generate.py --model llama-2-70b "
                              "--device-map auto --max-memory 0:76GiB"))
    return host


@scenario("cuda-launch-blocking", 214,
          "CUDA_LAUNCH_BLOCKING=1 left in the pod's environment: every launch waits for "
          "its kernel, host and GPU serialise",
          ("R08_debug_or_limiting_env",), "host_starvation")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    for proc in host.add(resnet50([0], serial_s=0.06, comm_bytes=0.0)):
        # the probes record it (probes.environment) in the process's ProcessSeen
        proc.env = {"CUDA_LAUNCH_BLOCKING": "1"}
    return host


# === B. device efficiency =====================================================================
@scenario("bert-batch1-serving", 301,
          "busy GPU, few SMs working: BERT-base served one request at a time (grids of "
          "12-48 blocks on 132 SMs), ~400 requests/s",
          ("R09_small_grid_low_sm",), "device_efficiency")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    busy = lambda t: 0.88 + 0.06 * math.sin(t / 40.0)   # noqa: E731
    host.add(Steady(gpu=0, mix=Mix(0.27, 0.25, 0.15, 0.2, 0.06, 0.08), busy=busy,
                    fb_mib=9000, threads=140, launches_per_s=400 * 110,
                    cmdline="/opt/tritonserver/bin/tritonserver --model-repository=/models",
                    comm="tritonserver", exe="/opt/tritonserver/bin/tritonserver"))
    return host


@scenario("custom-kernel-low-occupancy", 302,
          "SMs active but starved of warps: a lattice-Boltzmann solver whose kernel uses "
          "255 registers a thread (occupancy ~0.12)",
          ("R10_low_occupancy",), "device_efficiency")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(Steady(gpu=0, mix=Mix(0.95, 0.12, 0.0, 0.24, 0.22, 0.0, 0.0)))
    return host


@scenario("memory-bound-unfused", 303,
          "DRAM saturated, math pipes idle: an eager fp16 diffusion UNet dominated by "
          "GroupNorm/SiLU/elementwise kernels",
          ("R11_memory_bandwidth_bound",), "device_efficiency")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3], gpu_s=0.42, mix=Mix(0.82, 0.4, 0.12, 0.74, 0.2, 0.09),
                      workers=8, worker_cpu_s=0.8,
                      cmdline="/usr/bin/python3 train_unet.py --fp16 --no-compile"))
    return host


@scenario("fp32-no-tf32", 304,
          "FP32 math where tensor cores could run it: BERT-large pre-training in strict "
          "FP32 (no AMP, TF32 off by default since PyTorch 1.12)",
          ("R12_tensor_cores_unused",), "device_efficiency")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.add(resnet50([0, 1, 2, 3], gpu_s=0.9, mix=Mix(0.9, 0.38, 0.0, 0.3, 0.55, 0.0),
                      workers=4, worker_cpu_s=0.05, h2d_bytes=0.5e6, comm_bytes=1.34e9,
                      cmdline="/usr/bin/python3 -u run_mlm.py --model_name_or_path "
                              "bert-large-uncased --per_device_train_batch_size 32"))
    return host


@scenario("fp64-numpy-leak", 305,
          "double precision in a deep-learning job: float64 targets from NumPy make the "
          "loss and its backward run on the L40S's 1/64-rate FP64 pipe",
          ("R13_unexpected_fp64",), "device_efficiency")
def _(seed: int) -> Host:
    host = node(seed, L40S, 2)
    host.add(resnet50([0], gpu_s=0.5, mix=Mix(0.88, 0.35, 0.04, 0.2, 0.1, 0.02, 0.36),
                      comm_bytes=0.0, cmdline="/usr/bin/python3 train_regressor.py"))
    return host


@scenario("cron-cpu-hog-dips", 306,
          "periodic host work blocks the GPU: a cron job every 5 minutes (rsync + zstd of "
          "the dataset cache) takes the CPUs for ~70 s and the loaders stall",
          ("R14_bursty_utilisation",), "device_efficiency", onset_s=60)
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    hog = lambda t: 3.0 if (t - 60) % 300 < 70 and t >= 60 else 30.0   # noqa: E731
    host.add(resnet50([0, 1, 2, 3], cores=hog))
    for t in (60, 360, 660):
        host.cron(t, "/usr/local/bin/sync-dataset-cache.sh")
        host.command(t + 0.2, "rsync -a --delete /data/cache/ /backup/cache/")
    return host


# === C. communication =========================================================================
@scenario("nccl-p2p-disabled", 401,
          "NVLink present but peer traffic on PCIe: NCCL_P2P_DISABLE=1 left in the launch "
          "script, GPT-2 XL DDP on a DGX A100 all-reduces through host memory",
          ("R15_collectives_off_nvlink",), "communication")
def _(seed: int) -> Host:
    host = node(seed, A100, 8)
    host.add(Training(gpus=list(range(8)), gpu_s=0.52, host_s=0.05, mix=LLM_TRAIN,
                      workers=2, worker_cpu_s=0.02, h2d_bytes=65536, comm_bytes=5.25e9,
                      link="shm", overlap=0.5, kernels=4000, fb_mib=52000, visible="all",
                      cmdline="/usr/bin/python3 -u train_gpt2.py --model gpt2-xl -b 8"))
    return host


@scenario("fsdp-over-pcie-exposed", 402,
          "steps dominated by un-overlapped communication: Llama-2 7B FSDP on 4 L40S "
          "(no NVLink): ~31 GB a step over PCIe, half of it exposed",
          ("R16_comm_bound_exposed",), "communication")
def _(seed: int) -> Host:
    host = node(seed, L40S, 4)
    host.add(llm_fsdp([0, 1, 2, 3], gpu_s=1.19, comm_bytes=31.5e9, link="pcie", overlap=0.5,
                      fb_mib=43500))
    return host


@scenario("nccl-hang-dead-rank", 403,
          "GPU spins in a collective that never completes: rank 3 is OOM-killed (host "
          "memory) at 200 s; the other ranks wait in the all-reduce",
          ("R17_collective_hang",), "communication", onset_s=200)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8)), visible="all", crash={3: (200.0, None, 9)}))
    return host


# === D. power, thermal, clocks ================================================================
@scenario("power-limit-lowered", 501,
          "clocks held down by the power limit: every GPU set to 450 W (of 700 W) by a "
          "site script last week", ("R19_power_cap",), "power_thermal")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    for g in range(8):
        host.conditions[g].power_limit = lambda t: 450.0
    speed = power_speed(H100, LLM_TRAIN, 450.0)
    host.add(llm_fsdp(list(range(8)), speed=lambda r, t: speed))
    return host


@scenario("thermal-tim-degraded", 502,
          "clocks reduced for temperature: GPU 5's thermal interface has degraded "
          "(twice the thermal resistance); it throttles and the other ranks wait for it",
          ("R20_thermal_throttle",), "power_thermal")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.conditions[5].r_factor = lambda t: 2.0
    slow = thermal_speed(H100, LLM_TRAIN, 2.0, host.inlet[5])
    host.add(llm_fsdp(list(range(8)), speed=lambda r, t: slow if r == 5 and t > 120 else 1.0))
    return host


@scenario("psu-power-brake", 503,
          "hardware halves the clocks: one of six PSUs failed; the power brake is asserted "
          "in bursts of 10-40 s", ("R21_hw_slowdown_power_brake",), "power_thermal",
          onset_s=150)
def _(seed: int) -> Host:
    host = node(seed, A100, 8)
    episodes = [(150 + 110 * i + 17 * (i % 3), 10 + 10 * ((i * 7) % 4)) for i in range(6)]

    def brake(t: float, episodes: list = episodes) -> tuple[int, float] | None:
        return (HW_POWER_BRAKE, 0.42) if any(a <= t < a + d for a, d in episodes) else None

    for g in range(8):
        host.conditions[g].brake = brake
    host.add(resnet50(list(range(8)), cores=14, workers=12, worker_cpu_s=256 * 0.0045,
                      speed=lambda r, t: 0.42 if brake(t) else 1.0))
    return host


@scenario("app-clocks-pinned-low", 504,
          "clocks held low by configuration: application clocks set to 1095 MHz by an old "
          "benchmarking script (nvidia-smi -ac 1593,1095), kept by persistence mode",
          ("R22_sync_boost_or_clock_lock",), "power_thermal")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    for g in range(4):
        host.conditions[g].app_clock = 1095.0
    host.add(resnet50([0, 1, 2, 3], speed=lambda r, t: 1095 / 1410))
    return host


# === E. memory ================================================================================
@scenario("empty-cache-churn", 601,
          "cudaMalloc/cudaFree churn: torch.cuda.empty_cache() every step of a detection "
          "model with changing image sizes (~60 segments freed and re-allocated a step)",
          ("R23_alloc_churn",), "memory")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(resnet50([0], gpu_s=0.2, serial_s=0.09, allocs=120, comm_bytes=0.0,
                      cmdline="/usr/bin/python3 train_det.py --multiscale --empty-cache"))
    return host


@scenario("empty-cache-churn-uprobes", 602,
          "cudaMalloc/cudaFree churn (the same detection job), CUDA uprobes on",
          ("R23b_cuda_alloc_churn",), "memory")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(resnet50([0], gpu_s=0.2, serial_s=0.09, allocs=120, comm_bytes=0.0,
                      uprobes=True,
                      cmdline="/usr/bin/python3 train_det.py --multiscale --empty-cache"))
    return host


@scenario("uvm-prefetch-pingpong", 603,
          "managed-memory migrations ping-pong: a graph-analytics job prefetches managed "
          "chunks of a working set 1.5x the GPU's memory back and forth",
          ("R24_uvm_thrash",), "memory")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(Steady(gpu=0, mix=Mix(0.5, 0.3, 0.0, 0.35, 0.2), busy=0.45, fb_mib=79500,
                    rx_Bps=11e9, tx_Bps=10e9, uvm_migrate=320, threads=12,
                    cmdline="/usr/bin/python3 pagerank.py --managed-memory --prefetch",
                    comm="python3", exe="/usr/bin/python3"))
    return host


@scenario("fb-full-variable-seq", 604,
          "GPU memory nearly full while the allocator churns: a fine-tune with variable "
          "sequence lengths at the memory limit; it dies of CUDA OOM at 9 min",
          ("R25_fb_near_full",), "memory")
def _(seed: int) -> Host:
    host = node(seed, A100, 2)
    host.add(llm_fsdp([0], comm_bytes=0.0, gpu_s=1.3, fb_mib=80400, allocs=50,
                      crash={0: (560.0, 1, None)},
                      cmdline="/usr/bin/python3 finetune.py --model llama-2-7b --packing off"))
    return host


# === F. sharing and configuration =============================================================
@scenario("two-pods-time-slicing", 701,
          "several processes time-slice one GPU: the device plugin's time-slicing puts two "
          "training pods on GPU 2", ("R26_multi_process_contention",), "sharing_config")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    for g in (0, 1, 3):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    for who in ("a", "b"):
        host.add(resnet50([2], comm_bytes=0.0, cores=28, speed=lambda r, t: 0.5,
                          cmdline=f"/usr/bin/python3 train.py --run {who}"), seed=who)
    return host


@scenario("idle-notebook", 702,
          "a process holds the GPU but does nothing: a Jupyter kernel keeps 31 GiB on GPU 1 "
          "and runs nothing for 20 minutes", ("R27_allocated_but_idle",), "sharing_config")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, minutes=20)
    for g in (0, 2, 3):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    host.add(Holder(gpu=1, fb_mib=31500), age_s=7200)
    return host


# --- MIG: one A100 split in seven 1g.10gb instances for small tenants -------------------------
def mig_tenants(host: Host, gpu: int, notebook_idle: bool) -> None:
    """GPU ``gpu`` in MIG mode, all-1g.10gb (GPU instances 7-13, as nvidia-smi mig -cgi 19
    x7 numbers them on an A100-80GB: 14 of 98 SMs and 9728 MiB each). Tenants: two small
    vLLM servers (a 0.5B model: its weights read at the slice's ~1/8 of the HBM bandwidth,
    ~12 ms a decode step), a BERT-base fine-tuning, a GROMACS run, a notebook training a
    small CNN; the last slice is free. ``notebook_idle``: another user's Jupyter kernel
    holds instance 12 (a model loaded, ~8 GiB) and has run nothing for hours."""
    host.mig[gpu] = [MigInstance(str(gi), "1g.10gb", 1, 9728.0) for gi in range(7, 14)]
    small_llm = "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model " \
                "/models/qwen2.5-0.5b-instruct --gpu-memory-utilization 0.85"
    for gi, rate in (("7", 0.6), ("10", 0.25)):
        host.add(Inference(gpus=[gpu], rate=lambda t, r=rate: r, tokens=180, iter_s=0.012,
                           per_seq_s=0.0004, fb_mib=7800, threads=40, cmdline=small_llm),
                 age_s=86400, seed=gi, instance=gi)
    host.add(Training(gpus=[gpu], gpu_s=0.42, host_s=0.03, mix=LLM_TRAIN, workers=2,
                      worker_cpu_s=0.04, h2d_bytes=2e6, kernels=900, fb_mib=6900,
                      threads=28, cmdline="/usr/bin/python3 finetune.py --model bert-base-"
                      "uncased --task mnli -b 32 --fp16"), age_s=5400, instance="8")
    host.add(Steady(gpu=gpu, mix=Mix(0.82, 0.38, 0.0, 0.28, fp32=0.46), busy=0.91,
                    fb_mib=1700, threads=10, cmdline="gmx mdrun -deffnm npt -nb gpu -pme gpu "
                    "-ntomp 8", comm="gmx", exe="/usr/local/gromacs/bin/gmx", rx_Bps=4e6,
                    tx_Bps=4e6, launches_per_s=2400), age_s=20000, instance="9")
    host.add(Training(gpus=[gpu], gpu_s=0.09, host_s=0.01, mix=CNN_TRAIN, workers=4,
                      worker_cpu_s=0.12, h2d_bytes=6.3e6, kernels=400, fb_mib=4200,
                      threads=30, cmdline="/opt/conda/bin/python -m ipykernel_launcher -f "
                      "/home/li/.local/share/jupyter/runtime/kernel-81fa.json",
                      comm="python", exe="/opt/conda/bin/python"), age_s=2400, instance="11")
    if notebook_idle:
        host.add(Holder(gpu=gpu, fb_mib=7700, cmdline="/opt/conda/bin/python -m "
                        "ipykernel_launcher -f /home/sam/.local/share/jupyter/runtime/"
                        "kernel-0c2e.json"), age_s=3 * 3600, instance="12")


@scenario("healthy-mig-tenants", 114,
          "none: an A100 node, GPU 0 in MIG mode (7 x 1g.10gb) with five busy tenants and two "
          "free instances, the other GPUs training",
          notes="dcgm-exporter in MIG mode: no whole-GPU rows for GPU 0, a row per instance")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, minutes=20)
    mig_tenants(host, 0, notebook_idle=False)
    for g in (1, 2, 3):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    return host


@scenario("mig-idle-notebook", 706,
          "a MIG instance holds memory but does nothing: on GPU 0 (7 x 1g.10gb) a Jupyter kernel "
          "keeps ~8 GiB of instance 12 and has run nothing for hours, the other tenants busy",
          ("R47_mig_instance_allocated_but_idle",), "sharing_config",
          notes="dcgm-exporter in MIG mode: no whole-GPU rows for GPU 0, a row per instance")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, minutes=20)
    mig_tenants(host, 0, notebook_idle=True)
    for g in (1, 2, 3):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    return host


@scenario("driver-lib-mismatch", 703,
          "driver and user-space library versions differ: unattended-upgrades installed "
          "550.127.05 libraries under the loaded 550.90.07 module; new jobs fail to start",
          ("R41_driver_api_mismatch",), "sharing_config",
          onset_s=240)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp([0, 1, 2, 3]))
    host.command(90, "/usr/bin/python3 /usr/bin/unattended-upgrade")
    host.command(95, "dpkg --status-fd 3 --configure libnvidia-compute-550:amd64")
    for attempt in range(3):
        t = 240 + 150 * attempt
        for rank in range(4):
            host.command(t + rank * 0.02, "/usr/bin/python3 -u train.py --config "
                                          "configs/mistral_7b.yaml", uid=1000, exit_code=1,
                         lasts_s=2.5)
        for line in ("NVRM: API mismatch: the client has the version 550.127.05, but",
                     "NVRM: this kernel module has the version 550.90.07.  Please",
                     "NVRM: make sure that this kernel module and all NVIDIA driver",
                     "NVRM: components have the same version."):
            host.klog(t + 1.2, line)
    return host


@scenario("pcie-replays-riser", 704,
          "PCIe link replays above DCGM's limit: GPU 6 sits behind a marginal riser; "
          "replays climb with its traffic", ("R31_pcie_replays",), "sharing_config")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.conditions[6].replays_per_s = lambda t: 0.7
    host.add(llm_fsdp(list(range(8))))
    return host


@scenario("pcie-link-x8-riser", 705,
          "a PCIe link trained down: GPU 2 of a recommender's four sits behind a riser that "
          "trains at Gen4 x8 instead of Gen5 x16; its ~800 MB of features a step cross at a "
          "quarter of the speed, and the other ranks wait for it", ("R43_pcie_link_degraded",),
          "sharing_config")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    host.conditions[2].pcie_link = (4, 8)
    host.add(Training(gpus=[0, 1, 2, 3], gpu_s=0.05, host_s=0.012, workers=4, worker_cpu_s=0.2,
                      mix=Mix(0.5, 0.3, 0.2, 0.6, 0.15, 0.05), h2d_bytes=800e6, kernels=400,
                      comm_bytes=0.6e9, overlap=0.5, fb_mib=52000, threads=30, cores=16,
                      cmdline="/usr/bin/python3 dlrm_train.py --mini-batch-size 65536 "
                              "--pin-memory"))
    return host


# === G. failures ==============================================================================
@scenario("nvlink-marginal-lane", 812,
          "a marginal NVLink lane: GPU 5's link corrects ~160 CRC errors a second and "
          "replays now and then, then retrains once at 7 min, no Xid yet; the job runs on",
          ("R44_nvlink_link_errors",), "failures")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.conditions[5].nvlink_crc_per_s = lambda t: 160.0
    host.conditions[5].nvlink_replay_per_s = lambda t: 0.01
    host.conditions[5].nvlink_recovery_at = [420.0]
    host.add(llm_fsdp(list(range(8))))
    return host


@scenario("fabric-manager-down-after-driver-update", 813,
          "NVLink fabric never set up: the node was rebooted into driver 550.90.07 with "
          "nvidia-fabricmanager still at 550.54.15, which refuses to run against another "
          "driver version; every H100 of the HGX board stays NotStarted, and each attempt "
          "of the 8-rank training job fails at CUDA init (802, system not yet initialized) "
          "and is started again by its retry loop ~40 s later",
          ("R45_fabric_not_up",), "failures",
          notes="the capture opens 75 s after the reboot; no CUDA context ever forms")
def _(seed: int) -> Host:
    host = Host(seed, H100, 8, MINUTES * 60)
    host.uptime_s = 75.0          # gpuwhy starts with the node
    host.monitors()
    host.chatter()
    for g in range(8):
        host.conditions[g].fabric_state = lambda t: FABRIC_NOT_STARTED
    rng = random.Random(f"retries:{seed}")
    t = rng.uniform(15.0, 30.0)   # the batch job, requeued by the reboot, starts again
    while t < host.n - 15:
        imports = rng.uniform(5.5, 8.0)   # python, torch and the model code load first
        agent = host.command(t, "torchrun --nproc-per-node 8 train.py --config "
                                "configs/llama2_7b_fsdp.yaml", uid=1000, exit_code=1,
                             lasts_s=imports + 2.0)
        for rank in range(8):     # each rank's cuInit opens every GPU: all fail
            cuda_start_fails(host, t + 0.6 + 0.03 * rank, LLAMA, list(range(8)),
                             imports * rng.uniform(0.95, 1.05), ppid=agent.pid)
        t += imports + 2.0 + 30.0 + rng.uniform(0.0, 2.0)   # `sleep 30` in the retry loop
    return host


@scenario("xid79-fallen-off-bus", 801,
          "GPU has fallen off the bus (Xid 79): GPU 4 drops off PCIe at 250 s; its rank "
          "dies, the others hang in NCCL", ("R32_xid79_fallen_off_bus",), "failures",
          onset_s=250)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.conditions[4].lost_at = 250.0
    host.add(llm_fsdp(list(range(8)), visible="all", crash={4: (252.0, 1, None)}))
    host.klog(250.0, f"NVRM: Xid (PCI:{pci(host, 4)}): 79, pid='<unknown>', name=<unknown>, "
                     "GPU has fallen off the bus.")
    host.klog(250.0, f"NVRM: GPU {host.pcis[4]}: GPU has fallen off the bus.")
    gpu_xid(host, 250.1, 4, 79, "GPU has fallen off the bus")
    return host


@scenario("xid48-dbe", 802,
          "uncorrectable memory error (Xid 48, DBE) on GPU 2: its job dies; a row is "
          "marked for remapping (Xid 63)", ("R33_xid48_double_bit_ecc",), "failures",
          onset_s=310)
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    procs = [host.add(resnet50([g], comm_bytes=0.0, cores=28, crash={0: (311.0, 1, None)}
                               if g == 2 else {}))[0] for g in range(4)]
    host.conditions[2].dbe_at = [310.0]
    pid = procs[2].key.pid
    host.klog(310.0, f"NVRM: Xid (PCI:{pci(host, 2)}): 48, pid={pid}, name=python3, An "
                     "uncorrectable double bit error (DBE) has been detected on GPU in the "
                     "framebuffer at partition 6, subpartition 0.")
    host.klog(310.2, f"NVRM: Xid (PCI:{pci(host, 2)}): 63, pid='<unknown>', name=<unknown>, "
                     "Row Remapper: New row (0x000000012c4e8000) Marked for Remapping, reset "
                     "gpu to activate.")
    host.klog(311.0, f"NVRM: Xid (PCI:{pci(host, 2)}): 45, pid={pid}, name=python3, "
                     "Ch 00000010")
    gpu_xid(host, 310.1, 2, 48)
    return host


@scenario("xid94-contained-ecc", 803,
          "memory error contained (Xid 94) on GPU 3 of an 8-GPU job: the rank on it dies "
          "(the application must restart), the others wait in NCCL",
          ("R34_xid94_95_ecc_containment", "R33_xid48_double_bit_ecc"), "failures",
          onset_s=280)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    procs = host.add(llm_fsdp(list(range(8)), crash={3: (281.0, 1, None)}))
    pid = procs[3].key.pid
    host.conditions[3].dbe_at = [280.0]
    host.klog(280.0, f"NVRM: Xid (PCI:{pci(host, 3)}): 94, pid={pid}, name=python3, Contained: "
                     "SM (0x1). RST: No, D-RST: No")
    host.klog(280.1, f"NVRM: Xid (PCI:{pci(host, 3)}): 63, pid='<unknown>', name=<unknown>, "
                     "Row Remapper: New row (0x00000003a19c0000) Marked for Remapping, reset "
                     "gpu to activate.")
    gpu_xid(host, 280.05, 3, 94)
    return host


@scenario("row-remap-failed-in-service", 804,
          "row remapping failed: GPU 7 ran out of spare rows at its last error (remap "
          "failure flag set) and was put back in service",
          ("R35_row_remap_failure",), "failures")
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.conditions[7].remapped = (6, 8)
    host.conditions[7].remap_failed_at = 0.0
    host.add(llm_fsdp(list(range(8))))
    return host


@scenario("xid13-kernel-oob", 805,
          "application fault on the GPU (Xid 13): a custom Triton kernel reads out of "
          "bounds on GPU 1; the process dies with an illegal-address error",
          ("R36_app_fault_xid13_31_43",), "failures", onset_s=320)
def _(seed: int) -> Host:
    host = node(seed, L40S, 4)
    procs = [host.add(resnet50([g], comm_bytes=0.0, cores=14, workers=8, gpu_s=0.3,
                               crash={0: (321.0, 1, None)} if g == 1 else {}))[0]
             for g in range(4)]
    pid = procs[1].key.pid
    host.klog(320.0, f"NVRM: Xid (PCI:{pci(host, 1)}): 13, pid={pid}, name=python3, Graphics "
                     "SM Warp Exception on (GPC 3, TPC 1, SM 0): Out Of Range Address")
    host.klog(320.0, f"NVRM: Xid (PCI:{pci(host, 1)}): 13, pid={pid}, name=python3, Graphics "
                     "Exception: ESR 0x51d730=0x20 0x51d734=0x0 0x51d728=0x4c1eb72 "
                     "0x51d72c=0x174")
    host.klog(320.4, f"NVRM: Xid (PCI:{pci(host, 1)}): 43, pid={pid}, name=python3, "
                     "Ch 00000008")
    gpu_xid(host, 320.05, 1, 13)
    return host


@scenario("xid74-nvlink-error", 806,
          "NVLink error (Xid 74) on GPU 2's link 7: NCCL fails on that rank, which exits; "
          "the others hang", ("R37_nvlink_error_xid74",), "failures", onset_s=230)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8)), visible="all", crash={2: (233.0, 1, None)}))
    host.klog(230.0, f"NVRM: Xid (PCI:{pci(host, 2)}): 74, pid='<unknown>', name=<unknown>, "
                     "NVLink: fatal error detected on link 7(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, "
                     "0x0)")
    gpu_xid(host, 230.1, 2, 74)
    return host


@scenario("sbe-storm", 807,
          "high rate of corrected memory errors: GPU 1's HBM reports ~600 corrected errors "
          "an hour (Xid 92 once the driver notices)", ("R38_sbe_storm_xid92",), "failures")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    host.conditions[1].sbe_per_s = lambda t: 600 / 3600
    host.add(resnet50([0, 1, 2, 3]))
    host.klog(430.0, f"NVRM: Xid (PCI:{pci(host, 1)}): 92, pid='<unknown>', name=<unknown>, "
                     "High single-bit ECC error rate")
    return host


@scenario("gsp-timeout-xid119", 808,
          "GPU System Processor timeout (Xid 119) on GPU 6: RPCs time out, the rank on it "
          "is stuck in the driver, the job stalls", ("R39_gsp_timeout_xid119_120",),
          "failures", onset_s=270)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    host.add(llm_fsdp(list(range(8)), hang={6: (270.0, "blocked")}))
    for i, t in enumerate((270.0, 276.0, 282.0, 300.0)):
        host.klog(t, f"NVRM: Xid (PCI:{pci(host, 6)}): 119, pid='<unknown>', name=<unknown>, "
                     f"Timeout after 6s of waiting for RPC response from GPU6 GSP! Expected "
                     f"function {76 + i % 2} (GSP_RM_CONTROL) (0x20802a02 0x8).")
    host.klog(270.1, "NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP "
                     "Timeout **********************************")
    gpu_xid(host, 270.2, 6, 119)
    return host


# === H. operator and cron =====================================================================
@scenario("cron-power-limit-policy", 901,
          "GPU settings changed under running work: a facility cron job lowers every "
          "GPU's power limit to 500 W at 200 s (peak-hours policy)",
          ("R40_operator_or_cron_intervention", "R19_power_cap"), "operator", onset_s=200)
def _(seed: int) -> Host:
    host = node(seed, H100, 8)
    for g in range(8):
        host.conditions[g].power_limit = lambda t: 500.0 if t >= 200.5 else 700.0
    speed = power_speed(H100, LLM_TRAIN, 500.0)
    host.add(llm_fsdp(list(range(8)), speed=lambda r, t: speed if t >= 200.5 else 1.0))
    host.cron(200.0, "/usr/local/sbin/gpu-power-policy peak", gpu_action=None)
    host.command(200.1, "nvidia-smi -pl 500")
    return host


@scenario("cron-reset-idle-gpu", 903,
          "a nightly 'GPU hygiene' cron job resets GPU 3, which no job holds, while GPUs 0-2 "
          "train; the node's health checks and metrics scripts come and go as every minute",
          ("R40_operator_or_cron_intervention",), "operator", onset_s=180,
          notes="not a reset under load: no process of GPU 3's ends, only the host's own")
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    for g in range(3):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    host.cron(180.0, "/usr/local/sbin/gpu-hygiene.sh", gpu_action=None)
    smi = host.command(180.3, "nvidia-smi -r -i 3", lasts_s=3.5)
    reset_call(host, 180.4, smi)
    gpu_state(host, 180.5, 3, RESET_STATES[0], "nvidia-smi -r")
    gpu_state(host, 183.6, 3, BACK_STATES[0])
    return host


@scenario("cron-reset-attempt", 902,
          "a GPU reset tried under running work: a nightly 'GPU hygiene' cron job runs "
          "nvidia-smi -r on GPU 3 while a job holds it (the reset is refused)",
          ("R40_operator_or_cron_intervention",), "operator", onset_s=180)
def _(seed: int) -> Host:
    host = node(seed, A100, 4)
    for g in range(4):
        host.add(resnet50([g], comm_bytes=0.0, cores=28))
    host.cron(180.0, "/usr/local/sbin/gpu-hygiene.sh", gpu_action=None)
    # nvidia-smi refuses: "GPU 00000000:5D:00.0 is currently in use by another process"
    host.command(180.3, "nvidia-smi -r -i 3", exit_code=255, lasts_s=0.4)
    return host


# --- inference engines whose /metrics the engines source scrapes ---------------------------
# Llama-3 8B in FP16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB of KV
# cache a token. On an 80 GB H100 at vLLM's default --gpu-memory-utilization 0.9, ~16 GB of
# weights leave ~50 GB: ~400,000 tokens. Prefill of an 8B model on an H100: ~25,000 tokens/s.
LLAMA3_8B_SERVE = "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model " \
                  "/models/llama-3-8b-instruct"


@scenario("vllm-kv-cache-pressure", 505,
          "vLLM serving Llama-3 8B on GPU 0 of two H100, started with "
          "--gpu-memory-utilization 0.35 (sharing the GPU): ~100,000 tokens of KV cache for "
          "RAG prompts of ~4,000 tokens at 3 requests/s; the cache fills, running requests "
          "are preempted and the queue grows. GPU 1's server, with the default memory share, "
          "keeps up",
          ("R48_kv_cache_pressure",), "memory",
          notes="source: vLLM docs, Optimization and Tuning, 'Preemption': when the KV cache "
                "space is insufficient vLLM preempts requests (recompute) and warns; the "
                "advice is more gpu_memory_utilization, fewer max_num_seqs or "
                "max_num_batched_tokens, more tensor parallelism")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Inference(gpus=[0], rate=lambda t: 3.0, tokens=300, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=28500, kv_tokens=100_000,
                       prompt_tokens=4000, prefill_s_per_token=0.00004,
                       cmdline=LLAMA3_8B_SERVE + " --gpu-memory-utilization 0.35"))
    host.add(Inference(gpus=[1], rate=lambda t: 1.0, tokens=300, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                       prompt_tokens=4000, prefill_s_per_token=0.00004,
                       cmdline=LLAMA3_8B_SERVE))
    return host


@scenario("healthy-vllm-light-load", 506,
          "none: two vLLM pods serving Llama-3 8B on two H100 at night, a request every 3 to "
          "5 s each: the GPUs mostly wait for requests, the KV caches are nearly empty, "
          "nothing queues",
          notes="source: vLLM's metrics at low load (docs/design/metrics.md): "
                "num_requests_waiting 0, kv_cache_usage_perc low, no preemptions; an idle "
                "server is not a fault")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    for g, rate in ((0, 0.33), (1, 0.2)):
        host.add(Inference(gpus=[g], rate=lambda t, r=rate: r, tokens=300, iter_s=0.012,
                           per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                           prompt_tokens=1500, prefill_s_per_token=0.00004,
                           cmdline=LLAMA3_8B_SERVE))
    return host


# --- serving: why the engine's GPU is not busier, what its latency waits on (issue #59) ---
VLLM_05_SERVE = "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model " \
                "/models/Qwen-7B-Chat --trust-remote-code --max-num-seqs 256"
TRITON_TRTLLM = "/opt/tritonserver/bin/tritonserver --model-repository=/models/" \
                "inflight_batcher_llm --http-port 8000 --metrics-port 8002"


def steady(per_s: float) -> Callable[[float], float]:
    """Requests arriving at ``per_s`` a second, whatever the time."""
    return lambda t: per_s


@scenario("vllm-cpu-bound-scheduler", 507,
          "vLLM 0.5 serving a 7B chat model on GPU 0 of two H100 at high concurrency: every "
          "step the engine's Python loop schedules, samples and detokenises each of up to "
          "256 running requests on one core (the GIL) while the GPU waits; requests queue. "
          "GPU 1's engine, at a tenth of the load, keeps up",
          ("R49_engine_cpu_bound",), "host_starvation",
          notes="source: vllm-project/vllm issue #6560 (13B on an H100: at batch 64-96 GPU "
                "utilisation ~60 %, the schedule and post-processing of requests, Python on "
                "one core) and #4806 (7B, 128 concurrent requests: CPU 100 %, SM 60-75 %); "
                "vLLM blog 'vLLM v0.6.0: 2.7x Throughput Improvement' (2024-09-05). CPU per "
                "request and step from #6560: 0.67 x the GPU's 21 ms step at batch 80")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    for g, rate in ((0, 14.0), (1, 1.4)):
        host.add(Inference(gpus=[g], rate=steady(rate), tokens=250, iter_s=0.012,
                           per_seq_s=0.00012, cpu_s_per_seq=0.00014, fb_mib=73500,
                           kv_tokens=400_000, prompt_tokens=600,
                           prefill_s_per_token=0.00004, cmdline=VLLM_05_SERVE), seed=str(g))
    return host


@scenario("healthy-vllm-gpu-saturated", 508,
          "none: vLLM's V1 engine serving Llama-3 8B on one H100 past its capacity: full "
          "batches back to back, the GPU busy, the main loop spinning on the GPU, requests "
          "queueing. A capacity limit (add replicas), not a fault of the host",
          notes="near miss of R49: requests wait and the engine's main thread is on a CPU "
                "all the time, but the GPU is busy: the thread waits on the GPU (CUDA "
                "synchronisation spins). source: vLLM V1 engine (docs/design/arch_overview): "
                "EngineCore's busy loop; CPU per request and step ~0.01 ms")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=lambda t: 22.0, tokens=250, iter_s=0.012,
                       per_seq_s=0.00012, cpu_s_per_seq=0.00001, fb_mib=73500,
                       kv_tokens=400_000, prompt_tokens=600, prefill_s_per_token=0.00004,
                       cmdline=LLAMA3_8B_SERVE))
    return host


@scenario("triton-trtllm-postprocessing-bound", 509,
          "Triton with the TensorRT-LLM in-flight batcher on GPU 0 of two H100, streaming: "
          "the ensemble's Python postprocessing model (one instance) spends ~40 ms a call "
          "computing len(tokenizer.vocab), a call per streamed token; its stub process "
          "holds one core and requests reach the engine no faster than it passes them",
          ("R50_engine_frontend_bound",), "host_starvation",
          notes="source: triton-inference-server/tensorrtllm_backend issue #622 "
                "(postprocessing model in v0.13.0: len(self.tokenizer.vocab) on every "
                "execute(), ~40 ms, critical in streaming mode); triton-inference-server/"
                "server issue #5317 (a single preprocessing instance bottlenecks: raise its "
                "instance_group count)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Inference(gpus=[0], rate=lambda t: 1.2, tokens=60, iter_s=0.010,
                       per_seq_s=0.0001, fb_mib=76000, kv_tokens=300_000, prompt_tokens=800,
                       prefill_s_per_token=0.00004, frontend_s=0.004,
                       frontend_s_per_token=0.04, frontend_in="workers", workers=2,
                       engine="triton", cmdline=TRITON_TRTLLM, comm="tritonserver",
                       exe="/opt/tritonserver/bin/tritonserver"))
    return host


@scenario("healthy-triton-trtllm-streaming", 510,
          "none: Triton with the TensorRT-LLM in-flight batcher on one H100, streaming, "
          "its postprocessing model fixed (vocab size read once): the stub at a tenth of a "
          "core, the requests flowing",
          notes="near miss of R50: the same server after the fix of tensorrtllm_backend "
                "issue #622 (self.tokenizer.vocab_size, ~4 ms a call)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=lambda t: 1.2, tokens=60, iter_s=0.010,
                       per_seq_s=0.0001, fb_mib=76000, kv_tokens=300_000, prompt_tokens=800,
                       prefill_s_per_token=0.00004, frontend_s=0.004,
                       frontend_s_per_token=0.001, frontend_in="workers", workers=2,
                       engine="triton", cmdline=TRITON_TRTLLM, comm="tritonserver",
                       exe="/opt/tritonserver/bin/tritonserver"))
    return host


@scenario("vllm-long-prefills-no-chunking", 511,
          "vLLM serving Llama-3 8B on one H100 for a RAG application, chunked prefill off: "
          "prompts of ~4,000 tokens at 3 requests/s; every step that computes a prompt "
          "takes ~0.15 s or more and every running request's next token waits for it",
          ("R51_long_prefills_block_decodes",), "device_efficiency",
          notes="source: vLLM docs, Optimization and Tuning, 'Chunked Prefill' (with it "
                "off, prefills are scheduled first and decodes wait; chunking bounds a "
                "step's tokens to max_num_batched_tokens and improves inter-token latency); "
                "Agrawal et al., 'Taming Throughput-Latency Tradeoff in LLM Inference with "
                "Sarathi-Serve' (OSDI 2024): generation stalls behind prefills")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=lambda t: 3.0, tokens=200, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                       prompt_tokens=4000, prefill_s_per_token=0.00004,
                       cmdline=LLAMA3_8B_SERVE + " --no-enable-chunked-prefill"))
    return host


@scenario("healthy-vllm-chunked-prefill-rag", 512,
          "none: the same RAG load on vLLM with chunked prefill on "
          "(--max-num-batched-tokens 2048): each step computes at most 2,048 tokens, "
          "decodes first, so no step stalls the running requests for a whole prompt",
          notes="near miss of R51. source: vLLM docs, Optimization and Tuning, 'Chunked "
                "Prefill'")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=lambda t: 3.0, tokens=200, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                       prompt_tokens=4000, prefill_s_per_token=0.00004, chunk_tokens=2048,
                       cmdline=LLAMA3_8B_SERVE + " --enable-chunked-prefill "
                                                 "--max-num-batched-tokens 2048"))
    return host


@scenario("healthy-vllm-overnight-trickle", 513,
          "none: four vLLM replicas of an internal assistant on four A100 overnight, a "
          "request a minute or less each, one replica with none at all for 20 minutes: the "
          "GPUs wait for requests, nothing queues",
          notes="too little load is not a fault (R52, info). source: vLLM docs, Production "
                "Metrics: num_requests_waiting 0, num_requests_running 0-1; KServe scales "
                "serving on concurrency, not on GPU utilisation")
def _(seed: int) -> Host:
    host = node(seed, A100, 4, minutes=20)
    for g, rate in ((0, 1 / 60), (1, 1 / 90), (2, 1 / 240), (3, 1e-6)):
        host.add(Inference(gpus=[g], rate=steady(rate), tokens=300, iter_s=0.016,
                           per_seq_s=0.0002, fb_mib=72000, kv_tokens=350_000,
                           prompt_tokens=900, prefill_s_per_token=0.00007,
                           cmdline=LLAMA3_8B_SERVE), seed=str(g))
    return host


@scenario("vllm-gpu-shared-with-finetune", 514,
          "another process time-slices the serving engine's GPU: at 300 s a LoRA "
          "fine-tuning job is started on GPU 0 of two A100, where vLLM serves; every "
          "engine step now waits for the job's kernels",
          ("R53_engine_gpu_shared", "R26_multi_process_contention"), "sharing_config",
          onset_s=300,
          notes="source: NVIDIA MPS documentation (without MPS, contexts of different "
                "processes are time-sliced); Kubernetes GPU time-slicing (NVIDIA device "
                "plugin docs: no memory or fault isolation, replicas share by time)")
def _(seed: int) -> Host:
    host = node(seed, A100, 2, minutes=14)
    host.add(Inference(gpus=[0], rate=lambda t: 2.0, tokens=250, iter_s=0.018,
                       per_seq_s=0.0002, fb_mib=52000, kv_tokens=250_000, prompt_tokens=900,
                       prefill_s_per_token=0.00007,
                       gpu_speed=lambda t: 0.5 if t >= 305 else 1.0,
                       cmdline=LLAMA3_8B_SERVE + " --gpu-memory-utilization 0.65"))
    host.add(Inference(gpus=[1], rate=lambda t: 2.0, tokens=250, iter_s=0.018,
                       per_seq_s=0.0002, fb_mib=72000, kv_tokens=350_000, prompt_tokens=900,
                       prefill_s_per_token=0.00007, cmdline=LLAMA3_8B_SERVE), seed="1")
    job = host.add(Training(gpus=[0], gpu_s=0.5, host_s=0.02, mix=LLM_TRAIN, workers=2,
                            fb_mib=24000,
                            cmdline="/usr/bin/python3 finetune_lora.py --model llama-3-8b "
                                    "--batch-size 4"), age_s=-300.0, seed="ft")
    job[0].since = 305.0     # its loader workers (5 s younger) started: it computes
    return host


@scenario("vllm-gpu-thermal-throttle", 515,
          "the GPU throttles under the serving engine: at 480 s GPU 0's fans fail (three "
          "times the thermal resistance) while vLLM serves at a steady rate; clocks drop "
          "and every step takes longer",
          ("R20_thermal_throttle",), "power_thermal", onset_s=480,
          notes="source: NVML clock event reasons (SW/HW thermal slowdown) and vLLM's "
                "inter_token_latency_seconds: a step's time grows as the SM clock falls")
def _(seed: int) -> Host:
    host = node(seed, H100, 2, minutes=16)
    host.conditions[0].r_factor = lambda t: 3.0 if t >= 480 else 1.0
    slow = thermal_speed(H100, LLM_DECODE, 3.0, host.inlet[0])
    for g in range(2):
        host.add(Inference(gpus=[g], rate=lambda t: 6.0, tokens=250, iter_s=0.012,
                           per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                           prompt_tokens=900, prefill_s_per_token=0.00004,
                           gpu_speed=(lambda t: slow if t >= 540 else 1.0) if g == 0 else None,
                           cmdline=LLAMA3_8B_SERVE), seed=str(g))
    return host


# --- serving: throughput per GPU down, and closed-loop clients (issue #59) ----------------
@scenario("vllm-peak-hour-power-capped", 516,
          "serving throughput per GPU down while requests keep coming: vLLM on GPU 0 of two "
          "H100 runs near its capacity at the peak hour (12 requests/s) when, at 420 s, the "
          "rack's power manager caps the board at 300 W out of band (no command on the "
          "host): clocks fall, every step takes longer, generation tokens/s drop by a "
          "quarter and the queue grows",
          ("R19_power_cap",), "power_thermal", onset_s=420,
          notes="the symptom is R55 (throughput down, the requests in the engine held), "
                "explained by the power cap. source: NVML nvmlDeviceGetEnforcedPowerLimit "
                "(the limit the driver enforces after all limiters, the out-of-band power "
                "limit interface included) and the SW power cap clock event reason; vLLM "
                "docs, Production Metrics (vllm:generation_tokens_total, "
                "vllm:num_requests_running, vllm:num_requests_waiting). The decode mix draws "
                "~530 W at full clocks; power_speed() gives the clock share at 300 W")
def _(seed: int) -> Host:
    host = node(seed, H100, 2, minutes=16)
    host.conditions[0].power_limit = lambda t: 300.0 if t >= 420 else 700.0
    slow = power_speed(H100, LLM_DECODE, 300.0)
    for g, rate in ((0, 12.0), (1, 6.0)):
        host.add(Inference(gpus=[g], rate=steady(rate), tokens=250, iter_s=0.012,
                           per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                           prompt_tokens=600, prefill_s_per_token=0.00004, chunk_tokens=2048,
                           gpu_speed=(lambda t: slow if t >= 420 else 1.0) if g == 0 else None,
                           cmdline=LLAMA3_8B_SERVE), seed=str(g))
    return host


@scenario("healthy-vllm-evening-load-drop", 517,
          "none: two vLLM replicas of Llama-3 8B on two H100 at the end of the working day: "
          "at 420 s the request rate falls from 10 to 3 a second; generation tokens/s fall "
          "by two thirds with the requests running, nothing waits",
          notes="near miss of R55: throughput down because less load arrives, not because "
                "the engine slowed (vllm:num_requests_running falls with "
                "vllm:generation_tokens_total's rate). source: vLLM docs, Production Metrics; "
                "continuous batching serves what arrives (docs.vllm.ai)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2, minutes=16)
    for g in range(2):
        host.add(Inference(gpus=[g], rate=lambda t: 10.0 if t < 420 else 3.0, tokens=250,
                           iter_s=0.012, per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000,
                           prompt_tokens=600, prefill_s_per_token=0.00004, chunk_tokens=2048,
                           cmdline=LLAMA3_8B_SERVE), seed=str(g))
    return host


@scenario("vllm-client-pool-caps-concurrency", 518,
          "a load test of 200 simulated users against vLLM on GPU 0 of two H100 sends its "
          "requests through one aiohttp session, whose connector allows 100 connections: "
          "the engine runs 100 requests at a time and none waits, the KV cache a quarter "
          "full; the GPU waits for the client (a closed loop), not the client for the GPU",
          ("R52b_engine_closed_loop",), "sharing_config",
          notes="source: vllm-project/vllm issue #14513 (200 concurrent users, vLLM runs at "
                "most 100, a new one admitted as each ends; the maintainer: something in the "
                "client limits concurrency to 100); aiohttp docs, TCPConnector (limit: 100 "
                "simultaneous connections by default); vLLM benchmarks/benchmark_serving.py "
                "(--max-concurrency: how many requests may execute at a time). Not an alarm: "
                "raise the client's concurrency")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=steady(1.0), concurrency=100, tokens=250, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000, prompt_tokens=600,
                       prefill_s_per_token=0.00004, chunk_tokens=2048,
                       cmdline=LLAMA3_8B_SERVE))
    return host


@scenario("healthy-vllm-benchmark-past-capacity", 519,
          "none: benchmark_serving.py --max-concurrency 512 against vLLM with --max-num-seqs "
          "256 on one H100: the engine runs its full batch back to back, the other 256 "
          "requests wait in its queue; a closed loop past the engine's capacity, the GPU "
          "busy",
          notes="near miss of R52b: a closed loop, but requests wait in the engine (its batch "
                "limit, not the client's, bounds the batch). source: vLLM "
                "benchmarks/benchmark_serving.py (--max-concurrency); vLLM engine arguments "
                "(--max-num-seqs: the most sequences an iteration runs); vLLM docs, Production "
                "Metrics (vllm:num_requests_waiting)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=steady(1.0), concurrency=512, tokens=250, iter_s=0.012,
                       per_seq_s=0.00012, fb_mib=73500, kv_tokens=400_000, prompt_tokens=600,
                       prefill_s_per_token=0.00004, chunk_tokens=2048, max_seqs=256,
                       cmdline=LLAMA3_8B_SERVE + " --max-num-seqs 256"))
    return host


# vLLM V1 (0.8+) started with `vllm serve`: the API server process forks EngineCore, which
# holds the GPU, and keeps the frontend (HTTP, tokenisation and multimodal preprocessing,
# detokenisation, streaming) on its own asyncio loop: EngineCore's parent, which the sched
# probe watches as its frontend.
VLLM_V1_VL_SERVE = "/usr/bin/python3 /usr/local/bin/vllm serve " \
                   "Qwen/Qwen2.5-VL-7B-Instruct --max-num-seqs 64"


@scenario("vllm-v1-api-server-saturated", 520,
          "vLLM V1 serving Qwen2.5-VL 7B on GPU 0 of two H100 for image tagging (a photo "
          "and a few output tokens a request): the single API server process, EngineCore's "
          "parent, decodes and preprocesses every image and tokenises on one asyncio loop, "
          "at 100 % of a core; requests queue in it and reach EngineCore no faster than it "
          "passes them, and the GPU idles more than half the time",
          ("R50_engine_frontend_bound",), "host_starvation",
          notes="source: vllm-project/vllm issue #14931 (the API server process never above "
                "100 % of a CPU; the maintainers: the HuggingFace processor's slow input "
                "processing), issue #12705 (RFC 'Scale the API server across multiple CPUs': "
                "one API server process on one CPU cannot keep fast GPUs busy) and issue "
                "#580 (the API server at 50 % GPU utilisation where the LLM class reaches "
                "90-100 %); docs.vllm.ai v0.10.0 vllm.entrypoints.cli.serve "
                "(--api-server-count above 1 runs several API server processes). ~0.4 s of "
                "CPU a request for a multi-megapixel photo, ~1,000 image tokens")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)
    host.add(Inference(gpus=[0], rate=steady(2.8), tokens=8, iter_s=0.010,
                       per_seq_s=0.00012, cpu_s_per_seq=0.00001, fb_mib=73500,
                       kv_tokens=400_000, prompt_tokens=1000, prefill_s_per_token=0.00004,
                       frontend_s=0.40, frontend_s_per_token=0.001,
                       frontend_in="parent", cmdline=VLLM_V1_VL_SERVE))
    return host


@scenario("healthy-vllm-v1-api-server-busy", 521,
          "none: vLLM V1 serving Qwen2.5-VL 7B on one H100, describing photos at length (a "
          "few hundred tokens each): the API server's loop busy most of the time with the "
          "images, but the GPU is the busy one, with every step, and requests flow",
          notes="near miss of R50: the frontend process's thread near a core, but the GPU "
                "busy: the engine, not the frontend, sets the pace. source: vLLM docs, "
                "design/arch_overview (V1 process architecture: the API server process does "
                "input processing, EngineCore the scheduling); vllm-project/vllm issue "
                "#12705 (the API server's one core)")
def _(seed: int) -> Host:
    host = node(seed, H100, 2)     # GPU 1: no job
    host.add(Inference(gpus=[0], rate=steady(2.8), tokens=300, iter_s=0.010,
                       per_seq_s=0.00012, cpu_s_per_seq=0.00001, fb_mib=73500,
                       kv_tokens=400_000, prompt_tokens=1000, prefill_s_per_token=0.00004,
                       frontend_s=0.30, frontend_s_per_token=0.0001,
                       frontend_in="parent", cmdline=VLLM_V1_VL_SERVE))
    return host


# vLLM V1 with tensor parallelism: the API server forks EngineCore, which runs the
# scheduler's busy loop and holds no GPU, and EngineCore forks one worker per GPU; the
# sched probe watches EngineCore as the first worker's engine loop.
VLLM_V1_70B_TP4_SERVE = "/usr/bin/python3 /usr/local/bin/vllm serve " \
                        "meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4"


@scenario("vllm-v1-tp4-enginecore-cpu-bound", 522,
          "vLLM V1 serving Llama-3.1 70B with tensor parallelism 4 on four H100 at high "
          "concurrency: EngineCore, the process between the API server and the four GPU "
          "workers, schedules and updates up to 256 running requests a step in Python on "
          "one core, at 100 % of it; the workers wait for it, the GPUs idle more than half "
          "the time and requests queue. The workers' own main threads are not busy",
          ("R49_engine_cpu_bound",), "host_starvation",
          notes="source: vllm-project/vllm issue #14538 (tensor parallel 2 on two H100: two "
                "CPU cores constantly above 100 %, a bottleneck; the maintainers: the GIL "
                "keeps a process to one core), issue #23233 (RFC: V1's core loop, schedule "
                "then execute then update, cannot use the CPU while the GPU runs the model) "
                "and pull request #19970 (async scheduling, to hide the scheduler's overhead "
                "behind model execution; the scheduler and the GPU workers run in separate "
                "processes); docs.vllm.ai design/arch_overview (V1 process architecture). CPU "
                "per running request and step heuristic (0.2 ms)")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    host.add(Inference(gpus=[0, 1, 2, 3], rate=steady(14.0), tokens=250, iter_s=0.020,
                       per_seq_s=0.00006, cpu_s_per_seq=0.0002, fb_mib=76000,
                       kv_tokens=1_000_000, prompt_tokens=600, prefill_s_per_token=0.00002,
                       loop_in="between", cmdline=VLLM_V1_70B_TP4_SERVE))
    return host


@scenario("healthy-vllm-v1-tp4-enginecore-busy", 523,
          "none: vLLM V1 serving Llama-3.1 70B with tensor parallelism 4 on four H100 at "
          "moderate load: EngineCore's loop busy ~60 % of a core, the GPUs busy with every "
          "step, nothing waiting long",
          notes="near miss of R49: the engine loop (EngineCore, above the GPU workers) is "
                "well on a CPU, but below a core and the GPUs are busy: the GPUs set the "
                "pace. source: docs.vllm.ai design/arch_overview (V1 process architecture: "
                "the engine core process schedules, one worker process per GPU); "
                "vllm-project/vllm pull request #19970 (the scheduler in a process apart "
                "from the GPU workers)")
def _(seed: int) -> Host:
    host = node(seed, H100, 4)
    host.add(Inference(gpus=[0, 1, 2, 3], rate=steady(6.0), tokens=250, iter_s=0.020,
                       per_seq_s=0.00006, cpu_s_per_seq=0.00001, fb_mib=76000,
                       kv_tokens=1_000_000, prompt_tokens=600, prefill_s_per_token=0.00002,
                       loop_in="between", loop_wait=0.55, cmdline=VLLM_V1_70B_TP4_SERVE))
    return host
