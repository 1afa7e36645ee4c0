"""NVIDIA driver ioctl command numbers and their names (x86-64), from the driver's own headers.

Frontend escapes on /dev/nvidiactl and /dev/nvidiaN are ``_IOWR('F', nr, size)``; only
``nr`` and ``size`` matter to the driver, and some sizes changed between driver versions,
so names are looked up by ``nr``. UVM commands on /dev/nvidia-uvm are bare numbers with
no ``_IOC`` encoding: they can only be told apart by the device they are sent on.
"""

from __future__ import annotations

import enum
import typing

NV_IOCTL_MAGIC = 0x46  # 'F'

ESCAPES: dict[int, str] = {
    0x27: "NV_ESC_RM_ALLOC_MEMORY", 0x28: "NV_ESC_RM_ALLOC_OBJECT", 0x29: "NV_ESC_RM_FREE",
    0x2A: "NV_ESC_RM_CONTROL", 0x2B: "NV_ESC_RM_ALLOC", 0x34: "NV_ESC_RM_DUP_OBJECT",
    0x35: "NV_ESC_RM_SHARE", 0x39: "NV_ESC_RM_I2C_ACCESS", 0x41: "NV_ESC_RM_IDLE_CHANNELS",
    0x4A: "NV_ESC_RM_VID_HEAP_CONTROL", 0x4D: "NV_ESC_RM_ACCESS_REGISTRY",
    0x4E: "NV_ESC_RM_MAP_MEMORY", 0x4F: "NV_ESC_RM_UNMAP_MEMORY",
    0x52: "NV_ESC_RM_GET_EVENT_DATA", 0x54: "NV_ESC_RM_ALLOC_CONTEXT_DMA2",
    0x57: "NV_ESC_RM_MAP_MEMORY_DMA", 0x58: "NV_ESC_RM_UNMAP_MEMORY_DMA",
    0x59: "NV_ESC_RM_BIND_CONTEXT_DMA", 0x5E: "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO",
    0x5F: "NV_ESC_RM_LOCKLESS_DIAGNOSTIC", 0xC8: "NV_ESC_CARD_INFO",
    0xC9: "NV_ESC_REGISTER_FD", 0xCE: "NV_ESC_ALLOC_OS_EVENT", 0xCF: "NV_ESC_FREE_OS_EVENT",
    0xD1: "NV_ESC_STATUS_CODE", 0xD2: "NV_ESC_CHECK_VERSION_STR",
    0xD3: "NV_ESC_IOCTL_XFER_CMD", 0xD4: "NV_ESC_ATTACH_GPUS_TO_FD",
    0xD5: "NV_ESC_QUERY_DEVICE_INTR", 0xD6: "NV_ESC_SYS_PARAMS", 0xD7: "NV_ESC_NUMA_INFO",
    0xD8: "NV_ESC_SET_NUMA_STATUS", 0xD9: "NV_ESC_EXPORT_TO_DMABUF_FD",
    0xDA: "NV_ESC_WAIT_OPEN_COMPLETE",
}

