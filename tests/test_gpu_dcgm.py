"""The DCGM source through stand-ins for NVIDIA's binding modules (pydcgm, dcgm_structs, ...).

The stand-ins have the real modules' names, classes, status codes and blank sentinels
(dcgm_structs.h, DcgmHandle.py, DcgmGroup.py, dcgm_field_helpers.py); they replace the
modules in sys.modules, nothing deeper. None of this has run against a real DCGM.
"""

import sys
import types

import pytest

from gpuwhy.events import GpuSample, GpuState, GpuXid
from gpuwhy.probes.gpu import dcgm as dcgm_source
from gpuwhy.probes.gpu.dcgm import DcgmSource
from gpuwhy.probes.gpu.source import SourceUnavailable

ST = {"DCGM_ST_OK": 0, "DCGM_ST_BADPARAM": -1, "DCGM_ST_NOT_SUPPORTED": -6,
      "DCGM_ST_VER_MISMATCH": -12, "DCGM_ST_GPU_IS_LOST": -18,
      "DCGM_ST_CONNECTION_NOT_VALID": -21, "DCGM_ST_LIBRARY_NOT_FOUND": -25,
      "DCGM_ST_REQUIRES_ROOT": -29, "DCGM_ST_MODULE_NOT_LOADED": -33,
      "DCGM_ST_PROFILING_NOT_SUPPORTED": -36}
INT64_NOT_SUPPORTED = 0x7FFFFFFFFFFFFFF2
FP64_BLANK = 140737488355328.0
T0 = 1_764_000_000_000_000   # µs since 1970, like DCGM


class Value:
    """dcgm_field_helpers.DcgmFieldValue: ts (µs), fieldId, fieldType, value, isBlank."""

    def __init__(self, field_id, ts, value, status=0):
        self.fieldId, self.ts, self.value = field_id, ts, value
        self.fieldType = "d" if isinstance(value, float) else "i"
        self.isBlank = status != 0 or (isinstance(value, int) and value >= 0x7FFFFFFFFFFFFFF0) \
            or (isinstance(value, float) and value >= FP64_BLANK)
        if status != 0:
            self.value = None


class Engine:
    """What the fake hostengine holds: GPUs, queued values, failures to inject."""

    def __init__(self):
        self.running = True
        self.embedded_started = 0
        self.connect_error = None
        self.gpus = {0: ("GPU-0000", "00000000:3B:00.0", "NVIDIA A100-SXM4-80GB"),
                     1: ("GPU-1111", "00000000:86:00.0", "NVIDIA A100-SXM4-80GB")}
        self.pending = {}          # field group kind -> {gpu: {field: [Value]}}
        self.watch_error = {}      # kind -> status
        self.read_error = None
        self.statuses = {}
        self.paused = False
        self.deleted = []
        self.watched = {}          # field group kind -> field ids asked for


