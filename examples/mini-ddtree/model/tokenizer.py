"""A byte-level tokenizer with a ChatML-like template, so nothing has to be downloaded."""

import json
import re
from pathlib import Path

import torch

TOKENIZER_FILE = "mini_tokenizer.json"
SPECIAL_TOKENS = {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258, "<|mask|>": 259}
VOCAB_SIZE = 264  # 256 bytes, 4 specials, 4 spare ids


class ByteTokenizer:
    """encode/decode/apply_chat_template: the slice of a Hugging Face tokenizer that benchmark.py uses."""

    def __init__(self, special_tokens: dict[str, int] | None = None, eos_token: str = "<|im_end|>"):
        self.special_tokens = dict(special_tokens or SPECIAL_TOKENS)
        self.id_to_special = {token_id: text for text, token_id in self.special_tokens.items()}
        self.eos_token_id = self.special_tokens[eos_token]
        self.pad_token_id = self.special_tokens["<|endoftext|>"]
        self.mask_token_id = self.special_tokens["<|mask|>"]
        self._special_re = re.compile("(" + "|".join(re.escape(text) for text in self.special_tokens) + ")")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ByteTokenizer":
        data = json.loads((Path(path) / TOKENIZER_FILE).read_text(encoding="utf-8"))
        return cls(special_tokens=data["special_tokens"], eos_token=data["eos_token"])

    def save_pretrained(self, path: str | Path) -> None:
        eos_token = self.id_to_special[self.eos_token_id]
        payload = {"type": "byte", "special_tokens": self.special_tokens, "eos_token": eos_token}
        (Path(path) / TOKENIZER_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")

    def encode(self, text: str, return_tensors: str | None = None):
        ids: list[int] = []
        for piece in self._special_re.split(text):
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        if return_tensors == "pt":
            return torch.tensor([ids], dtype=torch.long)
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        out, pending = [], bytearray()
        for token_id in ids:
            if token_id < 256:
                pending.append(token_id)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special_tokens:
                out.append(self.id_to_special.get(token_id, ""))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self,
        messages: list[dict],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        enable_thinking: bool = False,
    ):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text
