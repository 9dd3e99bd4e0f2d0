"""needle.utils: gradient checkpointing (PyTorch's ``torch.utils.checkpoint`` names)."""

from .checkpointing import (  # noqa: F401
    DETERMINISM_CHECKS,
    CheckpointWrapper,
    checkpoint,
    checkpoint_sequential,
    checkpoint_wrapper,
)
