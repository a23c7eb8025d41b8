"""Image messages through the gateway (issue 37 item 2) on a tiny random LLaVA built from a config, served by
``load_model_gateway`` and called with the official ``openai`` and ``anthropic`` SDKs.

Images reach the engine's prefill (first-token logprobs equal the model's own with the pixel values); the trace store
keys them by content hash (two images behind identical placeholder ids never share a context node, a swapped history
image forks instead of reusing stored ids) and keeps references, not pixels; the three protocols' image parts give the
same prompt; bad images and a text-only model answer HTTP 400 with the reason.
"""

from __future__ import annotations

import asyncio
import base64
import io
import sqlite3

import openai
import pytest
import torch

from posttrain.agentic.gateway import Gateway, GatewayConfig, load_model_gateway
from posttrain.agentic.images import MARKER
from posttrain.rollout.sampling import without_placeholder
from tests.posttrain.agentic.test_gateway_sdk import clients


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    """A servable tiny vision-language model: random LLaVA (CLIP tower, Llama LM) + processor, as
    ``pretrain export --vlm`` lays one out (square resize, no centre crop, ``<image>`` → 4 patch ids)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from formats.chat import IMAGE_TOKEN, VLM_CHAT_TEMPLATE
    from posttrain.tiny.agentic import build_tokenizer

    out = tmp_path_factory.mktemp("tiny-vlm")
    build_tokenizer().save_pretrained(out)  # then a fresh copy to extend (build_tokenizer is cached)
    tok = type(build_tokenizer()).from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = VLM_CHAT_TEMPLATE
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=4, projector_hidden_act="gelu", vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )  # fmt: skip
    LlavaForConditionalGeneration(config).save_pretrained(out)
    images = CLIPImageProcessor(size={"height": 28, "width": 28}, do_center_crop=False, resample=2)
    LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
        chat_template=VLM_CHAT_TEMPLATE, image_token=IMAGE_TOKEN, num_additional_image_tokens=1,
    ).save_pretrained(out)  # fmt: skip
    tok.save_pretrained(out)
    return out


def png(color: tuple[int, int, int], size=(30, 20)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


RED, BLUE = png((220, 30, 30)), png((20, 40, 230))


def user(text: str, image: bytes) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url(image)}}, {"type": "text", "text": text}]}  # fmt: skip


def test_images_reach_the_engine_keyed_by_content_hash(vlm_dir, tmp_path):
    trace = tmp_path / "traces.sqlite"
    gw = load_model_gateway(str(vlm_dir), GatewayConfig(default_max_tokens=4, trace_path=str(trace)))
    assert gw.images is not None
    model = gw.driver.engine.model
    oa, an = clients(gw, "s-red")
    oa_blue, _ = clients(gw, "s-blue")

    async def go():
        red = await oa.chat.completions.create(model="m", messages=[user("What colour?", RED)])
        blue = await oa_blue.chat.completions.create(model="m", messages=[user("What colour?", BLUE)])
        # the red session goes on: its history (with the red image) re-sent, a blue image added
        history = [user("What colour?", RED), {"role": "assistant", "content": red.choices[0].message.content}]
        await oa.chat.completions.create(model="m", messages=[*history, user("And now?", BLUE)])
        return red, blue

    asyncio.run(go())
    store = gw.store
    (c_red, c_red2), (c_blue,) = store.session_calls["s-red"], store.session_calls["s-blue"]
    ids_red, ids_blue = store.call_input_ids(c_red), store.call_input_ids(c_blue)
    assert ids_red == ids_blue  # the same placeholder ids for both images ...
    assert store.calls[c_red]["context_node"] != store.calls[c_blue]["context_node"]  # ... yet two context nodes
    assert store.calls[c_red]["meta"]["images"] == [
        MARKER.findall(store.nodes[store.calls[c_red]["context_node"]].text)[0]
    ]
    h_red, h_blue = store.calls[c_red]["meta"]["images"][0], store.calls[c_blue]["meta"]["images"][0]
    assert h_red != h_blue
    assert store.calls[c_red2]["meta"]["images"] == [h_red, h_blue]

    # each first-token logprob is the model's own given that call's images (placeholder masked as the engine
    # samples): the pixels reached the prefill
    for cid in (c_red, c_blue, c_red2):
        traj = gw.driver.finished[store.calls[cid]["meta"]["request_id"]]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([traj.prompt_ids]), pixel_values=traj.request.pixel_values).logits
        ref = torch.log_softmax(without_placeholder(logits[0, -1].float(), model.config), -1)[traj.token_ids[0]].item()
        assert abs(traj.logprobs[0] - ref) <= 1e-5
    first = [gw.driver.finished[store.calls[c]["meta"]["request_id"]] for c in (c_red, c_blue)]
    assert first[0].request.pixel_values.shape[0] == 1 and not torch.equal(*(t.request.pixel_values for t in first))
    assert [len(t.request.images) for t in first] == [1, 1]  # the decoded images too (vLLM runs its own processor)

    # the follow-up reused the stored path (no fork) and its prompt holds 2 images' placeholders
    assert not store.forks
    ex = store.session_export("s-red")
    assert ex["images"] == [h_red, h_blue]
    image_id = gw.images.token_id
    assert ex["token_ids"].count(image_id) == 2 * ids_red.count(image_id) == 8

    # references, not pixels: the SQLite file holds the hashes and no image payload
    raw = trace.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("traces.sqlite-*"))
    assert h_red.encode() in raw and base64.b64encode(RED)[:40] not in raw
    with sqlite3.connect(trace) as db:
        assert all("base64" not in t for (t,) in db.execute("SELECT text FROM nodes"))

    # the same red session with a swapped history image forks rather than reusing the red image's stored ids
    async def swapped():
        msgs = [user("What colour?", BLUE), {"role": "assistant", "content": "x"}, user("And now?", RED)]
        await oa.chat.completions.create(model="m", messages=msgs)

    asyncio.run(swapped())
    (fork,) = store.forks
    assert fork["session"] == "s-red" and h_red[:20] in fork["stored"] + fork["rendered"]


def test_three_protocols_give_one_prompt_and_bad_images_are_400(vlm_dir, tmp_path):
    gw = load_model_gateway(str(vlm_dir), GatewayConfig(default_max_tokens=2, image_root=str(tmp_path)))
    (tmp_path / "red.png").write_bytes(RED)
    b64 = base64.b64encode(RED).decode()

    async def go():
        oa, _ = clients(gw, "chat")
        await oa.chat.completions.create(model="m", messages=[user("Name it.", RED)], max_tokens=2)
        oa, _ = clients(gw, "responses")
        item = {"role": "user", "content": [{"type": "input_image", "image_url": "red.png"}, {"type": "input_text", "text": "Name it."}]}  # fmt: skip
        await oa.responses.create(model="m", input=[item], max_output_tokens=2)
        _, an = clients(gw, "messages")
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
        msg = {"role": "user", "content": [block, {"type": "text", "text": "Name it."}]}
        await an.messages.create(model="m", max_tokens=2, messages=[msg])
        counted = await an.messages.count_tokens(model="m", messages=[msg])

        oa, an = clients(gw, "bad")
        errors = []
        for part_url in ("data:image/png;base64,AAAA", "nowhere.png", "../outside.png", "https://example.com/a.png"):
            bad = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": part_url}}]}
            with pytest.raises(openai.BadRequestError) as e:
                await oa.chat.completions.create(model="m", messages=[bad])
            errors.append(e.value.body["code"])
        with pytest.raises(openai.BadRequestError) as e:  # text spelling the placeholder is not an image
            await oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "see <image> here"}])
        errors.append(e.value.body["code"])
        return counted, errors

    counted, errors = asyncio.run(go())
    store = gw.store
    prompts = [store.call_input_ids(store.session_calls[s][0]) for s in ("chat", "responses", "messages")]
    assert prompts[0] == prompts[1] == prompts[2] and counted.input_tokens == len(prompts[0])
    assert errors == ["image_unreadable", "image_missing_file", "image_unsupported_url", "image_unsupported_url", "invalid_request"]  # fmt: skip
    assert "bad" not in store.session_calls


def test_a_text_only_model_refuses_image_parts(tmp_path):
    from posttrain.rollout.engines.scripted import ScriptedTokenEngine
    from posttrain.tiny.agentic import build_tokenizer

    tok = build_tokenizer()
    gw = Gateway(ScriptedTokenEngine(lambda req: [tok.eos_token_id]), tok, GatewayConfig())
    oa, _ = clients(gw, "t")

    async def go():
        with pytest.raises(openai.BadRequestError) as e:
            await oa.chat.completions.create(model="m", messages=[user("What colour?", RED)])
        return e.value

    err = asyncio.run(go())
    assert err.body["code"] == "images_not_supported" and "vision-language" in err.body["message"]