UVM_COMMANDS: dict[int, str] = {
    0x30000001: "UVM_INITIALIZE", 0x30000002: "UVM_DEINITIALIZE",
    23: "UVM_CREATE_RANGE_GROUP", 24: "UVM_DESTROY_RANGE_GROUP",
    25: "UVM_REGISTER_GPU_VASPACE", 26: "UVM_UNREGISTER_GPU_VASPACE",
    27: "UVM_REGISTER_CHANNEL", 28: "UVM_UNREGISTER_CHANNEL", 29: "UVM_ENABLE_PEER_ACCESS",
    30: "UVM_DISABLE_PEER_ACCESS", 31: "UVM_SET_RANGE_GROUP",
    33: "UVM_MAP_EXTERNAL_ALLOCATION", 34: "UVM_FREE", 35: "UVM_MEM_MAP",
    37: "UVM_REGISTER_GPU", 38: "UVM_UNREGISTER_GPU", 39: "UVM_PAGEABLE_MEM_ACCESS",
    40: "UVM_PREVENT_MIGRATION_RANGE_GROUPS", 41: "UVM_ALLOW_MIGRATION_RANGE_GROUPS",
    42: "UVM_SET_PREFERRED_LOCATION", 43: "UVM_UNSET_PREFERRED_LOCATION",
    44: "UVM_ENABLE_READ_DUPLICATION", 45: "UVM_DISABLE_READ_DUPLICATION",
    46: "UVM_SET_ACCESSED_BY", 47: "UVM_UNSET_ACCESSED_BY", 51: "UVM_MIGRATE",
    53: "UVM_MIGRATE_RANGE_GROUP", 56: "UVM_TOOLS_INIT_EVENT_TRACKER",
    57: "UVM_TOOLS_SET_NOTIFICATION_THRESHOLD", 58: "UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS",
    59: "UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS", 60: "UVM_TOOLS_ENABLE_COUNTERS",
    61: "UVM_TOOLS_DISABLE_COUNTERS", 62: "UVM_TOOLS_READ_PROCESS_MEMORY",
    63: "UVM_TOOLS_WRITE_PROCESS_MEMORY", 64: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE",
    65: "UVM_MAP_DYNAMIC_PARALLELISM_REGION", 66: "UVM_UNMAP_EXTERNAL",
    67: "UVM_TOOLS_FLUSH_EVENTS", 68: "UVM_ALLOC_SEMAPHORE_POOL",
    69: "UVM_CLEAN_UP_ZOMBIE_RESOURCES", 70: "UVM_PAGEABLE_MEM_ACCESS_ON_GPU",
    71: "UVM_POPULATE_PAGEABLE", 72: "UVM_VALIDATE_VA_RANGE",
    73: "UVM_CREATE_EXTERNAL_RANGE", 74: "UVM_MAP_EXTERNAL_SPARSE", 75: "UVM_MM_INITIALIZE",
    76: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", 77: "UVM_TOOLS_GET_PROCESSOR_UUID_TABLE_V2",
    78: "UVM_ALLOC_DEVICE_P2P", 79: "UVM_CLEAR_ALL_ACCESS_COUNTERS", 80: "UVM_DISCARD",
    2047: "UVM_IS_8_SUPPORTED",
}

UVM_DEVICES = ("nvidia-uvm", "nvidia-uvm-tools")


def iowr(nr: int, size: int, magic: int = NV_IOCTL_MAGIC) -> int:
    """``_IOWR(magic, nr, size)`` as the Linux x86-64 headers define it.

    >>> hex(iowr(0x2A, 32))   # NV_ESC_RM_CONTROL with NVOS54_PARAMETERS
    '0xc020462a'
    """
    return (3 << 30) | ((size & 0x3FFF) << 16) | (magic << 8) | nr


def ioctl_name(cmd: int, device: str) -> str:
    """The driver's name for ``cmd`` sent on ``device`` (a kind from classify_device)."""
    if device in UVM_DEVICES:
        return UVM_COMMANDS.get(cmd, f"UVM_{cmd}")
    if (cmd >> 8) & 0xFF == NV_IOCTL_MAGIC:
        name = ESCAPES.get(cmd & 0xFF)
        if name:
            return name
    return f"0x{cmd:08x}"