def install_fake_dcgm(monkeypatch, engine):
    structs = types.ModuleType("dcgm_structs")
    for name, code in ST.items():
        setattr(structs, name, code)
    structs.DCGM_OPERATION_MODE_AUTO = 1

    class DCGMError(Exception):
        def __init__(self, value):
            self.value = value
            super().__init__(f"DCGM error {value}")

    classes = {}

    def dcgmExceptionClass(status):
        if status not in classes:
            classes[status] = type(f"DCGMError_{abs(status)}", (DCGMError,), {})
        return classes[status]

    structs.DCGMError, structs.dcgmExceptionClass = DCGMError, dcgmExceptionClass

    def fail(status):
        raise dcgmExceptionClass(status)(status)

    class Collection:   # DcgmFieldValueCollection
        def __init__(self):
            self.values = {}

        def EmptyValues(self):
            self.values = {}

    class Samples:
        def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
            if fieldGroup.kind in engine.watch_error:
                fail(engine.watch_error[fieldGroup.kind])
            fieldGroup.freq = updateFreq

        def UnwatchFields(self, fieldGroup):
            pass

        def GetAllSinceLastCall(self, dfvc, fieldGroup):
            if engine.read_error is not None:
                fail(engine.read_error)
            dfvc = dfvc or Collection()
            dfvc.values = engine.pending.pop(fieldGroup.kind, {})
            return dfvc

    class Group:
        def __init__(self, name, ids):
            self.name, self.ids, self.samples = name, ids, Samples()

        def Delete(self):
            engine.deleted.append(self.name)

    def attributes(gpu_id):
        uuid, bus, name = engine.gpus[gpu_id]
        ids = types.SimpleNamespace(uuid=uuid, pciBusId=bus, deviceName=name,
                                    driverVersion="550.54.15")
        return types.SimpleNamespace(identifiers=ids)

    class System:
        discovery = types.SimpleNamespace(
            GetAllSupportedGpuIds=lambda: list(engine.gpus), GetGpuAttributes=attributes,
            GetGpuStatus=lambda gpu_id: engine.statuses.get(gpu_id, 1))
        profiling = types.SimpleNamespace(Pause=lambda: setattr(engine, "paused", True),
                                          Resume=lambda: setattr(engine, "paused", False))

        def GetGroupWithGpuIds(self, groupName, gpuIds):
            return Group(groupName, gpuIds)

    class DcgmHandle:
        def __init__(self, handle=None, ipAddress=None, opMode=1, persistAfterDisconnect=False,
                     unixSocketPath=None, timeoutMs=0):
            if engine.connect_error is not None and ipAddress is not None:
                fail(engine.connect_error)
            if ipAddress is None:
                engine.embedded_started += 1
            elif not engine.running:
                fail(ST["DCGM_ST_CONNECTION_NOT_VALID"])
            self.ipAddress = ipAddress

        def GetSystem(self):
            return System()

        def Shutdown(self):
            pass

    class DcgmFieldGroup:
        def __init__(self, dcgmHandle, name, fieldIds, fieldGroupId=None):
            self.name, self.fieldIds = name, fieldIds
            self.kind = name.rsplit("-", 1)[1]
            engine.watched[self.kind] = list(fieldIds)

        def Delete(self):
            engine.deleted.append(self.name)

    pydcgm = types.ModuleType("pydcgm")
    pydcgm.DcgmHandle, pydcgm.DcgmFieldGroup = DcgmHandle, DcgmFieldGroup
    fields = types.ModuleType("dcgm_fields")
    fields.DCGM_FT_DOUBLE, fields.DCGM_FT_INT64 = "d", "i"
    reader = types.ModuleType("DcgmReader")
    for module in (structs, pydcgm, fields, reader):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(dcgm_source, "_other_hostengine_running", lambda: None)
    return structs


@pytest.fixture
def engine(monkeypatch):
    engine = Engine()
    install_fake_dcgm(monkeypatch, engine)
    return engine


def _queue(engine, kind, gpu, values):
    engine.pending.setdefault(kind, {}).setdefault(gpu, {})
    for field_id, ts, value in values:
        engine.pending[kind][gpu].setdefault(field_id, []).append(Value(field_id, ts, value))


