"""The S3 server of the tests (``tests/s3.py``, moto on 127.0.0.1) serves both filesystem layers the job can
use: fsspec (s3fs) and Beam's ``FileSystems`` (apache-beam[aws], boto3). Each reads, writes, lists, renames
and deletes there, and each sees what the other wrote."""

from __future__ import annotations

import pytest

from tests.s3 import s3_server  # noqa: F401  (fixture)


def test_fsspec_read_write_list_rename_delete(s3_server):  # noqa: F811
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)  # no endpoint given: AWS_ENDPOINT_URL is enough
    root = f"{s3_server.bucket}/run"
    with fs.open(f"{root}/pdfs/a.pdf", "wb") as f:
        f.write(b"%PDF-1.7 a")
    fs.pipe(f"{root}/pdfs/sub/b.pdf", b"%PDF-1.7 b")
    fs.pipe(f"{root}/pdfs-other/c.pdf", b"%PDF-1.7 c")
    assert fs.cat(f"{root}/pdfs/a.pdf") == b"%PDF-1.7 a"
    # a prefix is not a directory: "pdfs" and "pdfs-other" are both below "run/pdfs*", only one below "run/pdfs/"
    assert fs.find(f"{root}/pdfs/") == [f"{root}/pdfs/a.pdf", f"{root}/pdfs/sub/b.pdf"]
    # fsspec's "**" must be a whole path component (Beam's "pdfs/**.pdf" is a ValueError here), and "**/" may
    # match no directory at all
    assert fs.glob(f"{root}/pdfs/**/*.pdf") == [f"{root}/pdfs/a.pdf", f"{root}/pdfs/sub/b.pdf"]
    with pytest.raises(ValueError):
        fs.glob(f"{root}/pdfs/**.pdf")
    assert fs.ls(f"{root}/pdfs/", detail=False) == [f"{root}/pdfs/a.pdf", f"{root}/pdfs/sub"]  # "sub" is implied
    fs.mv(f"{root}/pdfs/a.pdf", f"{root}/done/a.pdf")  # copy + delete on S3: no atomic rename
    assert not fs.exists(f"{root}/pdfs/a.pdf") and fs.cat(f"{root}/done/a.pdf") == b"%PDF-1.7 a"
    fs.rm(f"{root}/pdfs", recursive=True)
    fs.invalidate_cache()
    assert fs.find(f"{root}/") == [f"{root}/done/a.pdf", f"{root}/pdfs-other/c.pdf"]


def test_beam_filesystems_read_write_list_rename_delete(s3_server):  # noqa: F811
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(s3_server.beam_args()))
    try:
        root = s3_server.url("beam")
        with FileSystems.create(f"{root}/pdfs/a.pdf") as f:
            f.write(b"%PDF-1.7 a")
        with FileSystems.create(f"{root}/pdfs/sub/b.pdf") as f:
            f.write(b"%PDF-1.7 b")
        with FileSystems.create(f"{root}/pdfs-other/c.pdf") as f:
            f.write(b"%PDF-1.7 c")
        with FileSystems.open(f"{root}/pdfs/a.pdf") as f:
            assert f.read() == b"%PDF-1.7 a"
        # "**" crosses "/", "*" does not; a bare prefix matches every key that starts with it
        found = sorted(m.path for m in FileSystems.match([f"{root}/pdfs/**"])[0].metadata_list)
        assert found == [f"{root}/pdfs/a.pdf", f"{root}/pdfs/sub/b.pdf"]
        found = sorted(m.path for m in FileSystems.match([f"{root}/pdfs/*"])[0].metadata_list)
        assert found == [f"{root}/pdfs/a.pdf"]
        assert FileSystems.exists(f"{root}/pdfs/a.pdf")
        FileSystems.rename([f"{root}/pdfs/a.pdf"], [f"{root}/done/a.pdf"])  # copy + delete
        assert not FileSystems.exists(f"{root}/pdfs/a.pdf") and FileSystems.exists(f"{root}/done/a.pdf")
        FileSystems.delete([f"{root}/pdfs/sub/b.pdf"])
        left = sorted(m.path for m in FileSystems.match([f"{root}/**"])[0].metadata_list)
        assert left == [f"{root}/done/a.pdf", f"{root}/pdfs-other/c.pdf"]
    finally:
        FileSystems.set_options(PipelineOptions([]))


def test_beam_finds_the_server_through_aws_endpoint_url_alone(s3_server):  # noqa: F811
    """Without --s3_endpoint_url Beam's boto3 client still reads AWS_ENDPOINT_URL (botocore >= 1.31)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions([]))
    path = s3_server.url("env/x.bin")
    with FileSystems.create(path) as f:
        f.write(b"via env")
    with FileSystems.open(path) as f:
        assert f.read() == b"via env"


def test_fsspec_and_beam_see_each_others_objects(s3_server):  # noqa: F811
    import fsspec
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.pipe(f"{s3_server.bucket}/mix/from-fsspec", b"1")
    FileSystems.set_options(PipelineOptions(s3_server.beam_args()))
    try:
        with FileSystems.open(s3_server.url("mix/from-fsspec")) as f:
            assert f.read() == b"1"
        with FileSystems.create(s3_server.url("mix/from-beam")) as f:
            f.write(b"2")
    finally:
        FileSystems.set_options(PipelineOptions([]))
    fs.invalidate_cache()
    assert fs.cat(f"{s3_server.bucket}/mix/from-beam") == b"2"


def test_a_missing_object_is_an_error_in_both(s3_server):  # noqa: F811
    import fsspec
    from apache_beam.io.filesystems import FileSystems

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{s3_server.bucket}/nope")
    with pytest.raises(Exception):  # noqa: B017  (Beam raises BeamIOError / its S3 client's error)
        with FileSystems.open(s3_server.url("nope")) as f:
            f.read()
