"""The DCGM source's MIG GPU instances, through the stand-ins of test_gpu_dcgm.py plus the
MIG calls of NVIDIA's bindings (testing/python3 of NVIDIA/DCGM):

- ``dcgm_agent.dcgmGetGpuInstanceHierarchy(handle)`` -> ``c_dcgmMigHierarchy_v2``: ``count``
  and ``entityList[i]`` with ``entity`` / ``parent`` (``entityGroupId``, ``entityId``) and
  ``info.nvmlInstanceId`` (the GPU instance id dcgm-exporter labels ``GPU_I_ID``);
- ``dcgm_agent.dcgmEntitiesGetLatestValues(handle, entities, fieldIds, flags)`` ->
  ``c_dcgmFieldValue_v2`` array (``entityId``, ``fieldId``, ``status``, ``value.str``);
- ``DcgmSystem.GetGroupWithEntities(name, entities)`` and
  ``DcgmGroupSamples.GetAllSinceLastCall_v2(dfvec, fieldGroup)`` ->
  ``.values[entityGroupId][entityId][fieldId]``.

None of this has run against a real DCGM.
"""

import sys
import types

import pytest

from gpuwhy.events import GpuSample
from gpuwhy.gpufields import PROFILING_IDS
from gpuwhy.probes.gpu.dcgm import DcgmSource

from .test_gpu_dcgm import INT64_NOT_SUPPORTED, ST, T0, Engine, Value, install_fake_dcgm

FE_GPU, FE_GPU_I, FE_GPU_CI = 1, 4, 5
FB_TOTAL, FB_USED, GR_ENGINE, SM_ACTIVE = 250, 252, 1001, 1002


def entry(group, entity, parent_group, parent, gi=0):
    pair = types.SimpleNamespace
    return pair(entity=pair(entityGroupId=group, entityId=entity),
                parent=pair(entityGroupId=parent_group, entityId=parent),
                info=pair(gpuUuid=b"GPU-0000", nvmlGpuIndex=parent, nvmlInstanceId=gi,
                          nvmlComputeInstanceId=0, nvmlMigProfileId=0, nvmlProfileSlices=1))


class MigEngine(Engine):
    """The fake hostengine with MIG: ``hierarchy`` (entries as DCGM lists them: GPU
    instances under their GPU, compute instances under their GPU instance), ``names`` the
    DCGM_FI_DEV_NAME of each GPU instance entity, ``mig_pending`` the queued instance
    values by field group kind, ``mig_groups`` each entity group made (name, entities)."""

    def __init__(self):
        super().__init__()
        self.hierarchy = []
        self.hierarchy_error = None
        self.names = {}
        self.names_error = None
        self.mig_pending = {}
        self.mig_read_error = {}
        self.mig_groups = []
        self.hierarchy_reads = 0


def install_mig(monkeypatch, engine):
    structs = install_fake_dcgm(monkeypatch, engine)
    structs.DCGM_FV_FLAG_LIVE_DATA = 1
    fields = sys.modules["dcgm_fields"]
    fields.DCGM_FE_GPU, fields.DCGM_FE_GPU_I = FE_GPU, FE_GPU_I
    pydcgm = sys.modules["pydcgm"]

    class Handle(pydcgm.DcgmHandle):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.handle = 7   # the raw dcgmHandle_t the dcgm_agent calls take

    monkeypatch.setattr(pydcgm, "DcgmHandle", Handle)
    system = type(Handle(ipAddress="localhost:5555").GetSystem())
    group_class = type(system().GetGroupWithGpuIds("probe", []))

    def get_group_with_entities(self, groupName, entities):
        engine.mig_groups.append((groupName, [(e.entityGroupId, e.entityId) for e in entities]))
        return group_class(groupName, entities)

    def since_last_call_v2(self, dfvec, fieldGroup):
        code = engine.mig_read_error.get(fieldGroup.kind)
        if code is not None:
            raise structs.dcgmExceptionClass(code)(code)
        dfvec = dfvec or types.SimpleNamespace(values={})
        dfvec.EmptyValues = lambda: setattr(dfvec, "values", {})
        dfvec.values = {FE_GPU_I: engine.mig_pending.pop(fieldGroup.kind, {})}
        return dfvec

    samples_class = type(group_class("probe", []).samples)
    monkeypatch.setattr(system, "GetGroupWithEntities", get_group_with_entities, raising=False)
    monkeypatch.setattr(samples_class, "GetAllSinceLastCall_v2", since_last_call_v2,
                        raising=False)

    agent = types.ModuleType("dcgm_agent")

    def hierarchy(handle):
        assert handle == 7
        engine.hierarchy_reads += 1
        if engine.hierarchy_error is not None:
            raise structs.dcgmExceptionClass(engine.hierarchy_error)(engine.hierarchy_error)
        padded = engine.hierarchy + [entry(0, 0, 0, 0)] * 3   # a fixed-size C array
        return types.SimpleNamespace(version=2, count=len(engine.hierarchy),
                                     entityList=padded)

    def latest(handle, entities, fieldIds, flags):
        assert fieldIds == [50] and flags == 1
        if engine.names_error is not None:
            raise structs.dcgmExceptionClass(engine.names_error)(engine.names_error)
        return [types.SimpleNamespace(entityGroupId=e.entityGroupId, entityId=e.entityId,
                                      fieldId=50, status=0 if e.entityId in engine.names
                                      else ST["DCGM_ST_NOT_SUPPORTED"],
                                      value=types.SimpleNamespace(
                                          str=engine.names.get(e.entityId, b"")))
                for e in entities]

    agent.dcgmGetGpuInstanceHierarchy = hierarchy
    agent.dcgmEntitiesGetLatestValues = latest
    monkeypatch.setitem(sys.modules, "dcgm_agent", agent)
    return structs


