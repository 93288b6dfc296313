"""An engine's facts are listed once, in EngineDescriptor: the catalog row, resolution's columns and the API's
answer carry exactly those fields, and a descriptor goes through each of them unchanged."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone

from api.schemas import EngineOut
from enginefarm.core.domain import ENGINE_FACTS, EngineDescriptor
from storage.resolution import ENGINE_COLUMNS, descriptor_of
from storage.tables import EngineRow, ModelRow

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
    run_options={"prefer_nhwc": "1"},
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
    assert optional == {"device_memory_bytes", "profiles", "run_options"}
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
    from storage.resolution import _FACTS

    assert tuple(c.key for c in ENGINE_COLUMNS[_FACTS]) == ENGINE_FACTS
    values = [getattr(FACTS, name) for name in ENGINE_FACTS]
    assert EngineDescriptor.from_values(values) == FACTS
    nulls = [None if name in ("compute_capabilities", "profiles") else v for name, v in zip(ENGINE_FACTS, values)]
    assert EngineDescriptor.from_values(nulls) == EngineDescriptor.of(dict(zip(ENGINE_FACTS, nulls)))


def test_an_engine_is_written_with_the_kind_key_of_its_kind_facts(tmp_path):
    """The kind key goes with the row on every write through the ORM (resolution groups a model's engines by it):
    the key of its kind facts, whatever its own facts (bytes, size, memory, profiles), and a new one when a kind
    fact changes. Unset facts count as the catalog's defaults."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from enginefarm.core.compat import KIND_FACTS, kind_key
    from storage.tables import Base

    engine = create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    Base.metadata.create_all(engine)
    own = {"sha256": "01" * 32, "size": 1, "device_memory_bytes": None, "profiles": []}

    def row(eid: int, **facts) -> EngineRow:
        return EngineRow(
            id=eid,
            model_id=7,
            model_sha256="cd" * 32,
            spec_hash=f"{eid:064x}",
            blob_key="k",
            build_seconds=1.0,
            **facts,
        )

    with Session(engine) as s:
        s.add(
            ModelRow(
                id=7, name="net", version="1", seq=1, sha256="cd" * 32, format="onnx", blob_key="m", size=1, info={}
            )
        )
        first = row(1, **FACTS.facts())
        second = row(2, **(FACTS.facts() | own))
        bare = row(
            3,
            target="onnxruntime/cpu-x86_64",
            backend="onnxruntime",
            backend_version="1.23.2",
            precision="fp32",
            platform="x86_64",
            sha256="02" * 32,
            size=2,
        )
        s.add_all([first, second, bare])
        s.commit()
        assert first.kind_key == second.kind_key == kind_key({n: getattr(FACTS, n) for n in KIND_FACTS})
        assert bare.kind_key == kind_key(
            {
                "target": "onnxruntime/cpu-x86_64",
                "backend": "onnxruntime",
                "backend_version": "1.23.2",
                "precision": "fp32",
                "platform": "x86_64",
                "compute_capabilities": [],
                "hardware_compat": "none",
                "version_compatible": False,
            }
        )
        assert bare.kind_key != first.kind_key
        before = second.kind_key
        second.precision = "int8"
        s.commit()
        assert second.kind_key != before and second.kind_key == kind_key(
            {n: getattr(FACTS, n) for n in KIND_FACTS} | {"precision": "int8"}
        )


def test_the_kind_facts_and_their_key_are_what_the_stored_keys_were_made_of():
    """Every engine row holds a kind key made of these facts by this function (migration 0011 keyed the engines
    there were), and resolution keeps a kind's facts and rules by its key alone. A change to either, or a kind fact
    changed outside the ORM (a migration's UPDATE), needs a migration that keys every engine again: otherwise an
    engine is judged by another kind's facts."""
    from enginefarm.core.compat import KIND_FACTS, kind_key

    assert KIND_FACTS == (
        "target",
        "backend",
        "backend_version",
        "precision",
        "platform",
        "compute_capability",
        "compute_capabilities",
        "gpu_name",
        "trt_version",
        "cuda_version",
        "driver_version",
        "hardware_compat",
        "version_compatible",
    )
    facts = {
        "target": "tensorrt-rtx/sm86",
        "backend": "tensorrt-rtx",
        "backend_version": "1.7.1.116",
        "precision": "fp16",
        "platform": "x86_64",
        "compute_capability": "8.6",
        "compute_capabilities": ["8.6"],
    }
    assert kind_key(facts) == 4290317141883035710
