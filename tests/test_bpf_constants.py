"""The constants the BPF programs share with Python are defined once, in Python.

Each probe's ``bpf_defines()`` is what its ``.bpf.c`` is compiled with (as ``-D`` flags);
here: that the ``.bpf.c`` files keep no copy of their own, that every generated name is
used, and that the generated values are the ones the Python side uses. The compiled
programs themselves are read back in tests/privileged/test_bpf_constants_compiled.py.
"""

import fcntl
import os
import re
import subprocess
import termios

import pytest

from gpuwhy import nvioctl
from gpuwhy.nvioctl import (
    FRONTEND_DECODE,
    HEAP_ALLOC_FUNCTIONS,
    MEMORY_CLASSES,
    NOTABLE_CONTROLS,
    RM_CONTROLS,
    UVM_DECODE,
    DecodeFlag,
)
from gpuwhy.probes import bpfdefs, fdtable, fdtrack, printk, sched
from gpuwhy.probes import process_events as lifecycle
from gpuwhy.probes.bpfdefs import cflags, macro_name

PROBES = {"fdtrack": fdtrack, "sched": sched, "lifecycle": lifecycle, "printk": printk}


def _c_without_comments(text):
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def _defined_in_c(text):
    """Names a C source defines itself: #define macros and enum members."""
    code = _c_without_comments(text)
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", code, flags=re.M))
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", code):
        names |= {m.split("=")[0].strip() for m in body.split(",") if m.strip()}
    return names


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_bpf_source_keeps_no_copy_of_a_generated_constant(name):
    module = PROBES[name]
    generated = {macro_name(n) for n in module.bpf_defines()}
    assert not generated & _defined_in_c(module.BPF_SOURCE.read_text())


@pytest.mark.parametrize("name", sorted(PROBES))
def test_every_generated_constant_is_used_by_the_bpf_source(name):
    module = PROBES[name]
    code = _c_without_comments(module.BPF_SOURCE.read_text())
    unused = [n for n in module.bpf_defines() if not re.search(rf"\b{macro_name(n)}\b", code)]
    assert unused == []


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_program_is_compiled_with_the_generated_definitions(name):
    module = PROBES[name]
    defines = module.bpf_defines()
    assert module.CFLAGS == cflags(defines)
    assert len({macro_name(n) for n in defines}) == len(defines)
    for flag in module.CFLAGS:
        assert re.fullmatch(r"-D\w+(\(\w+\))?=\S.*", flag), flag


def test_fdtrack_definitions_are_the_python_ones():
    defines = fdtrack.bpf_defines()
    for flag in DecodeFlag:
        assert defines[f"F_{flag.name}"] == flag == getattr(nvioctl, f"F_{flag.name}")
    for flag in fdtrack.CallFlag:
        assert defines[f"CALL_{flag.name}"] == flag
    for event in fdtrack.EventType:
        assert defines[f"EV_{event.name}"] == event
    assert set(fdtrack.FdTrackProbe._handlers) == set(fdtrack.EventType)
    for drop in fdtrack.Drop:
        assert defines[f"DROP_{drop.name}"] == drop
    assert list(fdtrack.DROP_REASONS) == list(fdtrack.Drop)      # one counter each, in order
    assert list(fdtrack.Drop) == list(range(len(fdtrack.Drop)))  # the drops array's slots
    assert defines["N_DROP_REASONS"] == len(fdtrack.DROP_REASONS)
    assert len(set(fdtrack.DROP_REASONS.values())) == len(fdtrack.DROP_REASONS)
    assert defines["NV_IOCTL_MAGIC"] == nvioctl.NV_IOCTL_MAGIC == ord("F")
    assert defines["ALLOC_PARAMS_SIZE_OFFSET"] == nvioctl.ALLOC_PARAMS_SIZE_OFFSET
    assert defines["VERSION_STRING_OFFSET"] == nvioctl.VERSION_STRING_OFFSET
    assert defines["VERSION_STRING_LEN"] == nvioctl.VERSION_STRING_LEN
    assert defines["LAT_BUCKETS"] == fdtable.LAT_BUCKETS
    assert defines["PATH_LEN"] == fdtrack.PATH_LEN
    assert defines["PREFIX_LEN"] == fdtrack.PREFIX_LEN
    assert defines["HINT_SLOTS"] == fdtrack.HINT_SLOTS
    assert defines["DECODE_VARIANTS"] == fdtrack.DECODE_VARIANTS
    assert defines["NOTABLE_HINT_SLOTS"] == fdtrack.NOTABLE_HINT_SLOTS


def test_the_syscall_abi_constants_are_the_hosts():
    for defines in (fdtrack.bpf_defines(), bpfdefs.SYSCALL_DEFINES):
        assert defines["O_CLOEXEC_FLAG"] == os.O_CLOEXEC
        assert defines["F_DUPFD_CMD"] == fcntl.F_DUPFD
        assert defines["F_SETFD_CMD"] == fcntl.F_SETFD
        assert defines["F_DUPFD_CLOEXEC_CMD"] == fcntl.F_DUPFD_CLOEXEC
        assert defines["FD_CLOEXEC_FLAG"] == fcntl.FD_CLOEXEC
        assert defines["FIONCLEX_CMD"] == termios.FIONCLEX
        assert defines["FIOCLEX_CMD"] == termios.FIOCLEX
    assert fdtrack.bpf_defines()["CLONE_THREAD_FLAG"] == 0x00010000
    assert lifecycle.bpf_defines()["CLONE_THREAD_FLAG"] == 0x00010000


