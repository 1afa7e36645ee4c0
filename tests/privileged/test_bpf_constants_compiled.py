"""The compiled BPF programs and Python agree on every constant they share.

Each probe's real ``.bpf.c`` is compiled the way its loader compiles it (its CFLAGS, through
``load_bpf``), with a test-only program appended: on a ``getppid`` from this process it
writes every generated constant, as the compiled code sees it, into an array, and runs
fdtrack's own ``control_is_notable()`` / ``decode_slot()`` and the generated macros on
chosen inputs. A value changed on one side only (a ``#define`` or enum put back into a
``.bpf.c``, a hash or slot rule edited in the C or in Python) shows up as a difference.
"""

import ctypes
import os

import pytest

from gpuwhy.nvioctl import HEAP_ALLOC_FUNCTIONS, NOTABLE_CONTROLS, RM_CONTROLS, UVM_DECODE
from gpuwhy.probes import fdtrack, sched
from gpuwhy.probes import process_events as lifecycle
from gpuwhy.probes.fdtrack import load_bpf

pytestmark = pytest.mark.root

PROBES = {"fdtrack": fdtrack, "sched": sched, "lifecycle": lifecycle}
INPUTS = sorted({*NOTABLE_CONTROLS, *RM_CONTROLS, *UVM_DECODE, *range(32), 2047,
                 0x30000003, 0x7FFFFFFF, 0xFFFFFFFF})


def _constants(module):
    """The plain-number constants of a probe (function-like macros are run, not read)."""
    return {name: int(value) for name, value in module.bpf_defines().items()
            if "(" not in name and not isinstance(value, str)}


def _readback_program(names, with_functions):
    lines = [f"BPF_ARRAY(gw_constants, u64, {len(names)});"]
    if with_functions:
        lines += ["struct gw_input_t { u32 index; u32 value; };",
                  "BPF_ARRAY(gw_input, struct gw_input_t, 1);    // one input per getppid",
                  f"BPF_ARRAY(gw_outputs, u64, {len(INPUTS)});"]
    lines += ["TRACEPOINT_PROBE(syscalls, sys_enter_getppid)", "{",
              f"    if ((bpf_get_current_pid_tgid() >> 32) != {os.getpid()})",
              "        return 0;",
              "    int i;",
              "    u64 v;"]
    for i, name in enumerate(names):
        lines.append(f"    i = {i}; v = (u64)({name}); gw_constants.update(&i, &v);")
    if with_functions:
        # slot | notable << 8 | (uvm decode slot + 1) << 16 | heap alloc << 32
        lines += ["    int zero = 0;",
                  "    struct gw_input_t *in = gw_input.lookup(&zero);",
                  "    if (!in)",
                  "        return 0;",
                  "    u32 c = in->value;",
                  "    int k = in->index;",
                  "    u64 out = (u64)NOTABLE_HINT_SLOT(c)",
                  "              | (u64)(control_is_notable(c) ? 1 : 0) << 8",
                  "              | (u64)(u32)(decode_slot(1, c) + 1) << 16",
                  "              | (u64)(IS_HEAP_ALLOC(c) ? 1 : 0) << 32;",
                  "    gw_outputs.update(&k, &out);"]
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def _compile(module, tmp_path, source_text=None, with_functions=False):
    names = sorted(_constants(module))
    source = tmp_path / module.BPF_SOURCE.name
    source.write_text((source_text or module.BPF_SOURCE.read_text())
                      + "\n// --- test only ---\n" + _readback_program(names, with_functions))
    return load_bpf(module.NAME, source, module.CFLAGS), names


def _read_constants(bpf, names):
    os.getppid()
    table = bpf[b"gw_constants"]
    return {name: table[ctypes.c_int(i)].value for i, name in enumerate(names)}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_compiled_program_has_the_python_values(name, tmp_path):
    module = PROBES[name]
    bpf, names = _compile(module, tmp_path)
    try:
        assert _read_constants(bpf, names) == _constants(module)
    finally:
        bpf.cleanup()


def test_fdtrack_notable_hash_and_slots_agree_with_python(tmp_config, tmp_path):
    bpf, names = _compile(fdtrack, tmp_path, with_functions=True)
    try:
        probe = fdtrack.FdTrackProbe(tmp_config, lambda event: None)
        probe._configure(bpf)            # fills notable_hint and notable_controls as at load
        assert _read_constants(bpf, names) == _constants(fdtrack)
        single = bpf[b"gw_input"]
        for k, value in enumerate(INPUTS):
            single[ctypes.c_int(0)] = single.Leaf(k, value)
            os.getppid()
        outputs = bpf[b"gw_outputs"]
        got = {}
        for k, value in enumerate(INPUTS):
            out = outputs[ctypes.c_int(k)].value
            got[value] = (out & 0xFF, (out >> 8) & 1, ((out >> 16) & 0xFFFF) - 1, out >> 32)

        def uvm_slot(code):
            try:
                return fdtrack.decode_slot(1, code)
            except ValueError:
                return -1

        expected = {value: (fdtrack.notable_hint_slot(value), int(value in NOTABLE_CONTROLS),
                            uvm_slot(value), int(value in HEAP_ALLOC_FUNCTIONS))
                    for value in INPUTS}
        assert got == expected
    finally:
        bpf.cleanup()


def test_a_value_redefined_in_the_c_alone_is_caught(tmp_path):
    """The check above can fail: lifecycle.bpf.c with EV_FORK put back by hand."""
    text = lifecycle.BPF_SOURCE.read_text()
    include = "#include <uapi/linux/ptrace.h>\n"
    assert include in text
    edited = text.replace(include, include + "#undef EV_FORK\n#define EV_FORK 7\n")
    bpf, names = _compile(lifecycle, tmp_path, source_text=edited)
    try:
        compiled = _read_constants(bpf, names)
    finally:
        bpf.cleanup()
    assert compiled != _constants(lifecycle)
    assert compiled["EV_FORK"] == 7 and compiled["EV_EXEC"] == lifecycle.EventType.EXEC
