"""PyTorch bridge to the Pallas kernels."""

from ..errors import NotBuiltError

raise NotBuiltError("kernels impl 'pallas': the Pallas kernels are not built yet; use --kernels torch")