RM_CLASSES: dict[int, str] = {
    0x0000: "NV01_ROOT", 0x0001: "NV01_ROOT_NON_PRIV", 0x0041: "NV01_ROOT_CLIENT",
    0x0002: "NV01_CONTEXT_DMA", 0x0005: "NV01_EVENT", 0x0078: "NV01_EVENT_KERNEL_CALLBACK",
    0x0079: "NV01_EVENT_OS_EVENT", 0x007E: "NV01_EVENT_KERNEL_CALLBACK_EX",
    0x0080: "NV01_DEVICE_0", 0x2080: "NV20_SUBDEVICE_0", 0x2081: "NV2081_BINAPI",
    0x208F: "NV20_SUBDEVICE_DIAG", 0x003E: "NV01_MEMORY_SYSTEM",
    0x003F: "NV01_MEMORY_LOCAL_PRIVILEGED", 0x0040: "NV01_MEMORY_LOCAL_USER",
    0x0070: "NV01_MEMORY_VIRTUAL", 0x0071: "NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
    0x00C2: "NV01_MEMORY_LOCAL_PHYSICAL", 0x00DA: "NV_SEMAPHORE_SURFACE",
    0x00DE: "RM_USER_SHARED_DATA", 0x00E0: "NV_MEMORY_EXPORT", 0x00F1: "NV_IMEX_SESSION",
    0x00F8: "NV_MEMORY_FABRIC", 0x00FD: "NV_MEMORY_MULTICAST_FABRIC",
    0x50A0: "NV50_MEMORY_VIRTUAL", 0x503B: "NV50_P2P", 0x503C: "NV50_THIRD_PARTY_P2P",
    0x83DE: "GT200_DEBUGGER", 0x900E: "MPS_COMPUTE", 0x9067: "FERMI_CONTEXT_SHARE_A",
    0x90F1: "FERMI_VASPACE_A", 0xA06C: "KEPLER_CHANNEL_GROUP_A",
    0xA06F: "KEPLER_CHANNEL_GPFIFO_A", 0xC36F: "VOLTA_CHANNEL_GPFIFO_A",
    0xC46F: "TURING_CHANNEL_GPFIFO_A", 0xC56F: "AMPERE_CHANNEL_GPFIFO_A",
    0xC86F: "HOPPER_CHANNEL_GPFIFO_A", 0xC96F: "BLACKWELL_CHANNEL_GPFIFO_A",
    0xCA6F: "BLACKWELL_CHANNEL_GPFIFO_B", 0xC361: "VOLTA_USERMODE_A",
    0xC461: "TURING_USERMODE_A", 0xC561: "AMPERE_USERMODE_A", 0xC661: "HOPPER_USERMODE_A",
    0xC761: "BLACKWELL_USERMODE_A", 0xC3C0: "VOLTA_COMPUTE_A", 0xC5C0: "TURING_COMPUTE_A",
    0xC6C0: "AMPERE_COMPUTE_A", 0xC7C0: "AMPERE_COMPUTE_B", 0xC9C0: "ADA_COMPUTE_A",
    0xCBC0: "HOPPER_COMPUTE_A", 0xCDC0: "BLACKWELL_COMPUTE_A", 0xC3B5: "VOLTA_DMA_COPY_A",
    0xC5B5: "TURING_DMA_COPY_A", 0xC6B5: "AMPERE_DMA_COPY_A", 0xC7B5: "AMPERE_DMA_COPY_B",
    0xC8B5: "HOPPER_DMA_COPY_A", 0xC9B5: "BLACKWELL_DMA_COPY_A",
    0xC637: "AMPERE_SMC_PARTITION_REF", 0xC638: "AMPERE_SMC_EXEC_PARTITION_REF",
    0xC639: "AMPERE_SMC_CONFIG_SESSION", 0xC640: "AMPERE_SMC_MONITOR_SESSION",
    0x90E6: "GF100_SUBDEVICE_MASTER",
    0xC574: "UVM_CHANNEL_RETAINER", 0xCB33: "NV_CONFIDENTIAL_COMPUTE",
}
MEMORY_CLASSES = frozenset({0x003E, 0x0040, 0x50A0})   # NV_MEMORY_ALLOCATION_PARAMS.size

