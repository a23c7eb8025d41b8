"""The chat template every exported model carries (``scifolio pretrain export``) and SFT falls back to.

    from formats.chat import CHAT_TEMPLATE
    tok.chat_template = tok.chat_template or CHAT_TEMPLATE

ChatML-shaped, plain text (no new special tokens, so a pre-trained vocabulary needs no resizing), with the roles
SFT accepts (system, user, assistant, tool) and OpenAI-shaped tool calls written as one JSON object per call.
Rendering ``messages[:i]`` is a prefix of rendering ``messages[:i+1]``, which is what lets SFT label each
message's tokens by rendering the conversation one message at a time.
"""

from __future__ import annotations

ROLES = ("system", "user", "assistant", "tool")
TURN_END = "<|im_end|>"
"""Ends every message; text, not a special token, so an evaluator stops a chat response on this string."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message.get('content') %}{{ message['content'] }}{% endif %}"
    "{% for call in message.get('tool_calls') or [] %}\n<tool_call>"
    '{"name": {{ call["function"]["name"] | tojson }}, "arguments": {{ call["function"]["arguments"] | tojson }}}'
    "</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


IMAGE_TOKEN = "<image>"
"""The image placeholder of an exported vision-language model (``pretrain.export``): its processor expands each
to the image's patch tokens."""

VLM_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% if message.get('content') %}{{ message['content'] }}{% endif %}",
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message.get('content') %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url') %}" + IMAGE_TOKEN + "{% endif %}"
    "{% endfor %}{% endif %}",
)
"""``CHAT_TEMPLATE`` whose message content may also be a list of parts: ``{"type": "text", "text": ...}`` and
``{"type": "image"}`` (or OpenAI's ``image_url``), an image rendered as ``IMAGE_TOKEN``; plain strings render as
before."""
