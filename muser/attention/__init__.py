"""muser.attention: the attention specification.

Owns: `reference.py` -- masked grouped-query attention in float32 over explicit
key positions, and the window rule (`visibility_mask`).  Every faster path (the
CPU backend's routes, CUDA's flash and Triton kernels, all under
muser/backends) is tested against it.  Does not own: choosing a path for a
device (muser.backends.select) or kernels.
"""
from .reference import attention, visibility_mask

__all__ = ["attention", "visibility_mask"]