RM_CONTROLS: dict[int, str] = {
    0x00000101: "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION",
    0x0000013E: "NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2",
    0x00000201: "NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS",
    0x00000202: "NV0000_CTRL_CMD_GPU_GET_ID_INFO", 0x00000205: "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
    0x00000214: "NV0000_CTRL_CMD_GPU_GET_PROBED_IDS",
    0x00000215: "NV0000_CTRL_CMD_GPU_ATTACH_IDS", 0x00000216: "NV0000_CTRL_CMD_GPU_DETACH_IDS",
    0x0000021B: "NV0000_CTRL_CMD_GPU_GET_PCI_INFO",
    0x00000274: "NV0000_CTRL_CMD_GPU_GET_UUID_INFO",
    0x00000278: "NV0000_CTRL_CMD_GPU_MODIFY_DRAIN_STATE",
    0x00000279: "NV0000_CTRL_CMD_GPU_QUERY_DRAIN_STATE",
    0x00000607: "NV0000_CTRL_CMD_NVD_GET_RCERR_RPT",
    0x00800102: "NV0080_CTRL_CMD_BIF_RESET",
    0x00800201: "NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
    0x00800292: "NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2",
    0x00800280: "NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES",
    0x20800102: "NV2080_CTRL_CMD_GPU_GET_INFO_V2",
    0x20800110: "NV2080_CTRL_CMD_GPU_GET_NAME_STRING",
    0x2080012F: "NV2080_CTRL_CMD_GPU_QUERY_ECC_STATUS",
    0x20800136: "NV2080_CTRL_CMD_GPU_RESET_ECC_ERROR_STATUS",
    0x2080014A: "NV2080_CTRL_CMD_GPU_GET_GID_INFO",
    0x2080018D: "NV2080_CTRL_CMD_GPU_GET_PIDS", 0x2080018E: "NV2080_CTRL_CMD_GPU_GET_PID_INFO",
    0x208001A9: "NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET",
    0x208001AA: "NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_RESET",
    0x208001AB: "NV2080_CTRL_CMD_GPU_GET_RESET_STATUS",
    0x208001AC: "NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET",
    0x208001AD: "NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_DRAIN_AND_RESET",
    0x208001AE: "NV2080_CTRL_CMD_GPU_GET_DRAIN_AND_RESET_STATUS",
    0x208001B2: "NV2080_CTRL_CMD_GPU_GET_RECOVERY_ACTION",
    0x20800301: "NV2080_CTRL_CMD_EVENT_SET_NOTIFICATION",
    0x20801201: "NV2080_CTRL_CMD_GR_GET_INFO", 0x2080122B: "NV2080_CTRL_CMD_GR_GET_TPC_MASK",
    0x20801301: "NV2080_CTRL_CMD_FB_GET_INFO", 0x20801303: "NV2080_CTRL_CMD_FB_GET_INFO_V2",
    0x20801801: "NV2080_CTRL_CMD_BUS_GET_PCI_INFO", 0x2080200A: "NV2080_CTRL_CMD_PERF_BOOST",
    0x20802068: "NV2080_CTRL_CMD_PERF_GET_CURRENT_PSTATE",
    0x20802205: "NV2080_CTRL_CMD_RC_GET_ERROR_COUNT", 0x20802206: "NV2080_CTRL_CMD_RC_GET_ERROR",
    0x20802207: "NV2080_CTRL_CMD_RC_SET_CLEAN_ERROR_HISTORY",
    0x20802213: "NV2080_CTRL_CMD_RC_GET_ERROR_V2",
    0x20803400: "NV2080_CTRL_CMD_ECC_GET_CLIENT_EXPOSED_COUNTERS",
    0x20803401: "NV2080_CTRL_CMD_ECC_GET_VOLATILE_COUNTS",
    0xA06C0101: "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE", 0xA06C0102: "NVA06C_CTRL_CMD_BIND",
    0xA06C0105: "NVA06C_CTRL_CMD_PREEMPT",
    0xC36F0108: "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
    0x906F0102: "NV906F_CTRL_CMD_RESET_CHANNEL",
}