@pytest.fixture
def engine(monkeypatch):
    engine = MigEngine()
    install_mig(monkeypatch, engine)
    return engine


def a100_in_mig_mode(engine):
    """GPU 0 split: GPU instance entities 0 (GI 9) and 1 (GI 10) are 1g.10gb, entity 2 is GI
    1, a 3g.40gb with two compute instances. GPU 1 is not in MIG mode."""
    engine.hierarchy = [entry(FE_GPU_I, 0, FE_GPU, 0, gi=9),
                        entry(FE_GPU_CI, 0, FE_GPU_I, 0),
                        entry(FE_GPU_I, 1, FE_GPU, 0, gi=10),
                        entry(FE_GPU_CI, 1, FE_GPU_I, 1),
                        entry(FE_GPU_I, 2, FE_GPU, 0, gi=1),
                        entry(FE_GPU_CI, 2, FE_GPU_I, 2),
                        entry(FE_GPU_CI, 3, FE_GPU_I, 2)]
    engine.names = {0: b"1g.10gb", 1: b"1g.10gb", 2: b"3g.40gb"}


def queue(engine, kind, entity, values):
    by_field = engine.mig_pending.setdefault(kind, {}).setdefault(entity, {})
    for field_id, ts, value in values:
        by_field.setdefault(field_id, []).append(Value(field_id, ts, value))


def instance_samples(events):
    return [(e.gpu_id, e.instance, e.labels, e.ts, e.fields) for e in events
            if isinstance(e, GpuSample) and e.instance]


def test_each_gpu_instance_is_watched_and_gives_its_own_samples(engine):
    a100_in_mig_mode(engine)
    source = DcgmSource(interval=1.0)
    source.open()
    assert engine.mig_groups == [(engine.mig_groups[0][0], [(FE_GPU_I, 0), (FE_GPU_I, 1),
                                                            (FE_GPU_I, 2)])]   # no CI
    assert engine.watched["mig_basic"] == [FB_TOTAL, FB_USED]
    assert engine.watched["mig_profiling"] == list(PROFILING_IDS)
    for entity, (used, busy) in {0: (8210, 0.0), 1: (5100, 0.64), 2: (30000, 0.92)}.items():
        queue(engine, "mig_basic", entity, [(FB_TOTAL, T0, 9984), (FB_USED, T0, used),
                                            (FB_USED, T0 + 1_000_000, used + 1)])
        queue(engine, "mig_profiling", entity, [(GR_ENGINE, T0 + 3, busy),
                                                (SM_ACTIVE, T0 + 5, INT64_NOT_SUPPORTED)])
    samples = instance_samples(source.read())
    assert samples == [
        ("GPU-0000", "9", {"mig_profile": "1g.10gb"}, T0 * 1000,
         {"fb_total_mib": 9984.0, "fb_used_mib": 8210.0, "gr_engine_active": 0.0}),
        ("GPU-0000", "9", {"mig_profile": "1g.10gb"}, (T0 + 1_000_000) * 1000,
         {"fb_used_mib": 8211.0}),
        ("GPU-0000", "10", {"mig_profile": "1g.10gb"}, T0 * 1000,
         {"fb_total_mib": 9984.0, "fb_used_mib": 5100.0, "gr_engine_active": 0.64}),
        ("GPU-0000", "10", {"mig_profile": "1g.10gb"}, (T0 + 1_000_000) * 1000,
         {"fb_used_mib": 5101.0}),
        ("GPU-0000", "1", {"mig_profile": "3g.40gb"}, T0 * 1000,
         {"fb_total_mib": 9984.0, "fb_used_mib": 30000.0, "gr_engine_active": 0.92}),
        ("GPU-0000", "1", {"mig_profile": "3g.40gb"}, (T0 + 1_000_000) * 1000,
         {"fb_used_mib": 30001.0})]   # the blank SM value is missing, not 0
    assert "MIG: 3 GPU instance(s) watched" in source.notes()
    source.close()
    assert {name for name, _ in engine.mig_groups} <= set(engine.deleted)
    assert any(name.endswith("-mig_profiling") for name in engine.deleted)


