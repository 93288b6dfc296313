"""An engine's facts are listed once, in EngineDescriptor: the catalog row, resolution's columns and the API's
answer carry exactly those fields, and a descriptor goes through each of them unchanged."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone

from enginefarm.api.schemas import EngineOut
from enginefarm.core.domain import ENGINE_FACTS, EngineDescriptor
from enginefarm.storage.resolution import ENGINE_COLUMNS, descriptor_of
from enginefarm.storage.tables import EngineRow, ModelRow

FACTS = EngineDescriptor(
    target="tensorrt-rtx/sm86",
    backend="tensorrt-rtx",
    backend_version="1.7.1.116",
    precision="fp16",
    platform="x86_64",
    compute_capability="8.6",
    compute_capabilities=["8.6"],
    gpu_name="NVIDIA GeForce RTX 3090",
    trt_version="1.7.1.116",
    cuda_version="13.0",
    driver_version="580.159.04",
    hardware_compat="ampere_plus",
    version_compatible=True,
    size=1234,
    sha256="ab" * 32,
    device_memory_bytes=4096,
    profiles=[{"input": {"min": [1, 3], "opt": [4, 3], "max": [8, 3]}}],
)


def test_every_fact_is_a_column_of_the_engine_row_and_read_by_resolution():
    columns = EngineRow.__table__.columns
    assert set(ENGINE_FACTS) <= set(columns.keys())
    assert ENGINE_FACTS == tuple(f.name for f in fields(EngineDescriptor))
    assert {c.key for c in ENGINE_COLUMNS} >= set(ENGINE_FACTS)


def test_every_fact_is_in_the_answer_and_required_unless_it_may_be_unknown():
    schema = EngineOut.model_json_schema()
    assert set(ENGINE_FACTS) <= set(schema["properties"])
    optional = {f.name for f in fields(EngineDescriptor) if f.metadata.get("optional")}
    assert optional == {"device_memory_bytes", "profiles"}
    assert set(ENGINE_FACTS) - optional <= set(schema["required"])
    assert not optional & set(schema["required"])


def test_a_descriptor_goes_through_row_answer_and_record_unchanged():
    model = ModelRow(id=7, name="net", version="1", seq=1, sha256="cd" * 32, source=None)
    row = EngineRow(
        id=3,
        model_id=7,
        model_sha256=model.sha256,
        spec_hash="ef" * 32,
        **FACTS.facts(),
        blob_key="k",
        build_seconds=1.5,
        built_by="w@h/1",
        created_at=datetime.now(timezone.utc),
    )
    assert descriptor_of(row) == FACTS
    answer = EngineOut.of(row, model).model_dump(mode="json")
    assert EngineDescriptor.of(answer) == FACTS  # what the client's offline resolution reads from a cached record
    assert EngineDescriptor.of({k: v for k, v in answer.items() if k != "profiles"}).profiles == []


def test_resolution_reads_the_facts_positionally_from_where_its_columns_hold_them():
    from enginefarm.storage.resolution import _FACTS

    assert tuple(c.key for c in ENGINE_COLUMNS[_FACTS]) == ENGINE_FACTS
    values = [getattr(FACTS, name) for name in ENGINE_FACTS]
    assert EngineDescriptor.from_values(values) == FACTS
    nulls = [None if name in ("compute_capabilities", "profiles") else v for name, v in zip(ENGINE_FACTS, values)]
    assert EngineDescriptor.from_values(nulls) == EngineDescriptor.of(dict(zip(ENGINE_FACTS, nulls)))
