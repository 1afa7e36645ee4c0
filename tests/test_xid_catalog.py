"""gpuwhy's Xid catalogue against NVIDIA's (tests/data/nvidia-xid-catalog.csv and
tests/data/nvidia-xid-nvlink5-decode.csv, copied from NVIDIA's Xid catalogue; their first line
says from where): every documented code known, the same resolution buckets but for the listed
exceptions, reset/reboot needs and severity following the immediate resolution, and the
NVLink5 (144-150) decode row by row."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuwhy.probes.klog.parse import parse_line
from gpuwhy.xid import (
    CATALOGUE_SOURCE,
    NVLINK5_RULES,
    OWN_RESOLUTIONS,
    catalogue_fields,
    documented_codes,
    nvlink5_decode,
    xid_info,
)

DATA = Path(__file__).parent / "data"
# NVIDIA's buckets that mean "reset the GPU" or "reboot": RESET_GPU, RESTART_BM, RESTART_VM,
# and the two workflows whose text in the catalogue is a reset (Xid 48: "Solo: RESET_GPU";
# Xid 74: "a GPU reset or node reboot is needed to clear this error").
RESET = {"RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR"}
REBOOT = {"RESTART_BM", "RESTART_VM"}


def _rows(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


CATALOG = {int(row["code"]): row for row in _rows("nvidia-xid-catalog.csv")}
DECODE = _rows("nvidia-xid-nvlink5-decode.csv")


def test_the_copy_of_nvidias_catalogue_is_whole():
    assert sorted(CATALOG) == list(range(1, 173))
    assert "analyzing-xid-catalog" in (DATA / "nvidia-xid-catalog.csv").read_text()[:300]


def test_gpuwhy_knows_every_documented_code_and_no_other():
    assert documented_codes() == tuple(CATALOG)
    for code in CATALOG:
        info = xid_info(code)
        assert info.mnemonic != "UNKNOWN" and info.source == CATALOGUE_SOURCE, code
        assert info.title and info.action, code
        assert info.origin in ("hardware", "driver", "application", "unknown"), code
    for code in (0, 173, 174, 175, 176, 185, 999, 2**32 - 1):
        info = xid_info(code)
        assert (info.mnemonic, info.source, info.immediate) == ("UNKNOWN", "", ""), code
        assert "not in NVIDIA's catalogue" in info.title and not info.gpu_reset


def test_mnemonics_are_nvidias():
    for code, row in CATALOG.items():
        assert xid_info(code).mnemonic in row["mnemonic"].split(" / "), code


def test_the_immediate_resolution_agrees_but_for_the_listed_exceptions():
    differ = {code: xid_info(code).immediate for code, row in CATALOG.items()
              if xid_info(code).immediate != row["immediate"]}
    assert differ == {code: bucket for code, (bucket, _) in OWN_RESOLUTIONS.items()}
    assert all(len(why) > 20 for _, why in OWN_RESOLUTIONS.values())
    agreement = 1 - len(differ) / len(CATALOG)
    assert agreement >= 0.98, f"{agreement:.1%}"


def test_investigatory_resolution_products_and_xid154_linkage_are_nvidias():
    since = {"N/A; Unused": "", "": "", "yes; support with Xid introduction":
             "since its introduction"}
    for code, row in CATALOG.items():
        info = xid_info(code)
        linkage = row["xid154_linkage"]
        assert info.investigatory == row["investigatory"], code
        assert info.applies_to == row["applies_to"], code
        assert info.xid154_since == since.get(linkage, linkage.rpartition(" ")[2]), code


def test_reset_and_reboot_follow_the_immediate_resolution():
    for code, row in CATALOG.items():
        info = xid_info(code)
        assert info.gpu_reset == (info.immediate in RESET), code
        assert info.reboot == (info.immediate in REBOOT), code
        if row["immediate"] == "RESET_GPU":
            assert info.gpu_reset and not info.reboot, code
        if row["immediate"] in REBOOT:
            assert info.reboot, code


def test_severity_follows_the_immediate_resolution():
    for code in CATALOG:
        info = xid_info(code)
        assert (info.severity == "critical") == (info.gpu_reset or info.reboot), code
        if info.immediate == "RESTART_APP":
            assert info.severity == "error", code
        if info.severity == "info":
            # nothing to do: NVIDIA asks for nothing now nor later, the Xid follows another
            # one, or power smoothing came back
            assert (info.immediate, info.investigatory) == ("IGNORE", "IGNORE") \
                or info.immediate in ("WORKFLOW_XID_45", "XID_154") or code == 162, code


def test_codes_nvidia_lists_as_unused_say_so():
    for code, row in CATALOG.items():
        assert ("unused" in xid_info(code).title) == (row["description"] == "Unused"), code


def test_the_nvlink5_rules_are_nvidias_decode_sheet():
    mine = [(str(r.xid), r.unit, r.intrinfo_v1, r.intrinfo_v2,
             "" if r.error_status is None else f"0x{r.error_status:08X}", r.resolution,
             r.action2_v1, r.action2_v2, r.action2, r.investigatory) for r in NVLINK5_RULES]
    theirs = [(r["xid"], r["unit"], r["intrinfo_v1"], r["intrinfo_v2"], r["error_status"],
               r["resolution"], r["action2_v1"], r["action2_v2"], r["action2"],
               r["investigatory"]) for r in DECODE]
    assert mine == theirs


def _value(mask: str, dont_care: str) -> int:
    return int(mask.replace("-", dont_care), 2)


@pytest.mark.parametrize("dont_care", ["0", "1"])
def test_every_decode_row_is_recognised_in_both_message_versions(dont_care):
    for row in DECODE:
        xid = int(row["xid"])
        status = int(row["error_status"] or "0x7", 16)   # an empty status matches any
        for mask, version in ((row["intrinfo_v1"], 1), (row["intrinfo_v2"], 2)):
            if row["action2"]:
                mask = mask.replace("-", "0")   # the action-2 bit stays clear
            unit, *how = nvlink5_decode(xid, _value(mask, dont_care), status)
            assert how == [row["resolution"], row["investigatory"]], row
            # the older message version does not tell the two TLW pipes apart
            assert unit == row["unit"] or version == 1 and row["unit"] in unit.split(" or ")
        for mask in (row["action2_v1"], row["action2_v2"]):
            if mask:
                assert nvlink5_decode(xid, _value(mask, dont_care), status) == \
                    (row["unit"], row["action2"], row["investigatory"]), row
    assert nvlink5_decode(144, 0x1, 0x40) is None      # a status the sheet does not list
    assert nvlink5_decode(150, 0x5, 0x0) is None       # a unit the sheet does not list


@pytest.mark.parametrize("line, unit, immediate, severity, reset", [
    # observed lines (tests/data/klog/xid-log-samples.txt, from leptonai/gpud PRs 1160/1174)
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", "NETIR/NETIR_INT", "RESET_GPU",
     "critical", True),
    ("NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 "
     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
     "NETIR_LINK_EVT/NETIR_LINK_DOWN", "IGNORE", "warning", False),
    ("NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 "
     "0x00000000 0x00000000 0x00000000 0x00000000)", "SAW_MVB", "IGNORE", "warning", False),
    ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
     "0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)", "RLW_RXPIPE", "IGNORE",
     "warning", False),
    # the same unit with status 1 and IntrInfo bit 10 set: action 2
    ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x000004c2 "
     "0x00000001 0x0 0x0 0x0 0x0)", "RLW_RXPIPE", "RESET_GPU", "critical", True),
])
def test_an_nvlink5_line_gets_the_resolution_of_its_decoded_words(line, unit, immediate,
                                                                  severity, reset):
    record = parse_line(line)
    fields = catalogue_fields("xid", record.xid, record.details)
    assert (fields["nvlink5_unit"], fields["immediate"], fields["severity"],
            fields["gpu_reset"]) == (unit, immediate, severity, reset)


def test_an_nvlink5_line_without_its_words_keeps_the_code_s_entry():
    record = parse_line("NVRM: Xid (PCI:0000:01:00): 146, TLW_CTRL Fatal XC0 i0 Link 3")
    fields = catalogue_fields("xid", record.xid, record.details)
    assert "nvlink5_unit" not in fields
    assert (fields["immediate"], fields["severity"], fields["gpu_reset"]) == \
        ("WORKFLOW_NVLINK5_ERR", "error", False)