def test_sched_and_lifecycle_definitions_are_the_python_ones():
    defines = sched.bpf_defines()
    assert {n: v for n, v in defines.items() if n.startswith("ST_")} == {
        f"ST_{s.name}": s for s in sched.ThreadState}
    assert defines["HINT_SLOTS"] == sched.HINT_SLOTS
    defines = lifecycle.bpf_defines()
    assert {n: v for n, v in defines.items() if n.startswith("EV_")} == {
        f"EV_{e.name}": e for e in lifecycle.EventType}


def test_flag_bits_the_probe_adds_do_not_meet_the_decode_flags():
    decode_bits = 0
    for flag in DecodeFlag:
        decode_bits |= flag
    call_bits = 0
    for flag in fdtrack.CallFlag:
        call_bits |= flag
    assert decode_bits < 1 << 16 <= min(fdtrack.CallFlag)
    assert decode_bits & call_bits == 0
    assert {bit for bit, _ in fdtrack.CALL_REASONS} <= set(DecodeFlag) | set(fdtrack.CallFlag)


def test_sizes_user_space_relies_on():
    for probe in (fdtrack, sched):
        assert probe.HINT_SLOTS & (probe.HINT_SLOTS - 1) == 0   # the C masks, Python mods
    assert fdtrack.PATH_LEN & (fdtrack.PATH_LEN - 1) == 0        # GPU ids read masked
    assert len(NOTABLE_CONTROLS) <= fdtrack.MAX_NOTABLE_CONTROLS
    assert len(MEMORY_CLASSES) <= fdtrack.MAX_MEMORY_CLASSES
    slots = {}
    for nr, size in FRONTEND_DECODE:
        slots.setdefault(fdtrack.decode_slot(0, nr), []).append(size)
    uvm = [fdtrack.decode_slot(1, code) for code in UVM_DECODE]
    assert len(set(uvm)) == len(uvm) and not set(uvm) & set(slots)
    assert all(0 <= slot < fdtrack.DECODE_SLOTS for slot in [*slots, *uvm])
    assert all(len(sizes) <= fdtrack.DECODE_VARIANTS for sizes in slots.values())
    assert all(fdtrack.UVM_SLOT_BASE + 255 >= s >= fdtrack.UVM_SLOT_BASE
               for s in fdtrack.UVM_HIGH_SLOTS.values())


def test_notable_hint_slot_is_knuths_hash_into_the_hint_array():
    assert fdtrack.notable_hint_slot(0x00800102) == ((0x00800102 * 2654435761) % 2**32) >> 24
    for control in [*NOTABLE_CONTROLS, *RM_CONTROLS, 0, 0xFFFFFFFF]:
        assert 0 <= fdtrack.notable_hint_slot(control) < fdtrack.NOTABLE_HINT_SLOTS


MACRO_INPUTS = sorted({*NOTABLE_CONTROLS, *RM_CONTROLS, *UVM_DECODE, *range(40), 2047,
                       0x30000001, 0x30000002, 0x30000003, 0x7FFFFFFF, 0xFFFFFFFF})


def test_the_generated_c_macros_compute_what_python_does(tmp_path):
    """The function-like macros (the notable hash among them), compiled by the host's C
    compiler with the same -D flags, on the same inputs as the Python functions."""
    harness = tmp_path / "macros.c"
    inputs = ", ".join(f"{value:#x}U" for value in MACRO_INPUTS)
    harness.write_text(
        "#include <stdio.h>\ntypedef unsigned int u32;\n"
        f"static const u32 inputs[] = {{{inputs}}};\n"
        "int main(void) {\n"
        "    for (unsigned i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++)\n"
        '        printf("%u %u %d %d\\n", inputs[i], NOTABLE_HINT_SLOT(inputs[i]),\n'
        "               UVM_HIGH_SLOT(inputs[i]), IS_HEAP_ALLOC(inputs[i]));\n"
        "    return 0;\n}\n")
    binary = tmp_path / "macros"
    subprocess.run(["cc", "-o", str(binary), str(harness), *fdtrack.CFLAGS], check=True)
    rows = [tuple(map(int, line.split()))
            for line in subprocess.run([str(binary)], capture_output=True, text=True,
                                       check=True).stdout.splitlines()]
    assert rows == [(value, fdtrack.notable_hint_slot(value),
                     fdtrack.UVM_HIGH_SLOTS.get(value, -1),
                     int(value in HEAP_ALLOC_FUNCTIONS)) for value in MACRO_INPUTS]


def test_ebpf_text_shows_the_generated_definitions_before_the_program():
    text = fdtrack.ebpf_text()
    assert "#define F_NOTABLE 0x1\n" in text
    assert "#define EV_CALL 5\n" in text
    assert "#define NOTABLE_HINT_SLOT(c) " in text
    assert text.endswith(fdtrack.BPF_SOURCE.read_text())