def test_not_installed_is_a_clear_state(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydcgm", None)   # import pydcgm raises ImportError
    with pytest.raises(SourceUnavailable, match="not installed"):
        DcgmSource(bindings_path="/nonexistent").open()


def test_connects_to_the_running_hostengine_and_starts_no_embedded_one(engine):
    source = DcgmSource(interval=1.0)
    gpus = source.open()
    assert [g.id for g in gpus] == ["GPU-0000", "GPU-1111"]
    assert gpus[0].identity.pci_bus_id == "0000:3b:00.0"
    assert engine.embedded_started == 0 and source.mode == "hostengine localhost:5555"
    source.close()
    assert any(name.endswith("-basic") for name in engine.deleted)


def test_embedded_only_without_hostengine_and_when_allowed(engine, monkeypatch):
    engine.running = False
    with pytest.raises(SourceUnavailable, match="embedded mode is off"):
        DcgmSource(embedded=False).open()
    assert engine.embedded_started == 0
    monkeypatch.setattr(dcgm_source, "_other_hostengine_running",
                        lambda: "dcgm-exporter (pid 77)")
    with pytest.raises(SourceUnavailable, match="not starting a second one"):
        DcgmSource().open()
    assert engine.embedded_started == 0
    monkeypatch.setattr(dcgm_source, "_other_hostengine_running", lambda: None)
    source = DcgmSource()
    source.open()
    assert engine.embedded_started == 1 and source.mode == "embedded hostengine"


@pytest.mark.parametrize("status, message", [
    ("DCGM_ST_VER_MISMATCH", "differ in version"),
    ("DCGM_ST_LIBRARY_NOT_FOUND", "libdcgm.so.4 not found"),
])
def test_version_mismatch_and_missing_library(engine, status, message):
    engine.connect_error = ST[status]
    with pytest.raises(SourceUnavailable, match=message):
        DcgmSource().open()
    assert engine.embedded_started == 0


def test_every_value_since_the_last_read_blanks_missing_and_xid(engine):
    source = DcgmSource(interval=1.0)
    source.open()
    _queue(engine, "basic", 0, [(150, T0, 60), (150, T0 + 1_000_000, 61),
                                (155, T0 + 20, 250.5), (155, T0 + 1_000_020, 251.0),
                                (140, T0 + 30, INT64_NOT_SUPPORTED),
                                (230, T0 + 500_000, 79)])
    _queue(engine, "profiling", 0, [(1002, T0 + 40, 0.8), (1002, T0 + 1_000_040, FP64_BLANK)])
    events = source.read()
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert [s.fields for s in samples] == [
        {"temp_c": 60.0, "power_w": 250.5, "sm_active": 0.8},
        {"temp_c": 61.0, "power_w": 251.0}]
    assert [s.raw_ts for s in samples] == [T0, T0 + 1_000_000]
    assert samples[0].ts == T0 * 1000
    [xid] = [e for e in events if isinstance(e, GpuXid)]
    assert (xid.gpu_id, xid.xid, xid.raw_ts) == ("GPU-0000", 79, T0 + 500_000)


def test_a_repeated_latest_value_is_not_a_new_sample(engine):
    source = DcgmSource()
    source.open()
    _queue(engine, "basic", 0, [(150, T0, 60)])
    assert len([e for e in source.read() if isinstance(e, GpuSample)]) == 1
    _queue(engine, "basic", 0, [(150, T0, 60)])   # GetAllSinceLastCall fell back to latest
    assert not [e for e in source.read() if isinstance(e, GpuSample)]


@pytest.mark.parametrize("status", ["DCGM_ST_PROFILING_NOT_SUPPORTED",
                                    "DCGM_ST_MODULE_NOT_LOADED", "DCGM_ST_REQUIRES_ROOT"])
def test_profiling_unavailable_keeps_the_basic_fields(engine, status):
    engine.watch_error["profiling"] = ST[status]
    source = DcgmSource()
    source.open()
    assert any("profiling fields unavailable" in n and status in n for n in source.notes())
    _queue(engine, "basic", 1, [(203, T0, 97)])
    [sample] = [e for e in source.read() if isinstance(e, GpuSample)]
    assert sample.gpu_id == "GPU-1111" and sample.fields == {"gpu_util": 97.0}


def test_all_profiling_values_blank_says_paused(engine):
    source = DcgmSource()
    source.open()
    _queue(engine, "basic", 0, [(203, T0, 50)])
    _queue(engine, "profiling", 0, [(1002, T0, FP64_BLANK), (1004, T0, FP64_BLANK)])
    [sample] = [e for e in source.read() if isinstance(e, GpuSample)]
    assert sample.fields == {"gpu_util": 50.0}
    assert any("paused" in n for n in source.notes())


def test_gpu_lost_is_an_event_and_that_gpu_is_left_alone(engine):
    source = DcgmSource()
    source.open()
    engine.read_error = ST["DCGM_ST_GPU_IS_LOST"]
    engine.statuses[1] = 4   # DcgmEntityStatusLost
    [state] = source.read()
    assert isinstance(state, GpuState)
    assert (state.gpu_id, state.state, state.source) == ("GPU-1111", "lost", "dcgm")
    engine.read_error = None
    _queue(engine, "basic", 1, [(203, T0, 50)])
    assert source.read() == []
    assert "GPU-1111: lost" in source.notes()


def test_lost_connection_is_reported_for_retry(engine):
    source = DcgmSource()
    source.open()
    engine.read_error = ST["DCGM_ST_CONNECTION_NOT_VALID"]
    with pytest.raises(SourceUnavailable, match="lost the connection"):
        source.read()


def test_pause_and_resume_profiling(engine):
    source = DcgmSource()
    source.open()
    source.pause_profiling(True)
    assert engine.paused
    source.pause_profiling(False)
    assert not engine.paused


def test_an_xid_cached_before_we_started_keeps_its_own_time(engine):
    """Unlike dcgm-exporter's gauge, DCGM gives each Xid with its time, also one cached before
    we watched (another client's watch): it is a normal Xid, dated then, not before_start."""
    source = DcgmSource(interval=1.0)
    source.open()
    _queue(engine, "basic", 0, [(230, T0 - 3_600_000_000, 0), (230, T0 - 60_000_000, 48)])
    [xid] = [e for e in source.read() if isinstance(e, GpuXid)]   # the 0 is no Xid
    assert (xid.xid, xid.raw_ts, xid.ts, xid.before_start) == (
        48, T0 - 60_000_000, (T0 - 60_000_000) * 1000, False)
    _queue(engine, "basic", 0, [(230, T0 - 60_000_000, 48)])       # latest again: no repeat
    assert not [e for e in source.read() if isinstance(e, GpuXid)]


# DCGM field ids (dcgm_fields.h, DCGM 4.6.0): PCIe link 235-238, NVLink error totals summed
# over links 409/419/429/439, row remap pending 396.
PCIE_MAX_GEN, PCIE_MAX_WIDTH, PCIE_GEN, PCIE_WIDTH = 235, 236, 237, 238
NVL_CRC_FLIT, NVL_CRC_DATA, NVL_REPLAY, NVL_RECOVERY = 409, 419, 429, 439
ROW_REMAP_PENDING = 396


def test_pcie_link_nvlink_errors_and_remap_pending_are_watched_and_read(engine):
    source = DcgmSource(interval=1.0)
    source.open()
    assert {PCIE_MAX_GEN, PCIE_MAX_WIDTH, PCIE_GEN, PCIE_WIDTH, NVL_CRC_FLIT, NVL_CRC_DATA,
            NVL_REPLAY, NVL_RECOVERY, ROW_REMAP_PENDING} <= set(engine.watched["basic"])
    # an A100 SXM at Gen4 x16 with NVLink; the first reading idles at Gen1, the next runs
    _queue(engine, "basic", 0, [(PCIE_GEN, T0, 1), (PCIE_WIDTH, T0, 16),
                                (PCIE_MAX_GEN, T0, 4), (PCIE_MAX_WIDTH, T0, 16),
                                (NVL_CRC_FLIT, T0, 12), (NVL_CRC_DATA, T0, 0),
                                (NVL_REPLAY, T0, 3), (NVL_RECOVERY, T0, 1),
                                (ROW_REMAP_PENDING, T0, 1),
                                (PCIE_GEN, T0 + 1_000_000, 4)])
    samples = [e for e in source.read() if isinstance(e, GpuSample)]
    assert [s.fields for s in samples] == [
        {"pcie_link_gen": 1.0, "pcie_link_width": 16.0, "pcie_link_gen_max": 4.0,
         "pcie_link_width_max": 16.0, "nvlink_crc_flit_errors": 12.0,
         "nvlink_crc_data_errors": 0.0, "nvlink_replay_errors": 3.0,
         "nvlink_recovery_errors": 1.0, "row_remap_pending": 1.0},
        {"pcie_link_gen": 4.0}]


def test_nvlink_totals_not_supported_on_a_pcie_gpu_are_missing_not_zero(engine):
    source = DcgmSource(interval=1.0)
    source.open()
    _queue(engine, "basic", 1, [(NVL_CRC_FLIT, T0, INT64_NOT_SUPPORTED),
                                (NVL_REPLAY, T0, INT64_NOT_SUPPORTED),
                                (PCIE_GEN, T0, 0x7FFFFFF2),      # int32 NOT_SUPPORTED
                                (PCIE_WIDTH, T0, 16), (ROW_REMAP_PENDING, T0, 0)])
    [sample] = [e for e in source.read() if isinstance(e, GpuSample)]
    assert sample.fields == {"pcie_link_width": 16.0, "row_remap_pending": 0.0}


# dcgm_fields.h: 170 DCGM_FI_DEV_FABRIC_MANAGER_STATUS (dcgmFabricManagerStatus_t), 175
# DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY; both int64.
FABRIC_STATUS, FABRIC_HEALTH_SUMMARY = 170, 175


def test_fabric_state_and_health_are_watched_and_read_as_dcgm_codes_them(engine):
    source = DcgmSource(interval=1.0)
    source.open()
    assert {FABRIC_STATUS, FABRIC_HEALTH_SUMMARY} <= set(engine.watched["basic"])
    # GPU 0: Fabric Manager failed (Failure, 4), unhealthy; a second later, set up (Success);
    # GPU 1: a PCIe card (NotSupported, 0) whose DCGM has no summary for it (blank)
    _queue(engine, "basic", 0, [(FABRIC_STATUS, T0, 4), (FABRIC_HEALTH_SUMMARY, T0, 2),
                                (FABRIC_STATUS, T0 + 1_000_000, 3),
                                (FABRIC_HEALTH_SUMMARY, T0 + 1_000_000, 1)])
    _queue(engine, "basic", 1, [(FABRIC_STATUS, T0, 0),
                                (FABRIC_HEALTH_SUMMARY, T0, INT64_NOT_SUPPORTED)])
    samples = {}
    for e in source.read():
        if isinstance(e, GpuSample):
            samples.setdefault(e.gpu_id, []).append(e.fields)
    first, second = (source.gpus[i].id for i in (0, 1))
    assert samples[first] == [{"fabric_state": 4.0, "fabric_health": 2.0},
                              {"fabric_state": 3.0, "fabric_health": 1.0}]
    assert samples[second] == [{"fabric_state": 0.0}]