# Controls reported one by one, whatever the thresholds: resets, drains, recovery, ECC,
# GPU attach/detach — what an incident chain is built from.
NOTABLE_CONTROLS = frozenset({
    0x00000215, 0x00000216, 0x00000278, 0x00800102, 0x20800136, 0x208001A9, 0x208001AA,
    0x208001AB, 0x208001AC, 0x208001AD, 0x208001AE, 0x208001B2, 0x20802207, 0x2080012F,
    0x20803401, 0x906F0102,
})

RM_STATUS: dict[int, str] = {
    0x00: "NV_OK", 0x0B: "NV_ERR_ECC_ERROR", 0x0F: "NV_ERR_GPU_IS_LOST",
    0x10: "NV_ERR_GPU_IN_FULLCHIP_RESET", 0x16: "NV_ERR_ILLEGAL_ACTION", 0x17: "NV_ERR_IN_USE",
    0x1A: "NV_ERR_INSUFFICIENT_RESOURCES", 0x1B: "NV_ERR_INSUFFICIENT_PERMISSIONS",
    0x1F: "NV_ERR_INVALID_ARGUMENT", 0x22: "NV_ERR_INVALID_CLASS",
    0x33: "NV_ERR_INVALID_OBJECT_HANDLE", 0x40: "NV_ERR_INVALID_STATE",
    0x51: "NV_ERR_NO_MEMORY", 0x56: "NV_ERR_NOT_SUPPORTED", 0x60: "NV_ERR_RC_ERROR",
    0x62: "NV_ERR_RESET_REQUIRED", 0x65: "NV_ERR_TIMEOUT", 0xFFFF: "NV_ERR_GENERIC",
}

# --- what the probe reads from each call's parameter struct -----------------------------
# The one definition: fdtrack.bpf.c gets these as F_<NAME> (probes/fdtrack.py, bpf_defines()).


class DecodeFlag(enum.IntFlag):
    """What the probe does with a call's fields (``Decode.flags``, bits 0-15)."""

    NOTABLE = 1 << 0       # report every call of this operation
    SUB_ARG0 = 1 << 1      # arg0 names the sub-operation (RM class, control cmd, heap function)
    BYTES_ARG1 = 1 << 2    # arg1 is a byte count
    LIMIT_ARG1 = 1 << 3    # arg1 is a limit (bytes - 1)
    ALLOC_PARAMS = 1 << 4  # arg1 points to alloc params; memory classes hold the size there
    VERSION = 1 << 5       # a version string in the struct (CHECK_VERSION_STR)
    GPU_IDS = 1 << 6       # an array of u32 GPU ids fills the struct (ATTACH_GPUS_TO_FD)
    XFER = 1 << 7          # NV_ESC_IOCTL_XFER_CMD: {u32 cmd, u32 size, u64 ptr} wraps the call
    HEAP_ALLOC = 1 << 8    # arg1 is a byte count only when arg0 is an ALLOC heap function
    NOTABLE_SUB = 1 << 9   # report the call when arg0 is in the notable-controls set


# The short names the tables below use.
F_NOTABLE = DecodeFlag.NOTABLE
F_SUB_ARG0 = DecodeFlag.SUB_ARG0
F_BYTES_ARG1 = DecodeFlag.BYTES_ARG1
F_LIMIT_ARG1 = DecodeFlag.LIMIT_ARG1
F_ALLOC_PARAMS = DecodeFlag.ALLOC_PARAMS
F_VERSION = DecodeFlag.VERSION
F_GPU_IDS = DecodeFlag.GPU_IDS
F_XFER = DecodeFlag.XFER
F_HEAP_ALLOC = DecodeFlag.HEAP_ALLOC
F_NOTABLE_SUB = DecodeFlag.NOTABLE_SUB