def test_no_gpu_in_mig_mode_watches_no_instances(engine):
    source = DcgmSource()
    source.open()
    assert engine.mig_groups == [] and "mig_basic" not in engine.watched
    assert instance_samples(source.read()) == []
    assert not any("MIG" in note for note in source.notes())
    source.close()


def test_a_reconfiguration_remakes_the_group_and_an_instance_gone_stops(engine):
    a100_in_mig_mode(engine)
    source = DcgmSource()
    source.mig_recheck_s = 0.0          # read the hierarchy at every read
    source.open()
    queue(engine, "mig_basic", 1, [(FB_USED, T0, 100)])
    assert [s[1] for s in instance_samples(source.read())] == ["10"]
    assert len(engine.mig_groups) == 1  # unchanged hierarchy: the group is kept
    # GI 10 destroyed, GI 9 re-made as a 2g.20gb (same entity, new profile)
    del engine.hierarchy[2:4]
    engine.names[0] = b"2g.20gb"
    queue(engine, "mig_basic", 1, [(FB_USED, T0 + 2_000_000, 100)])   # a late value of GI 10
    queue(engine, "mig_basic", 0, [(FB_USED, T0 + 2_000_000, 50)])
    samples = instance_samples(source.read())
    assert [(s[1], s[2]) for s in samples] == [("9", {"mig_profile": "2g.20gb"})]
    assert engine.mig_groups[-1][1] == [(FE_GPU_I, 0), (FE_GPU_I, 2)]
    assert engine.mig_groups[0][0] in engine.deleted
    engine.hierarchy = []               # MIG mode off
    assert instance_samples(source.read()) == []
    assert not any(note.startswith("MIG:") for note in source.notes())
    source.close()


@pytest.mark.parametrize("status", ["DCGM_ST_BADPARAM", "DCGM_ST_NOT_SUPPORTED"])
def test_a_failed_instance_read_costs_that_read_and_the_hierarchy_is_read_again(engine,
                                                                                 status):
    a100_in_mig_mode(engine)
    source = DcgmSource()
    source.open()
    reads = engine.hierarchy_reads
    engine.mig_read_error["mig_basic"] = ST[status]
    queue(engine, "mig_profiling", 2, [(GR_ENGINE, T0, 0.5)])
    samples = instance_samples(source.read())
    assert [(s[1], s[4]) for s in samples] == [("1", {"gr_engine_active": 0.5})]
    assert any(note.startswith("MIG instance read failed") for note in source.notes())
    del engine.mig_read_error["mig_basic"]
    queue(engine, "mig_basic", 2, [(FB_USED, T0 + 1_000_000, 7)])
    assert [s[4] for s in instance_samples(source.read())] == [{"fb_used_mib": 7.0}]
    assert engine.hierarchy_reads == reads + 1   # asked again at once, not in 30 s


def test_the_whole_gpu_samples_go_on_whatever_mig_does(engine):
    engine.hierarchy_error = ST["DCGM_ST_NOT_SUPPORTED"]
    source = DcgmSource()
    source.open()
    engine.pending["basic"] = {0: {150: [Value(150, T0, 45)]}}
    events = source.read()
    assert [(e.gpu_id, e.instance, e.fields) for e in events if isinstance(e, GpuSample)] == [
        ("GPU-0000", "", {"temp_c": 45.0})]
    assert "MIG hierarchy unavailable (DCGM_ST_NOT_SUPPORTED)" in source.notes()


def test_profiling_refused_on_instances_keeps_their_memory(engine):
    a100_in_mig_mode(engine)
    engine.watch_error["mig_profiling"] = ST["DCGM_ST_PROFILING_NOT_SUPPORTED"]
    source = DcgmSource()
    source.open()
    queue(engine, "mig_basic", 0, [(FB_USED, T0, 8210)])
    assert [s[4] for s in instance_samples(source.read())] == [{"fb_used_mib": 8210.0}]
    assert ("MIG instance fields not watched: mig_profiling "
            "(DCGM_ST_PROFILING_NOT_SUPPORTED)") in source.notes()
    assert any(name.endswith("-mig_profiling") for name in engine.deleted)


def test_without_profile_names_the_instances_still_come_unlabelled(engine):
    a100_in_mig_mode(engine)
    engine.names_error = ST["DCGM_ST_NOT_SUPPORTED"]
    source = DcgmSource()
    source.open()
    queue(engine, "mig_basic", 1, [(FB_USED, T0, 1)])
    [sample] = instance_samples(source.read())
    assert (sample[1], sample[2]) == ("10", {})
    assert "MIG profile names unavailable (DCGM_ST_NOT_SUPPORTED)" in source.notes()


def test_bindings_without_dcgm_agent_say_so(engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "dcgm_agent", None)   # import dcgm_agent fails
    source = DcgmSource()
    source.open()
    assert instance_samples(source.read()) == []
    assert any("no dcgm_agent module" in note for note in source.notes())
