"""The Xid and SXid catalogue in gpuwhy's own words: what each code means and what to do.

Shared vocabulary: the kernel-log source, the store, the correlator and the web view all
explain an Xid through :func:`xid_info`. Facts come from NVIDIA's Xid catalogue (Ampere
and newer, 2025-10) and its older per-code cause flags; the wording is ours.

``severity``, on the one scale of :mod:`gpuwhy.severity`: ``critical`` (the GPU or node is
unusable until reset/reboot), ``error`` (work on the GPU failed), ``warning`` (degraded, act
soon), ``info`` (no action).
``origin``: the most likely place to look first: ``hardware``, ``driver``,
``application`` or ``unknown``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class XidInfo:
    """What one Xid code means. ``gpu_reset``/``reboot``: needed to recover the GPU."""

    code: int
    mnemonic: str
    title: str
    severity: str
    origin: str
    action: str
    gpu_reset: bool = False
    reboot: bool = False

    def as_fields(self) -> dict[str, object]:
        """The catalogue fields as flat JSON-ready values (``code`` left out)."""
        fields = asdict(self)
        del fields["code"]
        return fields


_RESTART_APP = "Restart the application; if it keeps happening, check its code and CUDA version."
_RESET_GPU = "Drain the GPU and reset it (nvidia-smi -r) before giving it new work."
_SUPPORT = "Collect nvidia-bug-report.sh output and contact your hardware vendor or NVIDIA."
_NVLINK5 = ("NVLink5 error: decode the sub-code in the message; a Fatal one needs the GPU "
            "reset, a Nonfatal one needs watching for repeats.")

# code: (mnemonic, title, severity, origin, action, gpu_reset, reboot)
_CATALOGUE: dict[int, tuple[str, str, str, str, str, bool, bool]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "error",
        "driver", _RESTART_APP, False, False),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception", "error",
         "application", "Usually an illegal instruction or out-of-range access in the "
         "application's kernel; restart it and check it (compute-sanitizer).", False, False),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "error",
         "application", "The application accessed GPU memory it does not own (or the driver "
         "mapped it wrongly); restart it and check it with compute-sanitizer.", False, False),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "error",
         "driver", _RESTART_APP, False, False),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "warning",
         "driver", "Usually harmless on its own; report it if it repeats.", False, False),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "error",
         "application", "The driver stopped a channel after a user-level fault; the GPU "
         "stays usable. Restart the application.", False, False),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics engine fault during context switch",
         "warning", "driver", "Watch for repeats; report it if it keeps happening.", False,
         False),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup after earlier errors", "info",
         "driver", "The driver tore down channels because of another error: look at the Xid "
         "that caused it (often named in the line).", False, False),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "critical", "driver",
         _RESET_GPU, True, False),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "Double-bit ECC error in GPU memory", "critical",
         "hardware", "Uncorrectable memory error: drain the GPU and reset it; if it repeats "
         "after the reset, the GPU needs service.", True, False),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power not connected", "warning",
         "hardware", "Check the GPU's power cables; it runs at reduced clocks.", False, False),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "error", "driver",
         _RESTART_APP, False, False),
    61: ("PMU_BREAKPOINT", "Internal micro-controller breakpoint", "warning", "driver",
         _SUPPORT, False, False),
    62: ("PMU_HALT_ERROR", "Internal micro-controller halt", "critical", "hardware",
         _RESET_GPU, True, False),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory row remapping event", "info", "hardware",
         "A memory row was marked for remapping; it takes effect at the next GPU reset. "
         "No action unless it repeats.", False, False),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "critical",
         "hardware", "The GPU could not retire a bad memory row: reset it; if it repeats the "
         "GPU needs service.", True, False),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "Video decoder exception", "error", "application",
         _RESTART_APP, False, False),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error", "error", "driver",
         _RESTART_APP, False, False),
    74: ("NVLINK_ERROR", "NVLink error", "critical", "hardware", "An NVLink link reported a "
         "fatal error: reset the GPU (and the fabric); check the link if it repeats.", True,
         False),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "critical",
         "hardware", "The GPU no longer answers on PCIe: reboot the node; check power, "
         "cooling, the PCIe slot or riser if it repeats.", False, True),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to the GPU", "error", "driver",
         _RESTART_APP, False, False),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "warning", "hardware",
         "Corrected errors are frequent: watch the GPU's ECC counters.", False, False),
    93: ("INFOROM_ERASE_LIMIT_EXCEEDED", "InfoROM wear limit exceeded", "warning", "hardware",
         "Non-fatal; report it to the vendor.", False, False),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "error", "hardware",
         "An uncorrectable memory error hit only the application named: restart it. The GPU "
         "stays usable.", False, False),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "critical",
         "hardware", "An uncorrectable memory error may have hit every process on the GPU: "
         "drain it and reset it.", True, False),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timeout", "critical",
          "unknown", _RESET_GPU, True, False),
    110: ("SEC_FAULT_ERROR", "Security fault", "critical", "hardware", _RESET_GPU, True, False),
    119: ("GSP_RPC_TIMEOUT", "GSP firmware did not answer (RPC timeout)", "critical", "driver",
          "The GPU's GSP firmware hung: drain the GPU and reset it; the line names the "
          "driver call that was waiting.", True, False),
    120: ("GSP_ERROR", "GSP firmware error", "critical", "driver", _RESET_GPU, True, False),
    121: ("C2C_ERROR", "C2C link error", "warning", "hardware", _SUPPORT, False, False),
    136: ("ALI_TRAINING_FAIL", "NVLink link training failed", "critical", "hardware",
          _RESET_GPU, True, False),
    137: ("NVLINK_PRIV_ERR", "NVLink privilege error", "warning", "driver", _SUPPORT, False,
          False),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC error", "critical", "hardware",
          _RESET_GPU, True, False),
    141: ("ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA fast path error", "warning", "driver",
          _SUPPORT, False, False),
    143: ("GPU_INIT_ERROR", "GPU initialisation error", "critical", "hardware", _RESET_GPU,
          True, False),
    144: ("NVLINK_SAW_ERROR", "NVLink SAW error", "error", "hardware", _NVLINK5, False, False),
    145: ("NVLINK_RLW_ERROR", "NVLink RLW error", "error", "hardware", _NVLINK5, False, False),
    146: ("NVLINK_TLW_ERROR", "NVLink TLW error", "error", "hardware", _NVLINK5, False, False),
    147: ("NVLINK_TREX_ERROR", "NVLink TREX error", "error", "hardware", _NVLINK5, False, False),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW_CTRL error", "error", "hardware", _NVLINK5,
          False, False),
    149: ("NVLINK_NETIR_ERROR", "NVLink NETIR error", "error", "hardware", _NVLINK5, False,
          False),
    150: ("NVLINK_MSE_ERROR", "NVLink MSE error", "error", "hardware", _NVLINK5, False, False),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation error", "critical", "driver",
          "Restart the virtual machine (confidential computing key rotation failed).", False,
          True),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", "info", "driver",
          "The driver says what recovery the GPU now needs (see the action in the line); "
          "it refers to an earlier Xid.", False, False),
    155: ("NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", "critical", "driver",
          _RESET_GPU, True, False),
    156: ("RESOURCE_RETIREMENT_EVENT", "Resource retirement event", "warning", "hardware",
          _RESET_GPU, True, False),
    157: ("RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure", "warning", "hardware",
          _SUPPORT, False, False),
    158: ("GPU_FATAL_TIMEOUT", "GPU fatal timeout", "critical", "unknown", _RESET_GPU, True,
          False),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI non-data error", "error", "driver",
          "Check unified memory (UVM) use of the application; report it if it repeats.",
          False, False),
    171: ("UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM error (details of Xid 48)",
          "critical", "hardware", _RESET_GPU, True, False),
    172: ("UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM error (details of Xid 48)",
          "critical", "hardware", _RESET_GPU, True, False),
}

MAX_CODE = (1 << 32) - 1     # the driver prints an Xid as %u
_COPY_ENGINES = (*range(39, 42), 70, 71, 72, 73, 75, 76, 77, 85, *range(126, 136))

# Recovery actions named by Xid 154 (gpu.c _gpuRecoveryActionName).
RECOVERY_ACTIONS = {"None": (False, False), "GPU Reset Required": (True, False),
                    "Node Reboot Required": (False, True), "Drain P2P": (False, False),
                    "Drain and Reset": (True, False), "Recover IMEX Domain": (False, False)}


def xid_info(code: int) -> XidInfo:
    """The catalogue entry of an Xid; an honest "unknown" entry for codes not in it.

    >>> xid_info(79).title
    'GPU has fallen off the bus'
    >>> xid_info(9999).origin
    'unknown'
    >>> xid_info(10 ** 5000).title
    'Xid code out of range (not one the driver prints)'
    """
    if code in _CATALOGUE:
        return XidInfo(code, *_CATALOGUE[code])
    if code in _COPY_ENGINES:
        return XidInfo(code, "ROBUST_CHANNEL_CE_ERROR", "Copy engine exception", "error",
                       "driver", _RESTART_APP)
    if not 0 <= code <= MAX_CODE:
        # not a code the driver can print (a u32); and str() of a huge int raises
        return XidInfo(code, "UNKNOWN", "Xid code out of range (not one the driver prints)",
                       "warning", "unknown", "Check where the code came from.")
    return XidInfo(code, "UNKNOWN", f"Xid {code} (not in gpuwhy's catalogue)", "warning",
                   "unknown", "Look the code up in NVIDIA's Xid catalogue for your driver.")


# SXid ranges (NVSwitch units), from ctrl_dev_nvswitch.h.
_SXID_UNITS = {10000: "HOST", 11000: "NPORT_INGRESS", 12000: "NPORT_EGRESS", 13000: "FSTATE",
               14000: "TSTATE", 15000: "ROUTE", 16000: "NPORT", 17000: "NVLCTRL",
               18000: "NVLIPT", 19000: "NVLTLC", 20000: "DLPL", 21000: "AFS", 22000: "MINION",
               23000: "NXBAR", 24000: "SOURCETRACK", 25000: "NVLIPT_LNK", 26000: "SOE",
               27000: "CCI", 28000: "OSFP_THERM", 29000: "MULTICASTTSTATE",
               30000: "REDUCTIONTSTATE"}


def sxid_info(code: int, fatal: bool | None = None) -> XidInfo:
    """Catalogue entry of an NVSwitch SXid: the unit from its range, severity from Fatal/Non-fatal.

    >>> sxid_info(22013).mnemonic
    'MINION'
    """
    unit = _SXID_UNITS.get(code // 1000 * 1000, "UNKNOWN")
    if fatal:
        return XidInfo(code, unit, f"NVSwitch {unit} fatal error", "critical", "hardware",
                       "A fatal NVSwitch error: the fabric manager resets the affected "
                       "links; drain the GPUs that use them and check the fabric.", True)
    return XidInfo(code, unit, f"NVSwitch {unit} error", "warning", "hardware",
                   "A non-fatal NVSwitch error: watch for repeats on the same link.")


def catalogue_fields(kind: str, code: int | None, details: dict | None = None) -> dict:
    """Catalogue fields for a parsed kernel-log record: the Xid's or SXid's entry, with the
    reset/reboot need taken from the line itself for Xid 154 (it names the new action)."""
    details = details or {}
    if kind == "xid" and code is not None:
        fields = xid_info(code).as_fields()
        action = details.get("recovery_to")
        if code == 154 and action in RECOVERY_ACTIONS:
            fields["gpu_reset"], fields["reboot"] = RECOVERY_ACTIONS[action]
            fields["severity"] = "info" if action == "None" else "critical"
        return fields
    if kind == "sxid" and code is not None:
        return sxid_info(code, details.get("fatal")).as_fields()
    if kind == "fallen_off_bus":
        return xid_info(79).as_fields()
    return {}
