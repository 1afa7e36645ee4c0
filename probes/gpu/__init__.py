"""GPU counter sources: DCGM, NVML, a dcgm-exporter scrape and a labelled simulator.

Every source yields the same events (``gpu_seen``, ``gpu_sample``, ``gpu_xid``,
``gpu_state``, ``gpu_processes``) with fields named and scaled as in :mod:`.fields`.
:mod:`.select` picks one (DCGM, then NVML, then dcgm-exporter, then the simulator) and
:mod:`.runner` publishes what it reads on the bus, and before it the driver's own GPU
table (``driver_gpu``, from /proc/driver/nvidia/gpus), whichever source runs. Threads:
the runner's own, plus NVML's Xid waiter. The vendor modules (``pydcgm``, ``pynvml``) are
imported lazily, never at import time of this package.
"""
