from .dflash import DFlashDraftModel
from .tokenizer import ByteTokenizer
from .utils import extract_context_feature, load_and_process_dataset, sample, select_samples

__all__ = [
    "ByteTokenizer",
    "DFlashDraftModel",
    "extract_context_feature",
    "load_and_process_dataset",
    "sample",
    "select_samples",
]
