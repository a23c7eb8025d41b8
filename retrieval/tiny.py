"""Tiny random models for offline smoke runs and tests: a CLIP-style embedder, a captioner, a cross-encoder,
described here and written by the project's one tiny-model writer (``scifolio models tiny DIR``;
``pipelines.tiny.write_area(DIR, "retrieval")``).

Random weights (outputs are meaningless but shapes, dtypes, save/load paths and every code path are real);
tokenizers are trained locally on a few sentences, so nothing touches a hub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_CORPUS = [
    "a plot of a sine wave",
    "a table of experimental results",
    "an equation with integrals and sums",
    "a phase diagram of a binary alloy",
    "a stress strain curve of steel",
    "a microscope image of cells",
    "a red circle and a blue square",
    "the figure shows the crystal structure",
]


def _wordpiece(vocab_size: int = 300):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(_CORPUS * 4, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tok


def _bert_tokenizer():
    from transformers import BertTokenizerFast

    return BertTokenizerFast(
        tokenizer_object=_wordpiece(),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )


def clip(projection_dim: int = 16, image_size: int = 32) -> list[Any]:
    """CLIPModel + processor loadable by sentence-transformers (``SentenceTransformer(out_dir)``)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor, PreTrainedTokenizerFast
    from transformers.models.clip import CLIPImageProcessorPil  # the PIL backend: no torchvision needed

    # bos=0, eos=1, pad=2: CLIP pools the text at the first eos, so pad must differ from eos (and eos must
    # not be id 2, which selects CLIP's legacy argmax pooling).
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<|startoftext|>", "<|endoftext|>", "<pad>", "<unk>"]
    tok.train_from_iterator(_CORPUS * 4, trainers.WordLevelTrainer(special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", 0), ("<|endoftext|>", 1)]
    )
    ftok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=77,
    )
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    cfg = CLIPConfig(
        text_config=dict(
            small,
            vocab_size=tok.get_vocab_size(),
            max_position_embeddings=77,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        ),
        vision_config=dict(small, image_size=image_size, patch_size=8),
        projection_dim=projection_dim,
    )
    proc = CLIPProcessor(
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        ),
        tokenizer=ftok,
    )
    return [CLIPModel(cfg), proc]


def captioner(image_size: int = 32) -> list[Any]:
    """VisionEncoderDecoder (ViT encoder + BERT decoder with cross-attention), image processor, tokenizer."""
    from transformers import BertConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig
    from transformers.models.vit import ViTImageProcessorPil

    tokenizer = _bert_tokenizer()
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    enc = ViTConfig(**small, image_size=image_size, patch_size=8)
    dec = BertConfig(
        **small, vocab_size=len(tokenizer), max_position_embeddings=64, is_decoder=True, add_cross_attention=True
    )
    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id = cls, sep, pad
    model = VisionEncoderDecoderModel(cfg)
    model.generation_config.decoder_start_token_id = cls
    model.generation_config.eos_token_id = sep
    model.generation_config.pad_token_id = pad
    return [model, tokenizer, ViTImageProcessorPil(size={"height": image_size, "width": image_size})]


def cross_encoder() -> list[Any]:
    """BertForSequenceClassification(num_labels=1) + tokenizer, loadable by ``sentence_transformers.CrossEncoder``."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = _bert_tokenizer()
    cfg = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    return [BertForSequenceClassification(cfg), tokenizer]


def tiny_models(kit: Any) -> dict[str, tuple[str, Callable[[], list[Any]]]]:
    """name → (subdir under DIR/retrieval, builder). ``kit`` is unused: these tokenizers are their own."""
    return {
        "retrieval-clip": ("retrieval/clip", clip),
        "retrieval-captioner": ("retrieval/captioner", captioner),
        "retrieval-reranker": ("retrieval/reranker", cross_encoder),
    }
