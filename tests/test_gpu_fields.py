"""The field table: documented, stored, and blank sentinels recognised."""

import itertools
import math
from pathlib import Path

import pytest

from gpuwhy.gpufields import (
    BY_EXPORTER_NAME,
    FIELDS,
    SAMPLE_FIELDS,
    fields_markdown,
    is_blank,
    plausible,
)

REPO = Path(__file__).resolve().parent.parent


def test_docs_table_is_the_code_table():
    lines = (REPO / "docs" / "gpu-fields.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| our name |"))
    # the field table is the one that starts there (the file has others: "Verified on ...")
    table = "\n".join(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    assert table == fields_markdown()


def test_names_ids_and_exporter_names_are_unique():
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    assert len({f.field_id for f in FIELDS}) == len(FIELDS)
    assert len(BY_EXPORTER_NAME) == sum(len(f.exporter) for f in FIELDS)


def test_every_sample_field_has_a_store_column(db):
    columns = set(db["gpu_samples"].columns_dict)
    assert {f.name for f in SAMPLE_FIELDS} <= columns
    assert {"gpu_id", "ts", "instance"} <= columns


@pytest.mark.parametrize("value", [
    0x7FFFFFF0, 0x7FFFFFF2, 0x7FFFFFFFFFFFFFF0, 9223372036854775794, 140737488355328.0,
    140737488355330.0, "<<<NULL>>>", "<<<NOT_SUPPORTED>>>", None, math.nan])
def test_blank_sentinels(value):
    assert is_blank(value)


@pytest.mark.parametrize("value", [0, 0.0, 79, 2147483631, 2147483636, 1.5e14 / 2, "A100", False])
def test_real_values_are_not_blank(value):
    assert not is_blank(value)


def test_implausible_values_are_rejected():
    temp = next(f for f in FIELDS if f.name == "temp_c")
    util = next(f for f in FIELDS if f.name == "gpu_util")
    assert plausible(temp, 61) and not plausible(temp, 644245923)
    assert plausible(util, 100) and not plausible(util, 4294967295)
