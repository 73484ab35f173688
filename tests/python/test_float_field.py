"""decode={"y": "float"}: a field holding a number as ASCII text (a regression target) becomes a
float64 column; a field that is not a number is a corrupt sample (on_corrupt)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import zerowait


def write(path, values):
    rows = [{"__key__": f"k{i}", "y": v, "cls": str(i)} for i, v in enumerate(values)]
    zerowait.write_dataset(rows, path, shard_size=4 << 10)
    return path


def test_numbers_written_as_text_come_back_as_float64(tmp_path):
    values = ["0.5", " -3.25e-2\n", "7", "1e300", "-0", "nan", "inf", 0.1]  # 0.1: a float
    path = write(tmp_path / "ds", values)
    with zerowait.Loader(path, 8, shuffle="none", decode={"y": "float", "cls": "int"},
                         output="numpy") as loader:
        batch = loader.next()
    assert batch["y"].dtype == np.float64 and batch["y"].shape == (8,)
    assert batch["cls"].tolist() == list(range(8))
    for got, text in zip(batch["y"].tolist(), values):
        want = float(text)
        assert got == want or (math.isnan(got) and math.isnan(want))


def test_a_field_that_is_not_a_number_is_a_corrupt_sample(tmp_path):
    path = write(tmp_path / "ds", ["1.5", "2.5", "abc", "4.5"])
    with zerowait.Loader(path, 4, shuffle="none", decode={"y": "float"}) as loader:
        with pytest.raises(zerowait.CorruptDataError, match="k2.*'y' is not a decimal number"):
            loader.next()
        assert loader.next()["y"].tolist() == [1.5, 2.5, 4.5]
    with zerowait.Loader(path, 4, shuffle="none", decode={"y": "float"},
                         on_corrupt="skip") as loader:
        assert loader.next()["y"].tolist() == [1.5, 2.5, 4.5]
        assert loader.stats()["skipped"] == 1
