"""Parsing stage: PDF bytes -> validated ``Document`` -> ``Page`` records with blocks and crops.

    python -m parsing.visualize paper.pdf --out /tmp/boxes      # draw the boxes of each page to PNG

Heavy libraries (MinerU, PyMuPDF, ONNX models) load only inside the parse worker, never at import time.
"""

from formats.records import Block, Crop, Document, Dropped, Page
from parsing.api import PARSER_VERSION, Parser, available_backends, iter_parse, warm_up
from parsing.backends import BackendUnavailable, LayoutBackend
from parsing.config import Limits, ParseConfig

__all__ = [
    "PARSER_VERSION",
    "BackendUnavailable",
    "Block",
    "Crop",
    "Document",
    "Dropped",
    "LayoutBackend",
    "Limits",
    "Page",
    "ParseConfig",
    "Parser",
    "available_backends",
    "iter_parse",
    "warm_up",
]
