"""Small pieces of the corpus DoFn that the end-to-end job tests do not isolate."""

from __future__ import annotations

import pytest


def test_parsed_records_are_replayed_with_the_parse_error_where_it_happened():
    from pipelines.jobs.corpus import _Parsed

    def records():
        yield "doc"
        yield "page 0"
        raise ValueError("worker gone")

    parsed = _Parsed(records())  # consumed here, before the builder exists
    seen = []
    with pytest.raises(ValueError, match="worker gone"):
        for r in parsed:
            seen.append(r)
    assert seen == ["doc", "page 0"]
    assert list(_Parsed(iter(["a", "b"]))) == ["a", "b"]


def test_background_load_returns_the_result_or_raises_the_error():
    from pipelines.jobs.corpus import _in_background

    assert _in_background(lambda a, b: a + b, 2, 3).result(timeout=10) == 5

    def fail() -> None:
        raise OSError("no tokenizer here")

    with pytest.raises(OSError, match="no tokenizer here"):
        _in_background(fail).result(timeout=10)


def test_local_default_gives_each_parse_worker_its_lanes_of_cores():
    from parsing import ParseConfig
    from pipelines.assembly.build import BuildConfig
    from pipelines.jobs.corpus import local_beam_args

    def args(cores: int, lanes: int = 1) -> list[str]:
        return local_beam_args(BuildConfig(tokenizer="t", parse=ParseConfig(backend_lanes=lanes)), cores)

    assert args(2) == ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
    assert args(1) == args(2)
    assert args(8) == ["--direct_running_mode=multi_processing", "--direct_num_workers=4"]
    assert args(8, lanes=0)[-1] == "--direct_num_workers=8"
    assert args(64)[-1] == "--direct_num_workers=8"  # capped


def test_build_rejects_a_bad_parse_flag_without_a_traceback(capsys):
    from pipelines.cli import main

    with pytest.raises(SystemExit) as e:
        main(["build", "in.pdf", "--out", "out", "--tokenizer", "tok", "--backend-lanes", "-1"])
    assert e.value.code == 2
    assert "backend_lanes must be >= 0" in capsys.readouterr().err