# Fixed places in the structs of a few calls (x86-64).
ALLOC_PARAMS_SIZE_OFFSET = 64    # NV_MEMORY_ALLOCATION_PARAMS.size (the MEMORY_CLASSES)
VERSION_STRING_OFFSET = 8        # nv_ioctl_rm_api_version_t.versionString
VERSION_STRING_LEN = 64          # NV_RM_API_VERSION_STRING_LENGTH

NO_FIELD = (-1, 0)


class Decode(typing.NamedTuple):
    """Where the probe finds a call's fields: offsets in the parameter struct, or -1."""

    status: int = -1
    arg0: tuple[int, int] = NO_FIELD      # (offset, 4 or 8 bytes)
    arg1: tuple[int, int] = NO_FIELD
    flags: int = 0


# Frontend escapes by (nr, size); size 0 is the layout used for any other size. The
# offsets are the reference's, for x86-64; layouts that moved are told apart by size.
FRONTEND_DECODE: dict[tuple[int, int], Decode] = {
    (0x27, 0): Decode(40, (12, 4), (32, 8), F_SUB_ARG0 | F_LIMIT_ARG1),        # ALLOC_MEMORY
    (0x29, 0): Decode(12, (8, 4)),                                            # RM_FREE
    (0x2A, 0): Decode(28, (8, 4), (24, 4), F_SUB_ARG0 | F_NOTABLE_SUB),       # RM_CONTROL
    (0x2B, 32): Decode(28, (12, 4), (16, 8), F_SUB_ARG0 | F_ALLOC_PARAMS),    # NVOS21 >= 535
    (0x2B, 40): Decode(36, (12, 4), (16, 8), F_SUB_ARG0 | F_ALLOC_PARAMS),    # NVOS64 525-530
    (0x2B, 48): Decode(40, (12, 4), (16, 8), F_SUB_ARG0 | F_ALLOC_PARAMS),    # NVOS64 >= 535
    (0x34, 0): Decode(24, (16, 4)),                                           # DUP_OBJECT
    (0x4A, 0): Decode(20, (8, 4), (88, 8), F_SUB_ARG0 | F_HEAP_ALLOC),        # VID_HEAP_CONTROL
    (0x4E, 0): Decode(40, (8, 4), (24, 8), F_BYTES_ARG1),                     # MAP_MEMORY
    (0x4F, 0): Decode(24, (8, 4)),                                            # UNMAP_MEMORY
    (0x52, 0): Decode(12),                                                    # GET_EVENT_DATA
    (0x57, 64): Decode(56, (12, 4), (24, 8), F_BYTES_ARG1),                   # MAP_MEMORY_DMA
    (0x57, 56): Decode(48, (12, 4), (24, 8), F_BYTES_ARG1),                   # (< 580)
    (0x58, 48): Decode(40, (12, 4)),                                          # UNMAP_MEMORY_DMA
    (0x58, 40): Decode(32, (12, 4)),                                          # (< 550)
    (0xC9, 0): Decode(-1, (0, 4)),                                            # REGISTER_FD
    (0xCE, 0): Decode(12), (0xCF, 0): Decode(12),                             # OS events
    (0xD1, 0): Decode(8),                                                     # STATUS_CODE
    (0xD2, 0): Decode(-1, flags=F_VERSION | F_NOTABLE),                       # CHECK_VERSION_STR
    (0xD3, 0): Decode(flags=F_XFER),                                          # IOCTL_XFER_CMD
    (0xD4, 0): Decode(flags=F_GPU_IDS | F_NOTABLE),                           # ATTACH_GPUS_TO_FD
    (0xDA, 0): Decode(0, (4, 4)),                                             # WAIT_OPEN_COMPLETE
}
HEAP_ALLOC_FUNCTIONS = (2, 14, 19)    # ALLOC_SIZE, ALLOC_SIZE_RANGE, HW_ALLOC

