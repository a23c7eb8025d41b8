"""``formats.chat_images``: image parts (data URL, relative/absolute path, file://) → images, every failure a reason."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from formats.chat_images import BadImage, ImageLimits, data_url, has_images, load_image, resolve


def _png(w: int = 12, h: int = 8) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


def _part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_data_url_relative_and_file_paths_load_the_same_pixels(tmp_path: Path) -> None:
    (tmp_path / "f.png").write_bytes(_png())
    got = [
        load_image(_part(data_url(_png()))),
        load_image(_part("f.png"), base_dir=str(tmp_path)),
        load_image(_part(f"file://{tmp_path / 'f.png'}")),
        load_image({"type": "image", "image": str(tmp_path / "f.png")}),
    ]
    assert {(im.size, im.mode, im.getpixel((3, 3))) for im in got} == {((12, 8), "RGB", (200, 10, 10))}


@pytest.mark.parametrize(
    ("url", "limits", "reason"),
    [
        ("missing.png", ImageLimits(), "missing_file"),
        ("data:image/png;base64,aGVsbG8=", ImageLimits(), "unreadable"),  # "hello": base64, not an image
        ("data:image/png;base64,%%%", ImageLimits(), "unreadable"),
        ("https://example.org/a.png", ImageLimits(), "unsupported_url"),
        ("data:image/png,raw", ImageLimits(), "unsupported_url"),
        (None, ImageLimits(max_bytes=50), "too_large"),  # the PNG is ~70 bytes
        (None, ImageLimits(max_pixels=95), "too_large"),  # 12 × 8 = 96 pixels
    ],
)
def test_a_bad_image_raises_its_reason(tmp_path: Path, url, limits, reason) -> None:
    (tmp_path / "truncated.png").write_bytes(_png()[:40])
    with pytest.raises(BadImage) as e:
        load_image(_part(url or data_url(_png())), base_dir=str(tmp_path), limits=limits)
    assert e.value.reason == reason
    with pytest.raises(BadImage) as e:
        load_image(_part("truncated.png"), base_dir=str(tmp_path))
    assert e.value.reason == "unreadable"


def test_resolve_turns_image_parts_into_placeholders_in_order() -> None:
    a, b = _png(4, 4), _png(6, 2)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [_part(data_url(a)), {"type": "text", "text": "and"}, _part(data_url(b))]},
    ]
    assert has_images({"messages": messages}) and not has_images({"messages": messages[:1]})
    assert not has_images({"prompt": "x"})
    msgs, images = resolve(messages)
    assert msgs[0] == messages[0]
    assert msgs[1]["content"] == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]
    assert [im.size for im in images] == [(4, 4), (6, 2)]
    assert messages[1]["content"][0]["type"] == "image_url"  # the row itself is left as it was
