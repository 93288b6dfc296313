"""The reference file a deploy machine checks an engine against (enginefarm.measure.check): what the farm writes
reads back the same, anything else is refused with what is wrong, and a check on it judges as the farm's does."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from enginefarm.core.spec import DEFAULT_TOLERANCES
from enginefarm.measure.check import BadReference, Reference, verdict


def made(batches: int = 2) -> Reference:
    rng = np.random.default_rng(0)
    feeds = [
        {"image": rng.standard_normal((2, 3, 8, 8), dtype=np.float32), "ids": np.arange(4)} for _ in range(batches)
    ]
    wanted = [{"logits/0": f["image"].sum(axis=(2, 3)), "mask": f["ids"] > 1} for f in feeds]
    return Reference(feeds, wanted, ["logits/0", "mask"], f"{batches} batch(es) of seeded random inputs")


class Echo:
    """An 'engine' that computes what the reference computed, off by ``error``."""

    def __init__(self, error: float = 0.0):
        self.error = error

    def infer(self, inputs):
        return {"logits/0": inputs["image"].sum(axis=(2, 3)) + self.error, "mask": inputs["ids"] > 1}


def test_a_reference_reads_back_as_written(tmp_path):
    ref = made()
    ref.save(tmp_path / "r.npz")
    back = Reference.load(tmp_path / "r.npz")
    assert (back.names, back.origin, len(back.feeds)) == (ref.names, ref.origin, 2)
    for a, b in zip(ref.feeds + ref.wanted, back.feeds + back.wanted, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_a_check_on_it_judges_as_the_farms_gate(tmp_path):
    ref = made()
    limits = DEFAULT_TOLERANCES["fp16"]
    assert verdict(Echo(), ref, limits, "fp16")["pass"] is True
    failed = verdict(Echo(error=1.0), ref, limits, "fp16")
    assert failed["pass"] is False and "logits/0" in failed["failures"] and "mask" not in failed["failures"]
    assert failed["inputs"] == ref.origin and failed["precision"] == "fp16"


def test_an_engine_without_an_output_of_the_reference_says_which(tmp_path):
    class Missing(Echo):
        def infer(self, inputs):
            return {"logits/0": super().infer(inputs)["logits/0"]}

    with pytest.raises(ValueError, match="the engine has no output 'mask'"):
        verdict(Missing(), made(), DEFAULT_TOLERANCES["fp32"], "fp32")


def test_a_file_the_farm_did_not_write_is_refused_with_what_is_wrong(tmp_path):
    garbage = tmp_path / "g.npz"
    garbage.write_bytes(b"not a zip at all")
    with pytest.raises(BadReference, match="not a readable reference file"):
        Reference.load(garbage)
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    with pytest.raises(BadReference, match="no meta array"):
        Reference.load(tmp_path / "plain.npz")
    pickled = tmp_path / "pickled.npz"  # an object array would need pickle to load: never loaded
    meta = b'{"format": "enginefarm-reference/1", "inputs": ["x"], "names": [], "origin": "", "batches": 1}'
    np.savez(pickled, meta=np.frombuffer(meta, dtype=np.uint8), f0_0=np.array([{"a": 1}], dtype=object))
    with pytest.raises(BadReference, match="allow_pickle"):
        Reference.load(pickled)
    assert zipfile.is_zipfile(pickled)
