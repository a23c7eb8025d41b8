"""Page and crop builders for the visual-gain tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import io

from formats.records import Block, Crop, Page


def png_bytes(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), stripe: bool = False) -> bytes:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, color)
    if stripe:
        ImageDraw.Draw(im).rectangle([0, size[1] // 3, size[0], 2 * size[1] // 3], fill=(255, 255, 255))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def make_page(parts: list[str | bytes], page_index: int = 0, doc_id: str = "doc", meta: dict | None = None) -> Page:
    """A page from an ordered list of text strings and PNG crops (figures)."""
    blocks = []
    for i, part in enumerate(parts):
        bbox = (10.0, 10.0 + 20 * i, 500.0, 28.0 + 20 * i)
        if isinstance(part, bytes):
            crop = Crop.from_png(part, 64, 48, 144)
            blocks.append(Block("figure", bbox, "", reading_order=i, crop=crop))
        else:
            blocks.append(Block("text", bbox, part, reading_order=i))
    return Page(doc_id, page_index, 612.0, 792.0, tuple(blocks), parser="test", meta=meta or {})


def scored_page(delta_h: float, page_index: int, domain: str, n_images: int = 1, text: str = "Body text.") -> Page:
    """A page carrying hand-set visual-gain scores (review logic needs no model)."""
    from dataclasses import replace

    parts: list[str | bytes] = [text] + [png_bytes((page_index % 255, 60, 90))] * n_images
    page = make_page(parts, page_index=page_index, doc_id=f"doc-{domain}")
    render = Crop.from_png(png_bytes((240, 240, 240), size=(61, 79)), 61, 79, 10)
    vg = {
        "ppl_text": 10.0,
        "ppl_inter": 10.0 / (2.718281828**delta_h),
        "delta_h_nats": delta_h,
        "delta_h_bits": delta_h / 0.6931,
        "page_bits": 0.0,
        "n_text_tokens": 50,
        "n_images": n_images,
        "model": "test",
        "domain": domain,
    }
    return replace(page, scores={"visual_gain": vg}, render=render, source=f"/data/{domain}.pdf")
