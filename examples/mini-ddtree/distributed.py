"""torchrun helpers: rank/size from the environment; NCCL on GPU hosts, Gloo on CPU-only ones."""

import os
import warnings
from datetime import timedelta
from typing import Any

import torch
from torch import distributed as dist


def init() -> None:
    if "RANK" not in os.environ:
        warnings.warn("RANK is not set (not launched by torchrun): running as a single process.")
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(minutes=300))


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def gather(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's object on rank dst (None elsewhere); [obj] when not distributed."""
    if not is_initialized():
        return [obj]
    if rank() == dst:
        gathered: list[Any] = [None] * size()
        dist.gather_object(obj, gathered, dst=dst)
        return gathered
    dist.gather_object(obj, dst=dst)
    return None


def destroy() -> None:
    if is_initialized():
        dist.destroy_process_group()