# UVM commands by number: offset of rmStatus and the (base, length) pair where there is one.
UVM_DECODE: dict[int, Decode] = {
    0x30000001: Decode(8, (0, 8)),                                    # INITIALIZE (flags)
    23: Decode(8), 24: Decode(8), 25: Decode(28), 26: Decode(16),
    27: Decode(48, (32, 8), (40, 8), F_BYTES_ARG1),                   # REGISTER_CHANNEL
    29: Decode(32, flags=F_NOTABLE), 30: Decode(32, flags=F_NOTABLE),  # peer access
    31: Decode(24), 33: Decode(-1, (0, 8), (8, 8), F_BYTES_ARG1),      # MAP_EXTERNAL_ALLOCATION
    34: Decode(8, (0, 8)),                                            # FREE
    37: Decode(36, flags=F_NOTABLE), 38: Decode(16, flags=F_NOTABLE),  # (UN)REGISTER_GPU
    39: Decode(4), 51: Decode(72, (0, 8), (8, 8), F_BYTES_ARG1),       # MIGRATE
    66: Decode(32, (0, 8), (8, 8), F_BYTES_ARG1),                     # UNMAP_EXTERNAL
    73: Decode(16, (0, 8), (8, 8), F_BYTES_ARG1),                     # CREATE_EXTERNAL_RANGE
    75: Decode(4, (0, 4)), 80: Decode(24, (0, 8), (8, 8), F_BYTES_ARG1),
}


# UVM layouts that changed between drivers. UVM commands carry no size to tell them apart,
# so the probe picks by the loaded driver's version: command -> (the first version with the
# UVM_DECODE layout, the layout before it).
UVM_DECODE_BEFORE: dict[int, tuple[tuple[int, ...], Decode]] = {
    # UVM_FREE_PARAMS lost its length in 590.44.01: {base, length, rmStatus} before, as the
    # real-GPU kit recorded it on 580.159.04 (tests/data/real/h200/nvtrace).
    34: ((590, 44, 1), Decode(16, (0, 8), (8, 8), F_BYTES_ARG1)),
}


def parse_driver_version(text: str) -> tuple[int, ...] | None:
    """The version in ``text``: ``"580.159.04"``, ``/sys/module/nvidia/version``, or the
    first line of ``/proc/driver/nvidia/version``; None when there is none.

    >>> parse_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module  580.159.04  Release")
    (580, 159, 4)
    """
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tuple(int(p) for p in parts)
    return None


def uvm_decode(driver: tuple[int, ...] | None) -> dict[int, Decode]:
    """UVM_DECODE as a driver of version ``driver`` lays its structs out (None: the newest)."""
    table = dict(UVM_DECODE)
    if driver is not None:
        for command, (since, before) in UVM_DECODE_BEFORE.items():
            if driver < since:
                table[command] = before
    return table


def escape_nr(cmd: int) -> int | None:
    """The escape number of a frontend command (``_IOC_NR``), None for a bare UVM number."""
    return cmd & 0xFF if (cmd >> 8) & 0xFF == NV_IOCTL_MAGIC else None


def sub_name(cmd: int, device: str, sub: int) -> str | None:
    """Name of the sub-operation: the RM class of an alloc, the control of an RM_CONTROL."""
    nr = None if device in UVM_DEVICES else escape_nr(cmd)
    if nr in (0x27, 0x2B):
        return RM_CLASSES.get(sub, f"class 0x{sub:04x}")
    if nr == 0x2A:
        return RM_CONTROLS.get(sub, f"control 0x{sub:08x}")
    if nr == 0x4A:
        return {2: "ALLOC_SIZE", 3: "FREE", 5: "INFO", 14: "ALLOC_SIZE_RANGE", 19: "HW_ALLOC",
                20: "HW_FREE", 27: "ALLOC_OS_DESCRIPTOR"}.get(sub, f"function {sub}")
    return None


def status_name(status: int) -> str:
    return RM_STATUS.get(status, f"0x{status:x}")
