"""The Xid and SXid catalogue in gpuwhy's own words: what each code means and what to do.

Shared vocabulary: the kernel-log source, the store, the correlator and the web view all
explain an Xid through :func:`xid_info`. The facts follow NVIDIA's Xid catalogue for Ampere
and newer GPUs (:data:`CATALOGUE_SOURCE`): every code it documents (1-172) with NVIDIA's
mnemonic, its immediate and investigatory resolution buckets, the products it applies to and
the driver branch from which an Xid 154 follows it; the titles and actions are ours.
``tests/data/nvidia-xid-catalog.csv`` keeps NVIDIA's table and ``tests/test_xid_catalog.py``
holds this module to it.

``severity``, on the one scale of :mod:`gpuwhy.severity`, and ``gpu_reset``/``reboot`` follow
from the immediate resolution (:data:`RESOLUTIONS`): a reset or reboot resolution is
``critical``; ``error``: work on the GPU failed; ``warning``: act soon or look into it;
``info``: no action.
``origin``: the most likely place to look first: ``hardware``, ``driver``,
``application`` or ``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

CATALOGUE_SOURCE = ("NVIDIA Xid catalogue, Ampere and newer "
                    "(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, 2025-10)")


@dataclass(frozen=True)
class XidInfo:
    """What one Xid code means. ``gpu_reset``/``reboot``: needed to recover the GPU.

    ``immediate``/``investigatory``: NVIDIA's resolution buckets (``RESET_GPU``,
    ``RESTART_APP``, ...; empty where NVIDIA names none); ``applies_to``: the products NVIDIA
    lists it for (``A100 H100 B100 GB200``); ``xid154_since``: the driver branch from which an
    Xid 154 naming the recovery action follows this code; ``source``: where the facts come from
    (empty: not in NVIDIA's catalogue).
    """

    code: int
    mnemonic: str
    title: str
    severity: str
    origin: str
    action: str
    gpu_reset: bool = False
    reboot: bool = False
    immediate: str = ""
    investigatory: str = ""
    applies_to: str = ""
    xid154_since: str = ""
    source: str = ""

    def as_fields(self) -> dict[str, object]:
        """The catalogue fields as flat JSON-ready values (``code`` left out)."""
        fields = asdict(self)
        del fields["code"]
        return fields


_RESTART_APP = "Restart the application; if it keeps happening, check its code and CUDA version."
_RESET_GPU = "Drain the GPU and reset it (nvidia-smi -r) before giving it new work."
_SUPPORT = "Collect nvidia-bug-report.sh output and contact your hardware vendor or NVIDIA."
_NVLINK5 = ("NVLink5 error: its action depends on the unit and status words in the message "
            "(NVIDIA's 144-150 decode); without them, follow the Xid 154 that comes with it.")
_ENGINE = ("The application's work on this engine failed: restart it; if it keeps happening, "
           "check its code and CUDA version.")
_NO_ACTION = "No immediate action; look into it if it repeats."

# What gpuwhy does with each of NVIDIA's immediate resolution buckets:
# bucket: (severity, gpu_reset, reboot, action). The workflows NVIDIA spells out as a reset
# (Xid 48: "Solo: RESET_GPU"; Xid 74: "a GPU reset or node reboot is needed to clear this
# error") count as one; the NVLink5 one is decoded from the line (nvlink5_decode).
RESOLUTIONS: dict[str, tuple[str, bool, bool, str]] = {
    "RESET_GPU": ("critical", True, False, _RESET_GPU),
    "WORKFLOW_XID_48": ("critical", True, False,
                        "Uncorrectable memory error: drain the GPU and reset it (drain first "
                        "when Xid 63 or 64 comes with it); if it repeats after the reset, run "
                        "the field diagnostics."),
    "WORKFLOW_NVLINK_ERR": ("critical", True, False,
                            "An NVLink link reported an error: reset the GPU (or reboot the "
                            "node) to clear it; if it repeats, check the link and the device "
                            "at its other end."),
    "RESTART_BM": ("critical", False, True,
                   "Reboot the node; if it repeats, check power, cooling and the PCIe slot."),
    "RESTART_VM": ("critical", False, True, "Restart the virtual machine that owns the GPU."),
    "RESTART_APP": ("error", False, False, _RESTART_APP),
    "UPDATE_SWFW": ("error", False, False,
                    "Update the GPU driver, vGPU software and firmware to matching, current "
                    "versions."),
    "CHECK_UVM": ("error", False, False,
                  "If the GPU serves unified memory (UVM) or vGPU, drain it and reset it; "
                  "otherwise no action."),
    "WORKFLOW_NVLINK5_ERR": ("error", False, False, _NVLINK5),
    "XID_154_EVAL": ("error", False, False,
                     "Follow the Xid 154 that comes with it; without one, restart the "
                     "application."),
    "IGNORE": ("warning", False, False, _NO_ACTION),
    "CONTACT_SUPPORT": ("warning", False, False, _SUPPORT),
    "CHECK_MECHANICALS": ("warning", False, False,
                          "Check that the GPU is seated and its power and other cables are "
                          "secure."),
    "WORKFLOW_XID_45": ("info", False, False,
                        "The driver tore down the application's channels because of another "
                        "error (or a kill, Ctrl-C or reset): follow the Xid that caused it, "
                        "often named in the line."),
    "XID_154": ("info", False, False,
                "The driver says what recovery the GPU now needs (see the action in the "
                "line); it refers to an earlier Xid."),
    "": ("warning", False, False,
         "NVIDIA's catalogue names no action for this code yet: watch for repeats and for an "
         "Xid 154 that names the recovery."),
}

# Where gpuwhy's immediate resolution is not NVIDIA's: code: (gpuwhy's bucket, why).
OWN_RESOLUTIONS: dict[int, tuple[str, str]] = {
    171: ("WORKFLOW_XID_48", "NVIDIA names no action; its catalogue says 171 adds details to "
          "an Xid 48 (DRAM), so Xid 48's workflow applies"),
    172: ("WORKFLOW_XID_48", "NVIDIA names no action; its catalogue says 172 adds details to "
          "an Xid 48 (SRAM), so Xid 48's workflow applies"),
}

# Where the level is not the one the resolution gives: code: (level, why). Besides these, an
# IGNORE whose investigatory bucket is IGNORE too asks for nothing at all: info.
_OTHER_LEVELS: dict[int, tuple[str, str]] = {
    43: ("error", "the driver stopped the application's channel after a fault: its work "
         "failed, although the GPU needs nothing"),
    162: ("info", "power smoothing works again: good news, no action"),
}

_ALL = "A100 H100 B100 GB200"
_HBG = "H100 B100 GB200"
_BG = "B100 GB200"
_SINCE_INTRO = "since its introduction"

# Codes NVIDIA documents with a meaning on Ampere and newer. code: (mnemonic, title, origin,
# action (None: the resolution's), immediate, investigatory, applies_to, xid154_since); the
# last four are NVIDIA's facts, the first four gpuwhy's words.
_CATALOGUE: dict[int, tuple[str, str, str, str | None, str, str, str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "driver", None,
        "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    11: ("ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream",
         "application", None, "RESTART_APP", "CHECK_APP/CUDA", _ALL, ""),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception", "application",
         "Usually an illegal instruction or out-of-range access in the application's kernel; "
         "restart it and check it (compute-sanitizer).",
         "RESTART_APP", "WORKFLOW_XID_13", _ALL, ""),
    14: ("ROBUST_CHANNEL_FAKE_ERROR", "Injected test error (listed as unused)", "application",
         "Someone injected this error from user space (a test tool); look for who did if it "
         "was not you.", "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    25: ("ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream",
         "application", None, "RESTART_APP", "CHECK_APP/CUDA", _ALL, ""),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "application",
         "The application accessed GPU memory it does not own (or the driver mapped it "
         "wrongly); restart it and check it with compute-sanitizer.",
         "RESTART_APP", "WORKFLOW_XID_31", _ALL, ""),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "driver",
         None, "RESTART_APP", "CHECK_APP/CUDA", _ALL, ""),
    37: ("ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
         "Driver firmware error (unimplemented method)", "driver",
         "Usually harmless on its own; check the application and CUDA version if it repeats.",
         "IGNORE", "CHECK_APP/CUDA", _ALL, ""),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "driver",
         "Usually harmless on its own; report it if it repeats.",
         "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    39: ("ROBUST_CHANNEL_CE0_ERROR", "Copy engine 0 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    40: ("ROBUST_CHANNEL_CE1_ERROR", "Copy engine 1 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    41: ("ROBUST_CHANNEL_CE2_ERROR", "Copy engine 2 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "application",
         "The driver stopped a channel after a user-level fault; the GPU stays usable. "
         "Restart the application.", "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    44: ("ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics engine fault during context switch",
         "driver", "Watch for repeats; report it if it keeps happening.",
         "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup after earlier errors",
         "driver", None, "WORKFLOW_XID_45",
         "Solo: RESTART_FM; Not Solo: IGNORE (follow other Xid)", _ALL, ""),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "driver", None,
         "RESET_GPU", "CONTACT_SUPPORT", _ALL, ""),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "Double-bit ECC error in GPU memory", "hardware", None,
         "WORKFLOW_XID_48", "WORKFLOW_XID_48", _ALL, "R565"),
    54: ("SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power not connected", "hardware",
         "Check the GPU's power cables; it runs at reduced clocks.",
         "CHECK_MECHANICALS", "CONTACT_SUPPORT", "A100 H100 B100", ""),
    60: ("ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "driver", None,
         "RESTART_APP", "INVESTIGATE_SW", _ALL, ""),
    62: ("PMU_HALT_ERROR", "Internal micro-controller halt", "hardware", None,
         "RESET_GPU", "CONTACT_SUPPORT", _ALL, "R565"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory row remapping event", "hardware",
         "A memory row was marked for remapping; it takes effect at the next GPU reset. "
         "No action unless it repeats.", "IGNORE", "IGNORE", _ALL, "R565"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "hardware",
         "The GPU could not retire a bad memory row: reset it; if it repeats the GPU needs "
         "service.", "RESET_GPU", "CONTACT_SUPPORT", _ALL, "R565"),
    66: ("ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal register access by the driver",
         "driver", "No immediate action; report it to NVIDIA if it repeats.",
         "IGNORE", "INVESTIGATE_SW", _ALL, ""),
    67: ("ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by the driver", "driver",
         "No immediate action; report it to NVIDIA if it repeats.",
         "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "Video decoder exception", "application", None,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error", "driver", None,
         "RESTART_APP", "CHECK_APP/CUDA", _ALL, ""),
    70: ("ROBUST_CHANNEL_CE3_ERROR", "Copy engine 3 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    71: ("ROBUST_CHANNEL_CE4_ERROR", "Copy engine 4 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    72: ("ROBUST_CHANNEL_CE5_ERROR", "Copy engine 5 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    74: ("NVLINK_ERROR", "NVLink error", "hardware", None,
         "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", "A100 H100", "R565"),
    75: ("ROBUST_CHANNEL_CE6_ERROR", "Copy engine 6 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    76: ("ROBUST_CHANNEL_CE7_ERROR", "Copy engine 7 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    77: ("ROBUST_CHANNEL_CE8_ERROR", "Copy engine 8 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    78: ("VGPU_START_ERROR", "vGPU could not start", "driver",
         "The guest driver does not match the host's, or the vGPU type does not fit the "
         "guest: update the driver, vGPU software and firmware to matching versions.",
         "UPDATE_SWFW", "UPDATE_SWFW", _ALL, ""),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "hardware",
         "The GPU no longer answers on PCIe: reboot the node; check power, cooling, the PCIe "
         "slot or riser if it repeats.", "RESTART_BM", "CONTACT_SUPPORT", _ALL, "R565"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to the GPU", "driver", None,
         "RESTART_APP", "CHECK_APP/CUDA", "A100 H100", ""),
    82: ("ROBUST_CHANNEL_NVJPG0_ERROR", "JPEG decoder 0 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    83: ("ROBUST_CHANNEL_NVDEC1_ERROR", "Video decoder 1 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    84: ("ROBUST_CHANNEL_NVDEC2_ERROR", "Video decoder 2 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    85: ("ROBUST_CHANNEL_CE9_ERROR", "Copy engine 9 exception", "driver", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    86: ("ROBUST_CHANNEL_OFA0_ERROR", "Optical flow accelerator exception", "application",
         _ENGINE, "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    88: ("ROBUST_CHANNEL_NVDEC3_ERROR", "Video decoder 3 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    89: ("ROBUST_CHANNEL_NVDEC4_ERROR", "Video decoder 4 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _ALL, ""),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "hardware",
         "Corrected errors are frequent: watch the GPU's ECC counters.",
         "IGNORE", "CONTACT_SUPPORT", _ALL, ""),
    93: ("INFOROM_ERASE_LIMIT_EXCEEDED", "InfoROM wear limit exceeded", "hardware",
         "Non-fatal: the InfoROM wear limit set with nvflash was reached; clear it with "
         "nvflash, or report it to the vendor.", "IGNORE", "CONTACT_SUPPORT", "A100", ""),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "hardware",
         "An uncorrectable memory error hit only the application named: restart it. The GPU "
         "stays usable; reset it when convenient.",
         "RESTART_APP", "IGNORE (sympathetic)", _ALL, "R565"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "hardware",
         "An uncorrectable memory error may have hit every process on the GPU: drain it and "
         "reset it.", "RESET_GPU", "IGNORE (sympathetic)", _ALL, "R565"),
    96: ("ROBUST_CHANNEL_NVDEC5_ERROR", "Video decoder 5 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    97: ("ROBUST_CHANNEL_NVDEC6_ERROR", "Video decoder 6 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    98: ("ROBUST_CHANNEL_NVDEC7_ERROR", "Video decoder 7 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    99: ("ROBUST_CHANNEL_NVJPG1_ERROR", "JPEG decoder 1 exception", "application", _ENGINE,
         "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    100: ("ROBUST_CHANNEL_NVJPG2_ERROR", "JPEG decoder 2 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    101: ("ROBUST_CHANNEL_NVJPG3_ERROR", "JPEG decoder 3 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    102: ("ROBUST_CHANNEL_NVJPG4_ERROR", "JPEG decoder 4 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    103: ("ROBUST_CHANNEL_NVJPG5_ERROR", "JPEG decoder 5 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    104: ("ROBUST_CHANNEL_NVJPG6_ERROR", "JPEG decoder 6 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    105: ("ROBUST_CHANNEL_NVJPG7_ERROR", "JPEG decoder 7 exception", "application", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _HBG, ""),
    106: ("SMBPBI_TEST_MESSAGE", "Management interface (SMBPBI) test message", "driver",
          "A test message sent through the board's management interface: no action.",
          "IGNORE", "IGNORE", _ALL, ""),
    107: ("SMBPBI_TEST_MESSAGE_SILENT", "Management interface (SMBPBI) silent test message",
          "driver", "A test message sent through the board's management interface: no "
          "action.", "IGNORE", "IGNORE", _ALL, ""),
    108: ("NVLINK_REMOTE_TRANSLATION_ERROR", "NVLink remote translation error (listed as unused)",
          "application", "Usually an illegal peer-to-peer access by the application: check it "
          "with compute-sanitizer or cuda-gdb.", "IGNORE", "XID_137_FLOW", _ALL, ""),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timeout", "unknown", None,
          "RESET_GPU", "CONTACT_SUPPORT", _ALL, "R570"),
    110: ("SEC_FAULT_ERROR", "Security fault", "hardware",
          "Drain the GPU and reset it; undo recent hardware changes and cold-reset the node if "
          "it comes back.", "RESET_GPU", "INVESTIGATE_SW", _HBG, "R565"),
    119: ("GSP_RPC_TIMEOUT", "GSP firmware did not answer (RPC timeout)", "driver",
          "The GPU's GSP firmware hung: drain the GPU and reset it; the line names the "
          "driver call that was waiting.", "RESET_GPU", "INVESTIGATE_SW", _ALL, ""),
    120: ("GSP_ERROR", "GSP firmware error", "driver", None,
          "RESET_GPU", "INVESTIGATE_SW", _ALL, "R565"),
    121: ("C2C_ERROR", "C2C link error", "hardware",
          "Corrected errors on the link to the Grace CPU: no immediate action; reset the GPU "
          "at a service window to retrain the link.", "IGNORE", "CONTACT_SUPPORT", "GB200", ""),
    126: ("ROBUST_CHANNEL_CE10_ERROR", "Copy engine 10 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    127: ("ROBUST_CHANNEL_CE11_ERROR", "Copy engine 11 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    128: ("ROBUST_CHANNEL_CE12_ERROR", "Copy engine 12 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    129: ("ROBUST_CHANNEL_CE13_ERROR", "Copy engine 13 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    130: ("ROBUST_CHANNEL_CE14_ERROR", "Copy engine 14 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    131: ("ROBUST_CHANNEL_CE15_ERROR", "Copy engine 15 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    132: ("ROBUST_CHANNEL_CE16_ERROR", "Copy engine 16 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    133: ("ROBUST_CHANNEL_CE17_ERROR", "Copy engine 17 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    134: ("ROBUST_CHANNEL_CE18_ERROR", "Copy engine 18 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    135: ("ROBUST_CHANNEL_CE19_ERROR", "Copy engine 19 exception", "driver", _ENGINE,
          "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    136: ("ALI_TRAINING_FAIL", "NVLink link training failed", "hardware", None,
          "RESET_GPU", "INVESTIGATE_LINK_SI", "H100", "R565"),
    137: ("NVLINK_PRIV_ERR", "NVLink privilege error", "driver",
          "Usually an illegal peer-to-peer access by the application: check it with "
          "compute-sanitizer or cuda-gdb; report it if they find nothing.",
          "IGNORE", "XID_137_FLOW", _ALL, ""),
    139: ("ROBUST_CHANNEL_OFA1_ERROR", "Optical flow accelerator 1 exception", "application",
          _ENGINE, "RESTART_APP", "CONTACT_SUPPORT", _BG, ""),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC error", "hardware", None,
          "RESET_GPU", "CONTACT_SUPPORT", _ALL, ""),
    141: ("ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA fast path error", "driver", _SUPPORT,
          "IGNORE", "CONTACT_SUPPORT", _HBG, ""),
    142: ("ROBUST_CHANNEL_NVENC3_ERROR", "Video encoder 3 exception", "application", None,
          "CONTACT_SUPPORT", "", "GB200", ""),
    143: ("GPU_INIT_ERROR", "GPU initialisation error", "hardware", None,
          "RESET_GPU", "CONTACT_SUPPORT", _HBG, "R575"),
    144: ("NVLINK_SAW_ERROR", "NVLink SAW error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    145: ("NVLINK_RLW_ERROR", "NVLink RLW error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    146: ("NVLINK_TLW_ERROR", "NVLink TLW error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    147: ("NVLINK_TREX_ERROR", "NVLink TREX error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW_CTRL error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    149: ("NVLINK_NETIR_ERROR", "NVLink NETIR error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    150: ("NVLINK_MSE_ERROR", "NVLink MSE error", "hardware", None,
          "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", _BG, "R565"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation error", "driver",
          "Restart the virtual machine (confidential computing key rotation failed).",
          "RESTART_VM", "CONTACT_SUPPORT", _HBG, ""),
    152: ("ROBUST_CHANNEL_DLA_SMMU_ERROR", "Deep learning accelerator (DLA) SMMU error",
          "unknown", "No immediate action; report it if it repeats.",
          "IGNORE", "CONTACT_SUPPORT", "", ""),
    153: ("ROBUST_CHANNEL_DLA_TIMEOUT", "Deep learning accelerator (DLA) timeout", "unknown",
          "No immediate action; report it if it repeats.", "IGNORE", "CONTACT_SUPPORT", "", ""),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", "driver", None,
          "XID_154", "N/A Informational only regarding another Xid", _ALL, ""),
    155: ("NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", "driver",
          "A link went down on purpose (or to sleep): drain the GPU and reset it; find who "
          "took the link down if that was not expected.",
          "RESET_GPU", "INVESTIGATE_SW_USER", _BG, "R565"),
    156: ("RESOURCE_RETIREMENT_EVENT", "Resource retirement event", "hardware",
          "A faulty GPU resource was marked for retirement; it takes effect at the next reset: "
          "drain the GPU and reset it.", "RESET_GPU", "IGNORE", _HBG, "R565"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure", "hardware",
          "No spare resources left to retire a faulty one: work can go on but the Xid may "
          "come back; report it to the vendor.", "IGNORE", "CONTACT_SUPPORT", _HBG, ""),
    158: ("GPU_FATAL_TIMEOUT", "GPU fatal timeout", "unknown", None,
          "RESET_GPU", "CONTACT_SUPPORT", _ALL, _SINCE_INTRO),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI non-data error", "driver", None,
          "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO", _BG, _SINCE_INTRO),
    160: ("CHANNEL_RETIREMENT_EVENT", "Channel retirement event", "driver", _NO_ACTION,
          "IGNORE", "INVESTIGATE_SW", _BG, "R575"),
    161: ("CHANNEL_RETIREMENT_FAILURE", "Channel retirement failure", "driver", _NO_ACTION,
          "IGNORE", "INVESTIGATE_SW", _BG, "R575"),
    162: ("PSHC_REENGAGED", "Power smoothing circuitry working again", "hardware",
          "Power smoothing is available again: no action.", "", "", _BG, ""),
    163: ("PSHC_DISENGAGED", "Power smoothing circuitry disengaged", "hardware",
          "No GPU reset needed. Power smoothing is off (thermal events or a timeout): resolve "
          "the thermal events, or reload the driver or reset the GPU, if you need it.",
          "", "", _BG, ""),
    164: ("PSHC_LOW_LIFETIME", "Power smoothing circuitry near the end of its life", "hardware",
          "Power smoothing will soon be disabled: decide whether the site can take the power "
          "swings, or plan to replace the GPU.", "", "", _BG, ""),
    165: ("PSHC_ZERO_LIFETIME", "Power smoothing circuitry worn out", "hardware",
          "Power smoothing is disabled and power swings will occur: make sure the site can "
          "absorb them, or replace the GPU.", "", "", _BG, ""),
    166: ("NVLINK_SECURE_CRYPTO_ERR", "NVLink traffic before link encryption was set up",
          "driver", "Confidential computing mode only: check the NVLink encryption set-up; "
          "report it if it repeats.", "", "", _BG, ""),
    167: ("PCIE_FATAL_TIMEOUT", "PCIe fatal timeout", "hardware", None, "", "", _HBG, ""),
    168: ("REDUCED_GPU_MEMORY_CAPACITY", "Errors in GPU write-protected memory region",
          "hardware", "GPU memory capacity is reduced (seen with ECC off): enable ECC so that "
          "rows can be remapped.", "", "", _ALL, ""),
    169: ("SEC2_HALT_ERROR", "Internal micro-controller (SEC2) halt", "hardware", None,
          "", "", _HBG, ""),
    170: ("NVLINK_SECURE_OTHER", "NVLink interrupt in confidential computing mode", "driver",
          "Confidential computing mode only: report it if it repeats.", "", "", _BG, ""),
    171: ("UNCORRECTABLE_DRAM_ERROR", "Uncorrectable DRAM error (details of Xid 48)",
          "hardware", None, "", "", _ALL, ""),
    172: ("UNCORRECTABLE_SRAM_ERROR", "Uncorrectable SRAM error (details of Xid 48)",
          "hardware", None, "", "", _ALL, ""),
}

# Codes NVIDIA lists as unused on Ampere and newer (retired, or Volta and older): code:
# (mnemonic, what it named, investigatory). Their immediate resolution is CONTACT_SUPPORT.
_UNUSED: dict[int, tuple[str, str, str]] = {
    1: ("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "FIFO method error", ""),
    2: ("ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "FIFO software method error", ""),
    3: ("ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "FIFO unknown method", ""),
    4: ("ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "FIFO channel busy", ""),
    5: ("ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "FIFO runout overflow", ""),
    6: ("ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "FIFO parse error", ""),
    7: ("ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "FIFO page table entry error", ""),
    9: ("ROBUST_CHANNEL_GR_ERROR_INSTANCE", "Graphics engine instance error", ""),
    10: ("ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "Graphics engine single-step error", ""),
    12: ("ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "Graphics engine software method error", ""),
    15: ("ROBUST_CHANNEL_SCANLINE_TIMEOUT", "Display scanline timeout", ""),
    16: ("ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Display vertical blank callback timeout",
         "CONTACT_SUPPORT"),
    17: ("ROBUST_CHANNEL_PARAMETER_ERROR", "Channel parameter error", ""),
    18: ("ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "Bus master timeout", ""),
    19: ("ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "Display missed notifier", ""),
    20: ("ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "MPEG engine software method error", ""),
    21: ("ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "Motion estimation software method error", ""),
    22: ("ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "Video processor software method error", ""),
    23: ("ROBUST_CHANNEL_RC_LOGGING_ENABLED", "Channel error logging enabled", ""),
    24: ("ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "Graphics engine semaphore timeout", ""),
    26: ("ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "FIFO framebuffer state timeout", ""),
    27: ("ROBUST_CHANNEL_VP_ERROR", "Video processor error", ""),
    28: ("ROBUST_CHANNEL_VP2_ERROR", "Video processor 2 error", ""),
    29: ("ROBUST_CHANNEL_BSP_ERROR", "Video bitstream processor error", ""),
    30: ("ROBUST_CHANNEL_BAD_ADDR_ACCESS", "Bad address access", ""),
    33: ("ROBUST_CHANNEL_SEC_ERROR", "Security engine error", ""),
    34: ("ROBUST_CHANNEL_MSVLD_ERROR", "Video decoder (MSVLD) error", ""),
    35: ("ROBUST_CHANNEL_MSPDEC_ERROR", "Video decoder (MSPDEC) error", ""),
    36: ("ROBUST_CHANNEL_MSPPP_ERROR", "Video post-processor (MSPPP) error", ""),
    42: ("ROBUST_CHANNEL_VIC_ERROR", "Video image compositor error", ""),
    47: ("ROBUST_CHANNEL_NVENC0_ERROR", "Video encoder 0 error", ""),
    49: ("SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "Quiet-mode level set by registry",
         ""),
    50: ("SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR",
         "Quiet-mode level change after a channel error", ""),
    51: ("SILENT_RUNNING_STRESS_TEST_FAILURE", "Quiet-mode stress test failure", ""),
    52: ("SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE",
         "Quiet-mode level change after a temperature rise", ""),
    53: ("SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "Clocks reduced for temperature", ""),
    55: ("SILENT_RUNNING_TEMPERATURE_READ_ERROR", "Temperature read error", ""),
    56: ("DISPLAY_CHANNEL_EXCEPTION", "Display channel exception", ""),
    57: ("FB_LINK_TRAINING_FAILURE_ERROR", "Framebuffer link training failure", ""),
    58: ("FB_MEMORY_ERROR", "Framebuffer memory error", ""),
    59: ("PMU_ERROR", "Internal micro-controller (PMU) error", ""),
    61: ("PMU_BREAKPOINT", "Internal micro-controller breakpoint", ""),
    65: ("ROBUST_CHANNEL_NVENC1_ERROR", "Video encoder 1 error", ""),
    73: ("ROBUST_CHANNEL_NVENC2_ERROR", "Video encoder 2 error", ""),
    81: ("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "VGA subsystem error", ""),
    87: ("NVTELEMETRY_DRIVER_REPORT", "Driver telemetry report", ""),
    90: ("LTC_ERROR", "L2 cache (LTC) error", ""),
    91: ("RESERVED_XID", "Reserved code", ""),
    111: ("BUNDLE_ERROR_EVENT", "Bundle error event", ""),
    112: ("DISP_SUPERVISOR_ERROR", "Display supervisor error", ""),
    113: ("DP_LT_FAILURE", "DisplayPort link training failure", ""),
    114: ("HEAD_RG_UNDERFLOW", "Display head raster underflow", ""),
    115: ("CORE_CHANNEL_REGS", "Display core channel registers", ""),
    116: ("WINDOW_CHANNEL_REGS", "Display window channel registers", ""),
    117: ("CURSOR_CHANNEL_REGS", "Display cursor channel registers", ""),
    118: ("HEAD_REGS", "Display head registers", ""),
    122: ("SPI_PMU_RPC_READ_FAIL", "Flash read through the micro-controller failed", ""),
    123: ("SPI_PMU_RPC_WRITE_FAIL", "Flash write through the micro-controller failed", ""),
    124: ("SPI_PMU_RPC_ERASE_FAIL", "Flash erase through the micro-controller failed", ""),
    125: ("INFOROM_FS_ERROR", "InfoROM file system error", ""),
    138: ("ROBUST_CHANNEL_DLA_ERROR", "Deep learning accelerator (DLA) error", ""),
}
_UNUSED_ACTION = ("NVIDIA lists this code as unused on Ampere and newer GPUs: collect "
                  "nvidia-bug-report.sh output and contact your vendor or NVIDIA.")
_CATALOGUE.update({code: (mnemonic, f"{what} (unused on Ampere and newer)", "unknown",
                          _UNUSED_ACTION, "CONTACT_SUPPORT", investigatory, "", "")
                   for code, (mnemonic, what, investigatory) in _UNUSED.items()})

MAX_CODE = (1 << 32) - 1     # the driver prints an Xid as %u

# Recovery actions named by Xid 154 (gpu.c _gpuRecoveryActionName).
RECOVERY_ACTIONS = {"None": (False, False), "GPU Reset Required": (True, False),
                    "Node Reboot Required": (False, True), "Drain P2P": (False, False),
                    "Drain and Reset": (True, False), "Recover IMEX Domain": (False, False)}


def documented_codes() -> tuple[int, ...]:
    """Every code NVIDIA's catalogue documents, in order (those :func:`xid_info` knows)."""
    return tuple(sorted(_CATALOGUE))


def xid_info(code: int) -> XidInfo:
    """The catalogue entry of an Xid; an honest "unknown" entry for codes not in it.

    >>> xid_info(79).title
    'GPU has fallen off the bus'
    >>> (xid_info(95).immediate, xid_info(95).gpu_reset)
    ('RESET_GPU', True)
    >>> xid_info(9999).origin
    'unknown'
    >>> xid_info(10 ** 5000).title
    'Xid code out of range (not one the driver prints)'
    """
    if code in _CATALOGUE:
        mnemonic, title, origin, action, immediate, investigatory, applies, since = \
            _CATALOGUE[code]
        immediate = OWN_RESOLUTIONS.get(code, (immediate,))[0]
        severity, gpu_reset, reboot, bucket_action = RESOLUTIONS[immediate]
        if immediate == "IGNORE" and investigatory == "IGNORE":
            severity = "info"    # nothing to do now, nothing to look into later
        severity = _OTHER_LEVELS.get(code, (severity,))[0]
        return XidInfo(code, mnemonic, title, severity, origin, action or bucket_action,
                       gpu_reset, reboot, immediate, investigatory, applies, since,
                       CATALOGUE_SOURCE)
    if not 0 <= code <= MAX_CODE:
        # not a code the driver can print (a u32); and str() of a huge int raises
        return XidInfo(code, "UNKNOWN", "Xid code out of range (not one the driver prints)",
                       "warning", "unknown", "Check where the code came from.")
    return XidInfo(code, "UNKNOWN", f"Xid {code} (not in NVIDIA's catalogue nor gpuwhy's)",
                   "warning", "unknown", "Look the code up in NVIDIA's Xid catalogue for your "
                   "driver; it may be newer than gpuwhy's copy.")


# NVIDIA's "XID 144-150 Decode": an NVLink5 Xid's line ends in "(<IntrInfo> <ErrorStatus>
# ...)"; the unit (IntrInfo's low bits), the reason bits 25-20 and the status pick the
# resolution. Rows: (xid, unit, IntrInfo bits 25-20, low bits before R575 (V1), low bits from
# R575 on (V2), ErrorStatus (None: any), resolution, investigatory[, action 2]). Action 2
# (RLW_RXPIPE) applies when the highest of the low bits shown (a 0 there) is set instead.
_NVLINK5_ROWS: tuple[tuple, ...] = (
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x1, "IGNORE", "CONTACT_SUPPORT"),
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x2, "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x4, "IGNORE", "IGNORE"),
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x8, "IGNORE", "CONTACT_SUPPORT"),
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x10, "RESET_GPU", "CONTACT_SUPPORT"),
    (144, "SAW_MVB", "000000", "0000100001", "0000001", 0x20, "IGNORE", "IGNORE"),
    (145, "RLW_CTRL", "000000", "0001100010", "0000011", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x1, "XID_154_EVAL", "CONTACT_SUPPORT"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x2, "XID_154_EVAL", "CONTACT_SUPPORT"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x4,
     "XID_154_EVAL", "CHECK_NVLINK_FAILURE_FLOW"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x8,
     "XID_154_EVAL", "CHECK_NVLINK_FAILURE_FLOW"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x10,
     "XID_154_EVAL", "CHECK_NVLINK_FAILURE_FLOW"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x20,
     "XID_154_EVAL", "CHECK_NVLINK_FAILURE_FLOW"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x40, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x80, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x100, "IGNORE", "IGNORE"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x200, "IGNORE", "IGNORE"),
    (145, "RLW_REMAP", "000000", "0010000010", "0000100", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_RSPCOL", "000000", "0010100010", "0000101", 0x1, "IGNORE", "IGNORE"),
    (145, "RLW_RSPCOL", "000000", "0010100010", "0000101", 0x2, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_RSPCOL", "000000", "0010100010", "0000101", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_RXPIPE", "000000", "00011000010", "00000110", 0x1,
     "IGNORE", "CONTACT_SUPPORT", "RESET_GPU"),
    (145, "RLW_RXPIPE", "000000", "00011000010", "00000110", 0x2,
     "IGNORE", "CONTACT_SUPPORT", "RESET_GPU"),
    (145, "RLW_RXPIPE", "000000", "00011000010", "00000110", 0x4,
     "IGNORE", "CONTACT_SUPPORT", "RESET_GPU"),
    (145, "RLW_RXPIPE", "000000", "0011000010", "0000110", 0x8, "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_RXPIPE", "000000", "0011000010", "0000110", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x1, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x2, "IGNORE", "IGNORE"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x4, "XID_154_EVAL", "IGNORE"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x8, "XID_154_EVAL", "IGNORE"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x10, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x20, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_SRC_TRACK", "000000", "0011100010", "0000111", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x1, "IGNORE", "IGNORE"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x2, "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x10000, "IGNORE", "IGNORE"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x20000,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x100000,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (145, "RLW_TAGSTATE", "000000", "0100000010", "0001000", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_CTRL", "000000", "0100100011", "0001001", 0x1, "IGNORE", "IGNORE"),
    (146, "TLW_CTRL", "000000", "0100100011", "0001001", 0x2, "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_CTRL", "000000", "0100100011", "0001001", 0x4, "RESET_GPU", "CONTACT_SUPPORT"),
    (146, "TLW_CTRL", "000000", "0100100011", "0001001", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE0", "000000", "0101000011", "0001010", 0x1, "IGNORE", "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE0", "000000", "0101000011", "0001010", 0x2,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE0", "000000", "0101000011", "0001010", 0x4,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE0", "000000", "0101000011", "0001010", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE1", "000000", "0101000011", "0001011", 0x1, "IGNORE", "IGNORE"),
    (146, "TLW_RX/TLW_RX_PIPE1", "000000", "0101000011", "0001011", 0x2,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE1", "000000", "0101000011", "0001011", 0x4,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (146, "TLW_RX/TLW_RX_PIPE1", "000000", "0101000011", "0001011", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE0", "000000", "0101100011", "0001100", 0x1, "IGNORE", "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE0", "000000", "0101100011", "0001100", 0x2,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE0", "000000", "0101100011", "0001100", 0x4,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE0", "000000", "0101100011", "0001100", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE1", "000000", "0101100011", "0001101", 0x1, "IGNORE", "IGNORE"),
    (146, "TLW_TX/TLW_TX_PIPE1", "000000", "0101100011", "0001101", 0x2,
     "IGNORE", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE1", "000000", "0101100011", "0001101", 0x4,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (146, "TLW_TX/TLW_TX_PIPE1", "000000", "0101100011", "0001101", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (147, "TREX", "000000", "0110000100", "0001110", 0x1, "IGNORE", "CONTACT_SUPPORT"),
    (147, "TREX", "000000", "0110000100", "0001110", 0x80000000, "IGNORE", "CONTACT_SUPPORT"),
    (148, "NVLPW_CTRL/NVLPW", "000000", "0000000101", "0001111", 0x80000000,
     "IGNORE", "CONTACT_SUPPORT"),
    (149, "NETIR/NETIR_INT", "000000", "0000000110", "0011000", None,
     "RESET_GPU", "SYMPATHETIC_REPORT_SOLO"),
    (149, "NETIR_BER_EVENT", "000000", "1000100110", "0010011", 0x0,
     "IGNORE", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_BER_EVENT", "000000", "1000100110", "0010011", 0x1,
     "IGNORE", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_BER_EVENT", "000000", "1000100110", "0010011", 0x2,
     "IGNORE", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_BER_EVENT", "000000", "1000100110", "0010011", 0x3,
     "IGNORE", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "000000", "0111000110", "0010001", None,
     "RESET_GPU", "SYMPATHETIC_REPORT_SOLO"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "000001", "0111000110", "0010001", None,
     "RESET_GPU", "REPORT_ISSUE (if seen >1 per day)"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "000010", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "000100", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "001010", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_LINK_SI"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "001111", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_SW_USER"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "010000", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_SW_USER_LINK_SI"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "010001", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_SW_USER"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "010010", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_SW_USER_LINK_SI"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "010101", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "010110", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_SW_USER"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100000", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100001", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100010", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100011", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100100", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100101", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_PEER_DEVICE"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "100110", "0111000110", "0010001", None,
     "IGNORE", "INVESTIGATE_SW/USER"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "101000", "0111000110", "0010001", None,
     "IGNORE", "INVESTIGATE_HOST"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "101010", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "101011", "0111000110", "0010001", None,
     "RESET_GPU", "INVESTIGATE_LINK_SI_AND_CABLES"),
    (149, "NETIR_MFDE_EVENT", "000000", "1001000110", "0010100", 0x1,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (149, "NETIR_MFDE_EVENT", "000000", "1001000110", "0010100", 0x3, "IGNORE", "IGNORE"),
    (149, "NETIR_MFDE_EVENT", "000000", "1001000110", "0010100", 0x4,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (149, "NETIR_MFDE_EVENT", "000000", "1001000110", "0010100", 0x5,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (149, "NETIR_MFDE_EVENT", "000000", "1001000110", "0010100", 0x7,
     "RESET_GPU", "CONTACT_SUPPORT"),
    (150, "MSE_WATCHDOG", "000000", "0000000000", "0000000", 0x0, "RESET_GPU", "CONTACT_SUPPORT"),
    (150, "MSE Degraded", "000000", "0000000000", "0000000", 0xFFFFFFFF,
     "RESET_GPU", "CONTACT_SUPPORT"),
)


@dataclass(frozen=True)
class Nvlink5Rule:
    """One row of NVIDIA's NVLink5 decode: a unit's IntrInfo masks (32 characters, most
    significant bit first, ``-``: any) and the resolution for one ErrorStatus."""

    xid: int
    unit: str
    intrinfo_v1: str
    intrinfo_v2: str
    error_status: int | None
    resolution: str
    investigatory: str
    action2_v1: str = ""
    action2_v2: str = ""
    action2: str = ""


def _mask(reason: str, low: str) -> str:
    return "------" + reason + "-" * (20 - len(low)) + low


def _with_bit(mask: str, bit: int) -> str:
    at = 31 - bit
    return mask[:at] + "1" + mask[at + 1:]


def _rule(xid: int, unit: str, reason: str, v1: str, v2: str, status: int | None,
          resolution: str, investigatory: str, action2: str = "") -> Nvlink5Rule:
    m1, m2 = _mask(reason, v1), _mask(reason, v2)
    # the action-2 decode sets the highest of the low bits the row names (a 0 in its own)
    return Nvlink5Rule(xid, unit, m1, m2, status, resolution, investigatory,
                       _with_bit(m1, len(v1) - 1) if action2 else "",
                       _with_bit(m2, len(v2) - 1) if action2 else "", action2)


NVLINK5_RULES: tuple[Nvlink5Rule, ...] = tuple(_rule(*row) for row in _NVLINK5_ROWS)


def _matches(mask: str, bits: str) -> bool:
    return bool(mask) and all(m in ("-", b) for m, b in zip(mask, bits, strict=True))


def nvlink5_decode(code: int, intrinfo: int, error_status: int) -> tuple[str, str, str] | None:
    """NVIDIA's resolution of an NVLink5 Xid (144-150) line: ``(unit, resolution,
    investigatory)`` from the line's first two hex words, or None when no row fits or the rows
    that fit disagree. Either message version (before or from R575) is recognised; where the
    older one does not tell two units apart (the TLW pipes) both are named.

    >>> nvlink5_decode(149, 0x000fe406, 0)
    ('NETIR/NETIR_INT', 'RESET_GPU', 'SYMPATHETIC_REPORT_SOLO')
    >>> nvlink5_decode(144, 0x1, 0x8)[1]
    'IGNORE'
    """
    bits = format(intrinfo & 0xFFFFFFFF, "032b")
    units: dict[str, None] = {}     # in the sheet's order, once each
    found = set()
    for rule in NVLINK5_RULES:
        if rule.xid != code or rule.error_status not in (None, error_status):
            continue
        if _matches(rule.action2_v1, bits) or _matches(rule.action2_v2, bits):
            found.add((rule.action2, rule.investigatory))
        elif _matches(rule.intrinfo_v1, bits) or _matches(rule.intrinfo_v2, bits):
            found.add((rule.resolution, rule.investigatory))
        else:
            continue
        units[rule.unit] = None
    if len(found) != 1:
        return None
    (resolution, investigatory), = found
    return " or ".join(units), resolution, investigatory


_HEX_WORD = re.compile(r"0x[0-9a-fA-F]{1,8}\Z")


def _word(value: object) -> int | None:
    if isinstance(value, str) and _HEX_WORD.match(value):
        return int(value, 16)
    return None


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
    """Catalogue fields for a parsed kernel-log record: the Xid's or SXid's entry, with what
    the line itself says where the catalogue asks for it: the new recovery action of an Xid
    154, and the decoded unit and status of an NVLink5 Xid (144-150) whose line carries its
    IntrInfo and ErrorStatus words (``intrinfo``/``error_status`` in ``details``)."""
    details = details or {}
    if kind == "xid" and code is not None:
        fields = xid_info(code).as_fields()
        action = details.get("recovery_to")
        if code == 154 and action in RECOVERY_ACTIONS:
            fields["gpu_reset"], fields["reboot"] = RECOVERY_ACTIONS[action]
            fields["severity"] = "info" if action == "None" else "critical"
        intrinfo, status = _word(details.get("intrinfo")), _word(details.get("error_status"))
        if fields["immediate"] == "WORKFLOW_NVLINK5_ERR" and intrinfo is not None \
                and status is not None:
            decoded = nvlink5_decode(code, intrinfo, status)
            if decoded:
                unit, resolution, investigatory = decoded
                severity, gpu_reset, reboot, how = RESOLUTIONS[resolution]
                fields.update(severity=severity, gpu_reset=gpu_reset, reboot=reboot,
                              action=f"NVLink5 {unit}: {how}", immediate=resolution,
                              investigatory=investigatory, nvlink5_unit=unit)
        return fields
    if kind == "sxid" and code is not None:
        return sxid_info(code, details.get("fatal")).as_fields()
    if kind == "fallen_off_bus":
        return xid_info(79).as_fields()
    return {}
