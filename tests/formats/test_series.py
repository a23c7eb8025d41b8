"""Series files → records: CSV/parquet long tables, Monash .tsf, timestamps, ragged channels, quarantine reasons.

.venv/bin/python -m pytest tests/formats/test_series.py -q
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq

from formats.series import SeriesRecord, read_series, read_series_file, write_series

TSF = """# comment
@relation test
@attribute series_name string
@attribute start_timestamp date
@frequency yearly
@horizon 4
@missing true
@equallength false
@data
T1:1979-01-01 00-00-00:25092.2284,24271.5134,25828.9883
T2:1979-01-01 00-00-00:887896.51,?,971549.04
"""


def test_tsf(tmp_path):
    p = tmp_path / "a.tsf"
    p.write_text(TSF)
    recs, dropped = read_series_file(p)
    assert not dropped and [r.series_id for r in recs] == ["T1", "T2"]
    assert recs[0].values == ((25092.2284, 24271.5134, 25828.9883),) and recs[0].freq == "yearly"
    assert math.isnan(recs[1].values[0][1]) and recs[1].meta["horizon"] == 4 and recs[0].season == 1


def test_csv_timestamps_sort_and_channels(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text(
        "series_id,timestamp,channel,value\n"
        "a,2024-01-01T00:00:02,x,3\na,2024-01-01T00:00:00,x,1\na,2024-01-01T00:00:01,x,2\n"
        "a,2024-01-01T00:00:00,y,10\na,2024-01-01T00:00:01,y,20\n"
        "b,2024-01-01T00:00:00,x,5\n"
    )
    recs, dropped = read_series_file(p)
    assert not dropped
    a = next(r for r in recs if r.meta["name"] == "a")
    assert a.channels == ("x", "y") and a.values[0] == (1.0, 2.0, 3.0)
    assert a.values[1][:2] == (10.0, 20.0) and math.isnan(a.values[1][2])  # ragged channel padded with NaN
    assert a.sampling_period_s == 1.0
    mu, sigma = a.stats()
    assert mu[0] == 2.0 and abs(sigma[0] - math.sqrt(2 / 3)) < 1e-12


def test_unparseable_timestamps_fall_back_to_row_order(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("series_id,timestamp,value\na,soon,1\na,later,2\na,never,3\n")
    recs, dropped = read_series_file(p)
    assert not dropped and recs[0].values == ((1.0, 2.0, 3.0),) and "warning" in recs[0].meta
    # a parser given by the caller (the CLI passes pandas) is used before giving up
    recs, _ = read_series_file(p, parse_timestamps=lambda s: [3.0, 1.0, 2.0])
    assert recs[0].values == ((2.0, 3.0, 1.0),)


def test_parquet_integer_index(tmp_path):
    p = tmp_path / "s.parquet"
    pq.write_table(pa.table({"series_id": ["s"] * 3, "timestamp": [2, 0, 1], "value": [0.3, 0.1, 0.2]}), p)
    recs, dropped = read_series_file(p)
    assert not dropped and recs[0].values == ((0.1, 0.2, 0.3),) and recs[0].sampling_period_s is None


def test_bad_files_are_quarantined_with_reasons(tmp_path):
    cases = {
        "novalue.csv": "series_id,x\na,1\n",
        "text.csv": "series_id,value\na,hello\n",
        "header.tsf": "garbage\n",
        "nodata.tsf": "@relation x\n@attribute series_name string\n",
        "broken.parquet": "not parquet",
    }
    reasons = {}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        recs, dropped = read_series_file(tmp_path / name)
        assert not recs and len(dropped) == 1 and dropped[0].stage == "series"
        reasons[name] = dropped[0].reason
    assert reasons == {
        "novalue.csv": "no_value_column",
        "text.csv": "non_numeric_values",
        "header.tsf": "bad_tsf_header",
        "nodata.tsf": "bad_tsf_header",
        "broken.parquet": "unparseable",
    }
    _, dropped = read_series_file(tmp_path / "missing.csv")
    assert dropped[0].reason == "unreadable"


def test_records_round_trip(tmp_path):
    recs = [
        SeriesRecord("a", ((1.0, float("nan"), 3.0), (4.0, 5.0, 6.0)), ("x", "y"), "f.csv", "daily", 86400.0, "ctx"),
        SeriesRecord("b", ((7.0,),), ("value",), "g.tsf", meta={"k": 1}),
    ]
    write_series(tmp_path / "s.parquet", recs)
    back = read_series(tmp_path / "s.parquet")
    assert back[1] == recs[1] and back[0].channels == ("x", "y") and back[0].context == "ctx"
    assert math.isnan(back[0].values[0][1]) and back[0].values[1] == (4.0, 5.0, 6.0)
    row = pq.read_table(tmp_path / "s.parquet").to_pylist()[0]
    assert row["mu"] == [2.0, 5.0]
