"""The Xid catalogue: every code the reference lists is explained, reset/reboot needs are right."""

import pytest

from gpuwhy.identity import normalize_pci
from gpuwhy.xid import catalogue_fields, sxid_info, xid_info

LISTED = [8, 13, 31, 32, 38, 39, 40, 41, 43, 44, 45, 46, 48, 54, 60, 61, 62, 63, 64, 68, 69,
          70, 74, 79, 80, 85, 92, 93, 94, 95, 109, 110, 119, 120, 121, 126, 135, 136, 137, 140,
          141, 143, 144, 145, 146, 147, 148, 149, 150, 151, 154, 155, 156, 157, 158, 159, 171,
          172]


@pytest.mark.parametrize("code", LISTED)
def test_every_listed_xid_has_a_real_entry(code):
    info = xid_info(code)
    assert info.mnemonic != "UNKNOWN"
    assert info.severity in ("critical", "error", "warning", "info")
    assert info.origin in ("hardware", "driver", "application", "unknown")
    assert info.action and info.title


def test_recovery_needs():
    assert xid_info(79).reboot and not xid_info(79).gpu_reset
    assert xid_info(48).gpu_reset and xid_info(119).gpu_reset and xid_info(95).gpu_reset
    assert not xid_info(13).gpu_reset and not xid_info(94).gpu_reset
    assert xid_info(74).mnemonic == "NVLINK_ERROR"       # not swallowed by the CE range
    # NVIDIA's catalogue: 73 is the unused NVENC2 code, not a copy engine; 156 asks for a
    # GPU reset, so it is critical like every reset
    assert xid_info(73).mnemonic == "ROBUST_CHANNEL_NVENC2_ERROR"
    assert xid_info(156).gpu_reset and xid_info(156).severity == "critical"


def test_xid_154_takes_its_needs_from_the_line():
    reset = catalogue_fields("xid", 154, {"recovery_to": "GPU Reset Required"})
    reboot = catalogue_fields("xid", 154, {"recovery_to": "Node Reboot Required"})
    none = catalogue_fields("xid", 154, {"recovery_to": "None"})
    assert (reset["gpu_reset"], reset["reboot"]) == (True, False)
    assert (reboot["gpu_reset"], reboot["reboot"]) == (False, True)
    assert none["severity"] == "info" and not none["gpu_reset"]


def test_unknown_codes_say_so():
    assert xid_info(9999).origin == "unknown" and "not in" in xid_info(9999).title


def test_sxid_unit_and_severity():
    assert sxid_info(12028, fatal=True).mnemonic == "NPORT_EGRESS"
    assert sxid_info(12028, fatal=True).severity == "critical"
    assert sxid_info(22013, fatal=False).severity == "warning"


@pytest.mark.parametrize("raw,expected", [
    ("0000:2B:00", "0000:2b:00"), ("0000:2b:00.0", "0000:2b:00"),
    ("00000000:2B:00.0", "0000:2b:00"), ("03:00", "0000:03:00"), ("0019:01:00", "0019:01:00"),
])
def test_pci_normalisation(raw, expected):
    assert normalize_pci(raw) == expected


@pytest.mark.parametrize("raw", ["", "zz:00", "0000:100:00", "1:2:3:4", "0000:0a"])
def test_pci_normalisation_rejects_garbage(raw):
    with pytest.raises(ValueError):
        normalize_pci(raw)
