"""Triton fused kernels (attention, residual-add LayerNorm) with PyTorch references."""
